"""airbench's network (models/airbench.py), its frozen patch-whitening first layer
(models/whitening.py) and identity initialisation (layers.dirac_init): the shapes, the
parameter counts, the whitening's statistics, and a .keras file that loads without tfgpu."""

import keras
import numpy as np
import pytest

from tfgpu import models
from tfgpu.models import layers as nets
from tfgpu.models import prepare, whitening

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    "name, trainable",
    [
        # airbench94's own network (cifar10-airbench, legacy/airbench94.py): 1.97M at 10
        # classes; airbench93 narrower, and the "_gray" ones with a 4-direction whitening.
        ("airbench94", 1_971_338),
        ("airbench93", 568_714),
        ("airbench94_gray", 1_962_122),
        ("airbench93_gray", 559_498),
        ("airbench_s_gray", 289_738),
    ],
)
def test_parameter_counts(name, trainable):
    model = models.build_model(name, num_classes=10, image_size=28)
    assert sum(int(np.prod(w.shape)) for w in model.trainable_weights) == trainable
    layer = whitening.whitening_layer(model)
    assert not layer.trainable and layer.kernel.shape[:2] == (2, 2)
    assert model.output_shape == (None, 10) and model.output.dtype == "float32"


def _correlated_images(n=64, size=12, gray=False, seed=0):
    """Images whose neighbouring pixels correlate (a smoothed noise field), in [0, 255]."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, size + 2, size + 2, 1 if gray else 3))
    x = x[:, 1:-1, 1:-1] + 0.7 * x[:, :-2, 1:-1] + 0.5 * x[:, 1:-1, :-2]
    x = 128 + 30 * x
    return np.repeat(x, 3, axis=-1) if gray else x


def _patches(x, k):
    n, h, w, c = x.shape
    parts = [x[:, i : i + h - k + 1, j : j + w - k + 1] for i in range(k) for j in range(k)]
    return np.stack(parts, axis=3).reshape(-1, k * k * c)


def _responses(x, kernel, bias):
    """The whitening convolution's outputs (valid, stride 1) at every position, [P, 2m]."""
    k = kernel.shape[0]
    return _patches(x, k) @ kernel.reshape(-1, kernel.shape[-1]) + bias


@pytest.mark.parametrize("gray, components", [(False, 12), (True, 4)])
def test_whitened_patches_are_centred_uncorrelated_and_of_unit_variance(gray, components):
    images = _correlated_images(gray=gray)
    kernel, bias = whitening.whitening_weights(images, 2, components, eps=0.0)
    out = _responses(images.astype(np.float64), kernel, bias)
    first, second = out[:, :components], out[:, components:]
    np.testing.assert_allclose(second, -first, atol=1e-3)  # each direction with both signs
    np.testing.assert_allclose(first.mean(0), 0.0, atol=1e-3)
    np.testing.assert_allclose(np.cov(first.T, bias=True), np.eye(components), atol=1e-3)


def test_patch_statistics_do_not_depend_on_the_chunks():
    images = _correlated_images(n=10)
    whole = whitening.patch_statistics(images, 2, chunk=10)
    parts = whitening.patch_statistics(images, 2, chunk=3)
    for a, b in zip(whole, parts, strict=True):  # the mean and the covariance
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


def test_gray_images_keep_the_directions_of_their_variance():
    """Three equal channels: 4 directions hold all the variance; the 12-direction layer's 8
    others only see eps."""
    images = _correlated_images(gray=True)
    mean, covariance = whitening.patch_statistics(images, 2)
    values = np.sort(np.linalg.eigvalsh(covariance))[::-1]
    assert values[3] > 1e3 * max(abs(values[4]), 1e-12)


def test_initialize_sets_the_layer_from_the_models_own_normalization():
    model = models.build_model("airbench_s_gray", num_classes=4, image_size=16)
    images = np.clip(_correlated_images(n=32, size=16, gray=True), 0, 255).astype(np.uint8)
    line = whitening.initialize(model, images)
    assert line.startswith("whitening: whiten (2x2, 4 directions and their negatives)")
    normalized = keras.ops.convert_to_numpy(model.get_layer("normalize")(images.astype("float32")))
    layer = whitening.whitening_layer(model)
    kernel, bias = (keras.ops.convert_to_numpy(w) for w in (layer.kernel, layer.bias))
    out = _responses(normalized.astype(np.float64), kernel, bias)[:, :4]
    np.testing.assert_allclose(out.mean(0), 0.0, atol=1e-4)
    # eps (5e-4) against eigenvalues of the normalized patches: within a few percent of 1
    np.testing.assert_allclose(np.diag(np.cov(out.T, bias=True)), 1.0, rtol=0.05)
    assert whitening.initialize(models.build_model("tiny_cnn", 4, 16), images) == ""


def test_a_saved_model_loads_without_tfgpu_with_its_whitening(tmp_path):
    model = models.build_model("airbench_s_gray", num_classes=4, image_size=16)
    whitening.initialize(model, _correlated_images(n=8, size=16, gray=True).astype(np.uint8))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras", compile=False, safe_mode=True)
    x = _correlated_images(n=2, size=16, gray=True).astype("float32")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert not whitening.whitening_layer(loaded).trainable


def test_dirac_init_makes_the_first_filters_identities():
    inputs = keras.Input((8, 8, 3))
    narrow = keras.layers.Conv2D(5, 3, padding="same", use_bias=False, name="narrow")(inputs)
    wide = keras.layers.Conv2D(2, 3, padding="same", use_bias=False, name="wide")(narrow)
    even = keras.layers.Conv2D(4, 2, padding="same", name="even")(wide)  # no centre: left
    model = keras.Model(inputs, even)
    before = keras.ops.convert_to_numpy(model.get_layer("even").kernel)
    untouched = keras.ops.convert_to_numpy(model.get_layer("narrow").kernel)[..., 3:]
    assert nets.dirac_init(model) == 2
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
    first = keras.Model(inputs, narrow)(x)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(first)[..., :3], x, atol=1e-6)
    kernel = keras.ops.convert_to_numpy(model.get_layer("narrow").kernel)
    np.testing.assert_array_equal(kernel[..., 3:], untouched)  # the others as built
    second = keras.ops.convert_to_numpy(model.get_layer("wide")(first))
    np.testing.assert_allclose(second, keras.ops.convert_to_numpy(first)[..., :2], atol=1e-6)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model.get_layer("even").kernel), before
    )


def test_initialize_reads_the_sample_only_for_a_whitening_layer_made_from_data():
    model = models.build_model("airbench_s_gray", num_classes=4, image_size=16)
    kernel = whitening.whitening_layer(model).kernel.numpy().copy()

    def no_sample():
        raise AssertionError("the sample was read")

    lines = prepare.initialize(model, False, no_sample, whitening="trained")
    assert lines == ["--whitening=trained: whiten trains from a random start"]
    layer = whitening.whitening_layer(model)
    assert layer.trainable and any(w is layer.kernel for w in model.trainable_weights)
    np.testing.assert_array_equal(layer.kernel.numpy(), kernel)
    assert prepare.initialize(models.build_model("tiny_cnn", 4, 16), True, no_sample) == [
        "--dirac_init: 6 convolutions start as identities where shapes allow"
    ]


def test_whitening_is_a_setting_of_the_models_that_have_the_layer():
    from tfgpu.config import ConfigError, config_from, validate

    assert validate(config_from(model="airbench_s_gray", whitening="trained"))
    with pytest.raises(ConfigError, match="--whitening=trained is for the models with a whitening"):
        validate(config_from(model="resnet20", whitening="trained"))
