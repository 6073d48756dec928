"""A model of one's own (docs/own-model.md): every --model form read before TensorFlow, built and
checked, each mistake and refusal one line naming --model or the option; the input scaled
once; the head and backbone of --freeze=backbone; KerasHub's ViT built offline and round-tripped
through a preset directory. No training here (tests/e2e/test_own_model_runs.py trains)."""

import importlib
import json
import os
import sys

import keras
import numpy as np
import pytest
from hypothesis import example, HealthCheck, given, settings
from hypothesis import strategies as st
from outcomes import expects, outcome
from own_nets import write_module
from requires import requires
from weights import assert_same_weights

from tfgpu import models
from tfgpu.config import config_from, rundir, validate
from tfgpu.errors import ConfigError, install_extra
from tfgpu.imagenet import IMAGENET_MEAN, IMAGENET_VAR
from tfgpu.models import backbone, foreign, own, prepare
from tfgpu.models.layers import batchnorm_layers

TINY_VIT = "hub:vit_tiny_16?patch_size=4&num_layers=1&num_heads=2&hidden_dim=16&mlp_dim=32"
DEIT = "patch_size=4&num_layers=1&num_heads=2&hidden_dim=16&intermediate_dim=32"


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    """The name of the user's model module, written into a temporary folder on the path."""
    return write_module(tmp_path_factory.mktemp("own"))


@pytest.fixture(scope="module")
def keras_file(nets, tmp_path_factory):
    """A .keras file of own_nets' functional_bn for 5 classes, at 16x16."""
    path = str(tmp_path_factory.mktemp("file") / "fbn.keras")
    keras.utils.set_random_seed(1)
    importlib.import_module(nets).functional_bn(5, 16).save(path)
    return path


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


def _refused(**values) -> str:
    with pytest.raises(ConfigError) as err:
        validate(config_from(**values))
    return _one_line(err)


# --- the string, before TensorFlow ------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("resnet5", "--model='resnet5' is unknown; choose from"),
        ("", "is empty"),
        (" tiny_cnn", "spaces or control characters"),
        ("a:b:c", "is not package.module:function"),
        ("mod:", "is not package.module:function"),
        (":build", "is not package.module:function"),
        ("1mod:build", "is not package.module:function"),
        ("no_such_module_tfgpu:build", "no module named 'no_such_module_tfgpu'"),
        ("missing/net.keras", "no such .keras file"),
        ("hub:", "neither a local preset directory nor an architecture"),
        ("hub:vit_huge_99", "choose from vit_tiny_16"),
        ("hub:vit_tiny_16?patch_size", "is not key=value"),
        ("hub:vit_tiny_16?image_shape=[8,8,3]", "image_shape is tfgpu's to set (--image_size)"),
        ("hub:vit_tiny_16?dtype=float16", "dtype is tfgpu's to set (--dtype)"),
        ("hub:vit_tiny_16?a=1&a=2", "a key is given twice"),
        ("hub:vit_tiny_16?a=x y", "neither a JSON value nor a word"),
        ("hub:kaggle://keras/vit/keras/vit_base", "never downloads"),
        ("hub:./no_such_preset", "no such preset directory"),
    ],
)
def test_a_malformed_model_is_one_line_before_tensorflow(text, expected):
    assert expected in _refused(model=text)


def test_a_file_that_is_not_what_it_claims_is_one_line(tmp_path):
    (tmp_path / "net.keras").write_text("not a zip")
    assert "not a Keras .keras file" in _refused(model=str(tmp_path / "net.keras"))
    preset = tmp_path / "preset"
    preset.mkdir()
    assert "no config.json" in _refused(model=f"hub:{preset}")
    (preset / "config.json").write_text("{broken")
    assert "config.json:" in _refused(model=f"hub:{preset}")
    (preset / "config.json").write_text(
        json.dumps({"class_name": "ViTImageClassifier", "config": {}})
    )
    assert "not a KerasHub backbone" in _refused(model=f"hub:{preset}")


