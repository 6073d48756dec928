"""Weights files as Keras ships them, made offline for the tests that load them
(tests/models/test_pretrained.py, tests/e2e/test_walkthrough.py)."""

import h5py
import keras


def efficientnet_b0_h5(path, include_top=False):
    """A keras.applications EfficientNetB0 weights file as Keras ships it (legacy HDF5) at
    ``path``; returns the model it was written from."""
    from keras.src.legacy.saving import legacy_h5_format  # noqa: PLC0415

    keras.utils.set_random_seed(7)  # other weights than the model's own initialization
    source = keras.applications.EfficientNetB0(
        include_top=include_top, weights=None, input_shape=(32, 32, 3), classes=10
    )
    with h5py.File(path, "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, source)
    return source
