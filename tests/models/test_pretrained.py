"""--init_weights=imagenet / a keras.applications .h5 file, and --freeze=backbone. Offline:
the weights files are made here, in Keras' own HDF5 format, from models built without weights.
EfficientNetB0 in its first three stages (tests/fewer_blocks.py: Keras' builder, its layer
names, each kind of block), the files and the models alike; the whole B0's file loaded by name
is a heavy case."""

import contextlib
import shutil

import h5py
import keras
import numpy as np
import pytest
from fewer_blocks import fewer_blocks
from keras_files import efficientnet_b0_h5
from weights import assert_same_weights

from tfgpu import models
from tfgpu.step import batchnorm
from tfgpu.models import pretrained
from tfgpu.config import ConfigError, config_from, validate

HEAVY = pytest.mark.heavy
SLOW = pytest.mark.slow  # builds efficientnet_b0 (32x32) once or twice: ~1 s each (whole: ~5)


def _small(whole=False):
    """Where EfficientNetB0 has B0's first three stages, unless ``whole``."""
    return contextlib.nullcontext() if whole else fewer_blocks()


def _model(whole=False):
    keras.utils.set_random_seed(1)
    with _small(whole):
        return models.build_model("efficientnet_b0", 4, 32, small_input=True)


@pytest.fixture(scope="module")
def notop(tmp_path_factory) -> tuple:
    """(path, model) of a weights file of EfficientNetB0 without its top, as Keras names it,
    made once for the module's three tests that read it (~2 CPU-s each): read it, or copy it
    to change it."""
    path = tmp_path_factory.mktemp("h5") / "efficientnetb0_notop.h5"
    with _small():
        return str(path), efficientnet_b0_h5(path)


@SLOW
@pytest.mark.parametrize(
    "include_top, whole", [(False, False), (True, False), pytest.param(False, True, marks=HEAVY)]
)
def test_keras_h5_loads_into_the_backbone_by_name(tmp_path, include_top, whole, notop):
    path, source = notop
    if include_top or whole:
        path = str(tmp_path / f"efficientnetb0{'' if include_top else '_notop'}.h5")
        with _small(whole):
            source = efficientnet_b0_h5(path, include_top)
    model = _model(whole)
    head = model.get_layer("logits").kernel.numpy()
    assert models.load_initial_weights(model, path) == ["logits"]
    backbone = pretrained.backbone_of(model)
    for layer in ("stem_conv", "block1a_dwconv", "top_conv", "top_bn"):
        assert_same_weights(backbone.get_layer(layer), source.get_layer(layer), what=layer)
    np.testing.assert_array_equal(model.get_layer("logits").kernel.numpy(), head)  # new head


@SLOW
def test_imagenet_from_keras_cache_or_one_line_naming_the_file(tmp_path, monkeypatch, notop):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    model = _model()
    with pytest.raises(ConfigError, match="efficientnetb0_notop.h5 is not in") as err:
        models.load_initial_weights(model, "imagenet")
    message = str(err.value)
    assert "\n" not in message and "https://storage.googleapis.com/keras-applications/" in message
    (tmp_path / "models").mkdir()
    shutil.copy(notop[0], tmp_path / "models" / "efficientnetb0_notop.h5")
    source = notop[1]
    models.load_initial_weights(model, "imagenet")
    np.testing.assert_array_equal(
        pretrained.backbone_of(model).get_layer("stem_conv").kernel.numpy(),
        source.get_layer("stem_conv").kernel.numpy(),
    )


@SLOW
def test_a_file_that_does_not_fit_names_the_first_layer(tmp_path, notop):
    path = tmp_path / "efficientnetb0_notop.h5"
    shutil.copy(notop[0], path)
    with h5py.File(path, "r+") as f:  # another stem: 16 filters instead of 32
        group = f["stem_conv"]
        (weight,) = [w if isinstance(w, str) else w.decode() for w in group.attrs["weight_names"]]
        del group[weight]
        group[weight] = np.zeros((3, 3, 3, 16), np.float32)
    with pytest.raises(ConfigError, match="layer 'stem_conv' holds") as err:
        models.load_initial_weights(_model(), str(path))
    assert "\n" not in str(err.value)


@SLOW
def test_freeze_backbone_trains_the_head_only_with_frozen_batchnorm():
    model = _model()
    assert pretrained.freeze_backbone(model) == 2  # the head's kernel and bias
    assert batchnorm.moving_statistics(model) == []  # frozen BatchNorm: nothing to average
    bn = pretrained.backbone_of(model).get_layer("top_bn")
    before = bn.moving_mean.numpy().copy()
    images = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 3)).astype("float32")
    model(images, training=True)  # inference mode: the statistics stay
    np.testing.assert_array_equal(bn.moving_mean.numpy(), before)


@SLOW
def test_a_restored_checkpoint_normalizes_with_its_statistics(tmp_path):
    # EfficientNet's Normalization computes with constants made from its variables; after a
    # tf.train.Checkpoint restore (tfgpu.evaluate, predict, a resumed run) they must be the
    # restored ones, not those the fresh model was built with.
    import tensorflow as tf

    from tfgpu.models.layers import refresh_derived_state

    trained = _model()
    norm = _normalization(trained)
    norm.adapt_variance.assign(norm.adapt_variance * 2.0)  # as the ImageNet fold changes it
    norm.finalize_state()
    path = tf.train.Checkpoint(model=trained).write(str(tmp_path / "ckpt"))
    restored = _model()
    tf.train.Checkpoint(model=restored).read(path).assert_existing_objects_matched()
    refresh_derived_state(restored)
    images = np.random.default_rng(0).uniform(0, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(_normalization(restored)(images), norm(images))


def _normalization(model):
    (norm,) = [
        layer
        for layer in pretrained.backbone_of(model).layers
        if isinstance(layer, keras.layers.Normalization)
    ]
    return norm


@pytest.mark.fast
def test_resnets_and_tiny_cnn_have_no_imagenet_start():
    with pytest.raises(ConfigError, match="v1.5"):
        validate(config_from(model="resnet50", init_weights="imagenet"))
    with pytest.raises(ConfigError, match="--freeze=backbone is for"):
        validate(config_from(model="tiny_cnn", freeze="backbone"))
    validate(config_from(model="densenet121", init_weights="imagenet", freeze="backbone"))