@expects("read", "refused")
@example("json:dumps")  # a function's form, read: the generated strings may all be refused
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from(
            ["hub:", "vit_tiny_16", "ResNetBackbone", "?", "&", "=", "[1,2]", ":", ".", "/",
             ".keras", "os", "path", "json:dumps", "~", " ", "\n", "a", "1", "-", "é", "\x00"]
        ),
        max_size=8,
    ).map("".join)
    | st.text(max_size=40)
)  # fmt: skip
def test_any_model_string_is_read_or_refused_in_one_line(text):
    """Every string is a form of --model, or a ConfigError of one line naming --model."""
    try:
        spec = own.parse(text)
    except ConfigError as err:
        assert "\n" not in str(err) and str(err).startswith("--model="), repr(str(err))
        outcome("refused")
        return
    outcome("read")
    assert spec.kind in ("function", "keras_file", "hub_arch", "hub_preset", "registered")
    assert spec.text == text


@pytest.mark.parametrize(
    "values, expected",
    [
        (dict(remat=True), "--remat cuts a registry model into its known blocks"),
        (dict(small_input=True), "--small_input changes a registry model's stem"),
        (dict(drop_path_rate=0.1), "--drop_path_rate sets the stochastic depth"),
        (dict(layer_lr_decay=0.5), "--layer_lr_decay=0.5 needs a backbone in blocks"),
        (dict(head_layers="classifier"), "--head_layers names what --freeze=backbone"),
        (dict(input_scaling="preset"), "--input_scaling=preset takes the scaling of a KerasHub"),
        (dict(init_weights="imagenet"), "--init_weights=imagenet is for the keras.applications"),
        (dict(whitening="trained"), "--whitening=trained is for the models with a whitening"),
    ],
)
def test_settings_that_need_tfgpu_structure_are_refused_naming_the_model(nets, values, expected):
    message = _refused(model=f"{nets}:functional_bn", **values)
    assert expected in message
    if "--model" not in expected:
        assert f"{nets}:functional_bn" in message


@pytest.mark.parametrize("values", [dict(input_scaling="unit"), dict(head_layers="logits")])
def test_settings_for_a_model_of_ones_own_are_refused_for_a_registry_model(values):
    assert "is for a model of your own, not --model=tiny_cnn" in _refused(
        model="tiny_cnn", **values
    )


def test_register_makes_a_name_and_refuses_bad_ones(nets):
    module = importlib.import_module(nets)
    models.register("my_plain_net", module.plain)
    assert validate(config_from(model="my_plain_net")).model.name == "my_plain_net"
    model = models.build_model("my_plain_net", 3, 16)
    assert model.output_shape == (None, 3)
    for name, builder, expected in [
        ("my:net", module.plain, "a name is letters"),
        ("resnet50", module.plain, "a registry model of tfgpu"),
        ("my_net", "not callable", "must be callable"),
    ]:
        with pytest.raises(ConfigError, match=expected):
            models.register(name, builder)


# --- the build ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "function, batchnorms", [("functional_bn", 2), ("subclassed", 2), ("plain", 0)]
)
def test_a_builder_module_makes_a_model_of_logits_with_its_batchnorms_found(
    nets, function, batchnorms
):
    model = models.build_model(f"{nets}:{function}", 3, 16)
    assert model.output_shape == (None, 3) and model.output.dtype == "float32"
    assert len(batchnorm_layers(model)) == batchnorms  # inside a subclassed model's blocks too
    assert "built by its builder" in model.tfgpu_line
    assert "tfgpu's ImageNet mean/std normalization in front" in model.tfgpu_line
    if function == "subclassed":  # its Block has no get_config: the start line says so
        assert "no model.keras at export: Net has no get_config" in model.tfgpu_line


