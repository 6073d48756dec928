"""The registry: names, reference parameter counts, small-input stems, input normalization
and --init_weights. Only a few models are built (building is the slow part on 2 cores)."""

import contextlib
import types

import keras
import numpy as np

import pytest
from fewer_blocks import fewer_blocks
from weights import assert_same_weights

from tfgpu import models
from tfgpu.models import layers as nets
from tfgpu.config import ConfigError

EXPECTED_NAMES = (
    ["tiny_cnn", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]
    + [f"resnet{d}" for d in (20, 32, 44, 56, 110)]
    + ["wrn16_4", "wrn16_8", "wrn28_10", "wrn40_4"]
    + ["airbench94", "airbench93", "airbench94_gray", "airbench93_gray", "airbench_s_gray"]
    + ["densenet121", "densenet169", "densenet201"]
    + [f"efficientnet_b{i}" for i in range(8)]
    + [f"efficientnetv2_{v}" for v in ("b0", "b1", "b2", "b3", "s", "m", "l")]
)


@pytest.fixture(scope="module")
def small_models():
    """Models at 32x32 with the small-input stem, built once for the tests of this module.
    densenet121 in one dense block a stage (tests/fewer_blocks.py): its stem, its three
    transitions and its normalization are the whole model's; efficientnet_b0 whole, whose
    feature side needs every strided stage."""
    cache = {}

    def get(name, num_classes=7):
        if (name, num_classes) not in cache:
            with fewer_blocks() if name == "densenet121" else contextlib.nullcontext():
                model = models.build_model(name, num_classes, 32, small_input=True)
            cache[name, num_classes] = model
        return cache[name, num_classes]

    return get


def test_registry_has_exactly_the_contract_names():
    assert sorted(models.MODELS) == sorted(EXPECTED_NAMES)


def test_every_applications_entry_names_a_keras_application():
    # Cheap stand-in for building all 18 keras.applications models (~100 s on 2 cores).
    for name, (family, kwargs) in models.MODELS.items():
        if family == "applications":
            assert callable(getattr(keras.applications, kwargs["app_name"])), name


@pytest.mark.parametrize(
    "name, paper_millions",
    [
        # He et al. 2016, Table 6 (CIFAR-10): 0.27M, 0.46M, 0.66M, 0.85M, 1.7M.
        ("resnet20", 0.27),
        ("resnet32", 0.46),
        ("resnet44", 0.66),
        ("resnet56", 0.85),
        ("resnet110", 1.7),
        # Zagoruyko & Komodakis 2016, Tables 1 and 4: WRN-16-4 2.7M, WRN-28-10 36.5M, WRN-40-4
        # 8.9M, WRN-16-8 11.0M.
        ("wrn16_4", 2.7),
        ("wrn28_10", 36.5),
        ("wrn40_4", 8.9),
        ("wrn16_8", 11.0),
    ],
)
def test_small_image_networks_have_their_papers_parameter_counts(name, paper_millions):
    # 32x32 RGB, 10 classes, as the papers (the count does not depend on the image size).
    # Built in a StatelessScope, which leaves each variable's initializer undrawn (its shape
    # known): the count is the layers', not their values' (wrn28_10's 36.5M drawn ~0.5 CPU-s).
    with keras.StatelessScope():
        model = models.build_model(name, num_classes=10, image_size=32)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    digits = len(str(paper_millions).split(".")[1])  # the paper's rounding
    assert round(trainable / 1e6, digits) == paper_millions, trainable


@pytest.mark.parametrize(
    "name, trainable, total",
    [
        # Trainable counts equal torchvision's / the papers' (BatchNorm moving stats excluded).
        ("resnet18", 11_689_512, None),
        ("resnet50", 25_557_032, 25_610_152),
        ("densenet121", 7_978_856, 8_062_504),
        ("efficientnet_b0", 5_288_548, 5_330_571),
    ],
)
@pytest.mark.slow  # builds 224x224 models: 7 s for densenet121 (2 shared cores)
def test_parameter_counts_match_the_references_at_1000_classes(name, trainable, total):
    model = models.build_model(name, num_classes=1000, image_size=224)
    assert sum(int(np.prod(w.shape)) for w in model.trainable_weights) == trainable
    if total:
        assert abs(model.count_params() - total) < 20  # + the 7 normalization statistics


@pytest.mark.parametrize(
    "name", ["tiny_cnn", "resnet18", "resnet20", "wrn16_4", "densenet121", "efficientnet_b0"]
)
@pytest.mark.slow  # builds densenet121 (15 s), efficientnet_b0 (8 s) (2 shared cores)
def test_small_input_models_give_float32_logits(small_models, name):
    logits = small_models(name)(np.zeros((2, 32, 32, 3), np.float32))
    assert logits.shape == (2, 7) and logits.dtype == "float32"


@pytest.mark.parametrize(
    "name, feature_side", [("resnet18", 4), ("densenet121", 4), ("efficientnet_b0", 2)]
)
@pytest.mark.slow  # the same models (10 s, 8 s) when run alone (2 shared cores)
def test_small_input_stem_keeps_32x32_features_spatial(small_models, name, feature_side):
    model = small_models(name)
    pools = [x for x in _all_layers(model) if isinstance(x, keras.layers.GlobalAveragePooling2D)]
    # The last one is the head's (EfficientNets also pool in squeeze-and-excitation blocks).
    assert pools[-1].input.shape[1:3] == (feature_side, feature_side)


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _all_layers(layer)