@pytest.mark.parametrize(
    "function, expected",
    [
        ("not_a_model", "the builder returned str, not a keras.Model"),
        ("raises", "the builder raised RuntimeError: the builder's own mistake"),
        ("grayscale", "takes inputs of shape (None, 16, 16, 1); tfgpu feeds one batch"),
        ("one_class_more", "returns outputs of shape (None, 4); expected logits (None, 3)"),
        ("probabilities", "returns probabilities (softmax); tfgpu's losses take logits"),
        ("no_such_function", "has no function no_such_function"),
    ],
)
def test_what_a_builder_returns_is_checked_in_one_line(nets, function, expected):
    with pytest.raises(ConfigError) as err:
        models.build_model(f"{nets}:{function}", 3, 16)
    message = _one_line(err)
    assert message.startswith(f"--model={nets}:{function}") and expected in message


def test_a_module_that_fails_to_import_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_nets_tfgpu.py").write_text("import no_such_dependency_tfgpu\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as err:
        models.build_model("broken_nets_tfgpu:build", 3, 16)
    assert "cannot import broken_nets_tfgpu (ModuleNotFoundError" in _one_line(err)
    assert "importable on every worker" in str(err.value)


def test_a_keras_file_keeps_its_weights_and_gets_a_new_classifier(nets, keras_file):
    saved = keras.saving.load_model(keras_file, safe_mode=True)
    same = models.build_model(keras_file, 5, 16)
    network = [x for x in same.layers if isinstance(x, keras.Model)][0]
    assert_same_weights(network, saved)
    other = models.build_model(keras_file, 3, 16)
    assert other.output_shape == (None, 3)
    assert "classifier classifier new (5 -> 3 classes)" in other.tfgpu_line
    network = [x for x in other.layers if isinstance(x, keras.Model)][0]
    mine, kept = _by_path(network, but="classifier"), _by_path(saved, but="classifier")
    assert_same_weights(mine, kept, what="all but the classifier")


def test_dirac_init_is_refused_for_a_model_that_brings_trained_weights(nets, keras_file):
    assert "--dirac_init would overwrite the trained weights" in _refused(
        model=keras_file, dirac_init=True
    )
    assert validate(config_from(model=f"{nets}:functional_bn", dirac_init=True))


def test_a_keras_file_holding_python_code_is_refused_in_one_line(tmp_path):
    x = inputs = keras.Input((16, 16, 3))
    x = keras.layers.Lambda(lambda t: t * 2)(keras.layers.GlobalAveragePooling2D()(x))
    path = str(tmp_path / "lambda.keras")
    keras.Model(inputs, keras.layers.Dense(3)(x)).save(path)
    with pytest.raises(ConfigError) as err:
        models.build_model(path, 3, 16)
    assert _one_line(err).startswith(f"--model={path} does not load (safe_mode): ")


def test_a_float32_keras_file_computes_in_the_runs_mixed_precision(keras_file):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = models.build_model(keras_file, 5, 16)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    network = [x for x in model.layers if isinstance(x, keras.Model)][0]
    assert network.get_layer("conv0").compute_dtype == "bfloat16"
    assert model.output.dtype == "float32"  # logits cast back: the loss in float32
    assert_same_weights(network, keras.saving.load_model(keras_file, safe_mode=True))


def _by_path(model, but: str) -> dict:
    """``model``'s weights by their path (its layers' names: the file's), but those under
    ``but``."""
    return {w.path: w.numpy() for w in model.weights if not w.path.startswith(but)}


def _network_input(model, images):
    """What the user's network inside ``model`` receives for ``images``."""
    scaling = [x for x in model.layers[1:] if not isinstance(x, keras.Model)]
    return scaling[0](images).numpy() if scaling else images


@pytest.mark.parametrize(
    "function, scaling, expected",
    [
        ("plain", "auto", lambda x: (x - IMAGENET_MEAN) / np.sqrt(IMAGENET_VAR)),
        ("scales_itself", "auto", lambda x: x),  # its own Rescaling: tfgpu adds none
        ("plain", "unit", lambda x: x / 255),
        ("plain", "symmetric", lambda x: x / 127.5 - 1),
        ("plain", "none", lambda x: x),
    ],
)  # fmt: skip
def test_the_pixels_are_scaled_once(nets, function, scaling, expected):
    model = models.build_model(f"{nets}:{function}", 3, 8, input_scaling=scaling)
    images = np.random.default_rng(0).uniform(0, 255, (2, 8, 8, 3)).astype("float32")
    np.testing.assert_allclose(
        _network_input(model, images), expected(images), rtol=1e-4, atol=1e-4
    )
    said = {
        "none": "the network scales them",
        "auto": "ImageNet" if function == "plain" else "the network",
    }
    assert said.get(scaling, "in front") in model.tfgpu_line


# --- KerasHub, offline ------------------------------------------------------------------


@pytest.fixture(scope="module")
def keras_hub():
    """KerasHub, the [hub] extra (make test installs it; the bare virtualenv has none)."""
    requires("hub")
    return importlib.import_module("keras_hub")


@pytest.fixture(scope="module")
def vit_preset(keras_hub, tmp_path_factory):
    """A tiny ViT saved as a KerasHub preset with its image converter (x / 127.5 - 1)."""
    directory = str(tmp_path_factory.mktemp("hub") / "vit")
    keras.utils.set_random_seed(2)
    model = models.build_model(TINY_VIT, 3, 16)
    vit = [x for x in model.layers if isinstance(x, keras_hub.models.Backbone)][0]
    vit.save_to_preset(directory)
    keras_hub.layers.ViTImageConverter(
        image_size=(16, 16), scale=1 / 127.5, offset=-1.0
    ).save_to_preset(directory)
    return directory, {f"{i}:{w.name}": w.numpy() for i, w in enumerate(vit.weights)}


@pytest.mark.parametrize(
    "name, pooling",
    [
        (TINY_VIT, "class_token"),  # ViT: its class token
        (f"hub:DeiTBackbone?{DEIT}", "pool"),  # the tokens' mean
        ("hub:resnet_18?stackwise_num_blocks=[1,1,1,1]", "pool"),  # the feature map's mean
    ],
)  # fmt: skip
def test_a_kerashub_backbone_is_built_from_its_configuration_with_tfgpus_head(
    keras_hub, name, pooling
):
    model = models.build_model(name, 3, 16)
    assert model.output_shape == (None, 3)
    assert "built from its configuration" in model.tfgpu_line
    assert model.get_layer(pooling) and model.get_layer("logits")