def _normalizer(model):
    """A sub-model from the pixels to the output of the model's input normalization."""
    if "normalize" in [layer.name for layer in model.layers]:  # tfgpu's own, in front
        return keras.Model(model.input, model.get_layer("normalize").output)
    (backbone,) = [layer for layer in model.layers if isinstance(layer, keras.Model)]
    norm = [x for x in backbone.layers if isinstance(x, keras.layers.Normalization)]
    return keras.Model(backbone.input, norm[0].output)


@pytest.mark.parametrize("name", ["resnet18", "densenet121", "efficientnet_b0"])
@pytest.mark.slow  # the same models when run alone (2 shared cores)
def test_models_normalize_0_255_pixels_with_imagenet_mean_and_std(small_models, name):
    normalize = _normalizer(small_models(name))
    mean = np.array(nets.IMAGENET_MEAN, np.float32)
    std = np.sqrt(np.array(nets.IMAGENET_VAR, np.float32))
    image = np.broadcast_to(mean, (1, 32, 32, 3))
    np.testing.assert_allclose(normalize(image), 0.0, atol=1e-5)
    np.testing.assert_allclose(normalize(image + std), 1.0, atol=1e-5)


def test_channels_first_is_refused():
    keras.config.set_image_data_format("channels_first")
    try:
        with pytest.raises(ValueError, match="channels-last"):
            models.build_model("tiny_cnn", 3, 32)
    finally:
        keras.config.set_image_data_format("channels_last")


def test_unknown_model_names_the_choices():
    with pytest.raises(ConfigError, match="resnet50.*or a model of your own"):
        models.build_model("resnet5", 10, 32)


def _perturbed_tiny_cnn(num_classes, seed):
    keras.utils.set_random_seed(seed)
    return models.build_model("tiny_cnn", num_classes, 32)


def test_init_weights_loads_weights_h5_exactly(tmp_path):
    source = _perturbed_tiny_cnn(5, seed=1)
    source.save_weights(tmp_path / "w.weights.h5")
    target = _perturbed_tiny_cnn(5, seed=2)
    assert models.load_initial_weights(target, str(tmp_path / "w.weights.h5")) == []
    assert_same_weights(target, source)


def test_set_initial_weights_loads_the_file_and_says_where_they_came_from(tmp_path):
    """The run's initial weights: --init_weights loaded and said (with what the freeze
    leaves training); else the builder's, said only by a model of one's own."""
    source = _perturbed_tiny_cnn(5, seed=1)
    source.save_weights(tmp_path / "w.weights.h5")
    target = _perturbed_tiny_cnn(5, seed=2)
    m = types.SimpleNamespace(init_weights=str(tmp_path / "w.weights.h5"), unfreeze_after_steps=0)
    line = models.set_initial_weights(target, m, "head only")
    assert_same_weights(target, source)
    assert line == (
        f"init: weights from --init_weights={m.init_weights}; head only (a checkpoint in "
        "--model_dir, if any, replaces them)"
    )
    built, reference = _perturbed_tiny_cnn(5, seed=2), _perturbed_tiny_cnn(5, seed=2)
    none = types.SimpleNamespace(init_weights="", unfreeze_after_steps=0)
    assert models.set_initial_weights(built, none, "head only") == ""
    built.tfgpu_line = "mine: built by its builder"
    assert models.set_initial_weights(built, none, "") == "mine: built by its builder"
    said = models.set_initial_weights(built, none, "head only")
    assert said == "mine: built by its builder\nfine-tune: head only"
    assert_same_weights(built, reference)


def test_init_weights_from_keras_file_may_change_the_number_of_classes(tmp_path):
    source = _perturbed_tiny_cnn(5, seed=1)
    source.save(tmp_path / "m.keras")
    target = _perturbed_tiny_cnn(3, seed=2)
    assert models.load_initial_weights(target, str(tmp_path / "m.keras")) == ["logits"]
    np.testing.assert_array_equal(
        source.get_layer("conv2b").kernel.numpy(), target.get_layer("conv2b").kernel.numpy()
    )


def test_init_weights_errors_are_one_line(tmp_path):
    model = _perturbed_tiny_cnn(5, seed=1)
    with pytest.raises(ConfigError, match="no such file"):
        models.load_initial_weights(model, str(tmp_path / "missing.weights.h5"))
    _perturbed_tiny_cnn(4, seed=1).save_weights(tmp_path / "other.weights.h5")
    with pytest.raises(ConfigError, match="does not fit model") as err:
        models.load_initial_weights(model, str(tmp_path / "other.weights.h5"))
    assert "\n" not in str(err.value)
    (tmp_path / "x.ckpt").write_text("")
    with pytest.raises(ConfigError, match=r"\.weights\.h5 or \.keras"):
        models.load_initial_weights(model, str(tmp_path / "x.ckpt"))


def test_every_registry_family_is_a_module_with_a_build():
    import importlib.util

    for name, (family, _) in models.MODELS.items():
        assert importlib.util.find_spec(f"tfgpu.models.{family}"), f"{name}: no models/{family}.py"
    for family in {f for f, _ in models.MODELS.values()}:
        assert callable(importlib.import_module(f"tfgpu.models.{family}").build), family