def test_a_kerashub_preset_directory_loads_with_its_weights_and_its_scaling(vit_preset):
    directory, weights = vit_preset
    model = models.build_model(f"hub:{directory}", 3, 16)
    vit = [x for x in model.layers if isinstance(x, keras.Model)][0]
    assert_same_weights(vit, weights)
    assert "weights from the preset" in model.tfgpu_line
    assert "the preset's image converter in front" in model.tfgpu_line
    images = np.random.default_rng(0).uniform(0, 255, (2, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(_network_input(model, images), images / 127.5 - 1, atol=1e-5)
    replaced = models.build_model(f"hub:{directory}", 3, 16, input_scaling="unit")
    np.testing.assert_allclose(_network_input(replaced, images), images / 255, atol=1e-6)


def test_a_preset_of_another_image_size_is_one_line(vit_preset):
    with pytest.raises(ConfigError) as err:
        models.build_model(f"hub:{vit_preset[0]}", 3, 32)
    assert "takes images of shape (16, 16, 3)" in _one_line(err)
    assert "set --image_size=16" in str(err.value)


def test_a_hub_model_without_kerashub_is_one_line_before_tensorflow(monkeypatch):
    monkeypatch.setitem(sys.modules, "keras_hub", None)  # as in a virtualenv without [hub]
    assert _refused(model=TINY_VIT) == f"--model={TINY_VIT} needs KerasHub: {install_extra('hub')}"
    with pytest.raises(ConfigError, match=r"needs KerasHub: pip install '\.\[hub\]'"):
        models.build_model(TINY_VIT, 3, 16)


def test_a_kerashub_class_with_wrong_arguments_is_one_line(keras_hub):
    with pytest.raises(ConfigError) as err:
        models.build_model("hub:ViTBackbone?patch_size=4", 3, 16)
    assert "ViTBackbone refuses its arguments" in _one_line(err)
    with pytest.raises(ConfigError, match="keras_hub.models has no backbone class NoSuchBackbone"):
        models.build_model("hub:NoSuchBackbone?a=1", 3, 16)


# --- what --freeze=backbone freezes, and sizes a model takes ----------------------------


def test_the_backbone_is_all_but_the_last_layer_or_what_head_layers_leaves(nets):
    name = f"{nets}:functional_bn"
    model = models.build_model(name, 3, 16)
    m = config_from(model=name, freeze="backbone").model
    frozen, head = backbone.parts(model, m)
    assert [x.name for x in head] == ["classifier"]
    assert [x.name for x in frozen] == ["conv0", "bn0", "conv1", "bn1"]
    backbone.freeze(model, m)
    assert [v.path for v in model.trainable_variables] == ["classifier/kernel", "classifier/bias"]
    backbone.unfreeze(model, m)
    assert len(model.trainable_variables) == 8
    m = config_from(model=name, freeze="backbone", head_layers="bn1, classifier").model
    assert [x.name for x in backbone.parts(model, m)[1]] == ["bn1", "classifier"]
    m = config_from(model=name, freeze="backbone", head_layers="fc").model
    with pytest.raises(ConfigError) as err:
        backbone.parts(model, m)
    assert "--head_layers: --model=" in _one_line(err) and "no layer 'fc'" in str(err.value)


def test_a_kerashub_models_backbone_is_the_kerashub_backbone(keras_hub):
    model = models.build_model(TINY_VIT, 3, 16)
    frozen, head = backbone.parts(model, config_from(model=TINY_VIT, freeze="backbone").model)
    assert [x.name for x in head] == ["logits"]
    assert any(type(x).__name__ == "ViTBackbone" for x in frozen)


def test_progressive_resizing_refuses_a_model_of_one_input_size(nets, keras_hub):
    """A model of one size is refused with the first stage's side; one that pools any size
    is taken (``prepare.any_input_size`` widens its input check, as for tfgpu's own)."""
    for name in (TINY_VIT, f"{nets}:fixed_size"):
        model = models.build_model(name, 3, 16)
        prepare.any_input_size(model)
        with pytest.raises(ConfigError) as err:
            foreign.check_any_size(model, name, 8)
        assert _one_line(err).startswith("--progressive_stages trains at smaller images (8x8")
    model = models.build_model(f"{nets}:functional_bn", 3, 16)
    prepare.any_input_size(model)
    foreign.check_any_size(model, f"{nets}:functional_bn", 8)


def test_a_restart_that_names_its_keras_file_relatively_resumes(keras_file, monkeypatch):
    """config.json holds the absolute path; the same command run again in the file's folder
    (--model=fbn.keras) is the same model, not a contradiction of the checkpoints."""
    monkeypatch.chdir(os.path.dirname(keras_file))
    stored = config_from(model=keras_file).flat()
    given = config_from(model="fbn.keras").flat()
    values = rundir.restart_values(stored, given, {"model"}, resuming=True, where="runs/x")
    assert values["model"] == keras_file
    with pytest.raises(ConfigError, match="--model=tiny_cnn contradicts the run"):
        rundir.restart_values(stored, dict(given, model="tiny_cnn"), {"model"}, resuming=True)


def test_the_model_path_is_stored_absolute(keras_file, tmp_path, monkeypatch):
    monkeypatch.chdir(os.path.dirname(keras_file))
    assert own.absolute("fbn.keras") == keras_file
    monkeypatch.chdir(tmp_path)
    assert own.absolute("hub:./vit") == f"hub:{tmp_path / 'vit'}"
    assert own.absolute(TINY_VIT) == TINY_VIT and own.absolute("tiny_cnn") == "tiny_cnn"
