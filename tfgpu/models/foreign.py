"""A model of the user's own built (``own.py`` reads its --model string): the user's network
(a builder's, a .keras file's, or a KerasHub backbone with tfgpu's head) checked, and put
between tfgpu's input scaling and float32 logits, as one Keras functional model:

    image [N, S, S, 3] float pixels in [0, 255] -> scaling (--input_scaling) -> the network
    -> (a cast to float32 when the network's logits are not)

The network is a layer of that model (a nested keras.Model): its weights, BatchNorm layers and
names are its own. Who scales the pixels is decided once, said in the start line, never twice:
``input_scaling``.
"""

import importlib

import keras
from keras import layers

from tfgpu.errors import ConfigError, first_line
from tfgpu.models import MODELS, hub, own
from tfgpu.models import layers as layers_

PROBABILITIES = ("softmax", "sigmoid", "log_softmax")


def build(text: str, num_classes: int, image_size: int, scaling: str = "auto"):
    """The model of --model ``text`` (a form of ``own.py``) for ``num_classes`` and images of
    side ``image_size``, under the global dtype policy; its ``tfgpu_line`` attribute says what
    it is and who scales its input (``scaling``: --input_scaling). A mistake is a ConfigError
    of one line naming --model."""
    spec = own.parse(text, MODELS)
    notes = []
    if spec.kind in ("hub_arch", "hub_preset"):
        network, what = hub.backbone(spec, image_size)
    elif spec.kind == "keras_file":
        network, what = _from_file(spec, num_classes, notes), "a .keras file, with its weights"
    else:
        network, what = _from_builder(spec, num_classes, image_size), "built by its builder"
    _check_input(spec, network, image_size)
    layer, words = input_scaling(input_scaling_choice(scaling, spec, network), spec)
    model = _assembled(spec, network, layer, num_classes, image_size)
    try:
        model.get_config()
    except NotImplementedError:  # the export says so too (serving.keras_file_refusal)
        notes.append(f"no model.keras at export: {type(network).__name__} has no get_config")
    params = model.count_params()
    model.tfgpu_line = (
        f"model: {spec.flag}: {what}, {params:,} parameters; input: float pixels in [0, 255], "
        f"{words}" + "".join(f"; {note}" for note in notes)
    )
    return model


def _from_builder(spec: own.Own, num_classes: int, image_size: int):
    """What the builder of ``spec`` (a registered one, or module:function) returns."""
    builder = own.registered(spec.target) if spec.kind == "registered" else _imported(spec)
    try:
        network = builder(num_classes=num_classes, image_size=image_size)
    except ConfigError:
        raise
    except Exception as err:  # the user's code: any error, said in one line
        raise ConfigError(
            f"{spec.flag}: the builder raised {type(err).__name__}: {first_line(err, 300)}"
        ) from err
    if not isinstance(network, keras.Model):
        raise ConfigError(
            f"{spec.flag}: the builder returned {type(network).__name__}, not a keras.Model"
        )
    return network


def _imported(spec: own.Own):
    """The function ``module:function`` names, imported."""
    module_name, attribute = spec.target.split(":")
    try:
        found = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or the module's own code failing
        raise ConfigError(
            f"{spec.flag}: cannot import {module_name} ({type(err).__name__}: "
            f"{first_line(err, 200)}); the module must be importable on every worker"
        ) from None
    for part in attribute.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise ConfigError(f"{spec.flag}: {module_name} has no function {attribute}")
    return found


def _from_file(spec: own.Own, num_classes: int, notes: list):
    """The model of a .keras file (safe_mode), in the global dtype policy, its classifier
    replaced when it predicts another number of classes (said in ``notes``)."""
    try:
        network = keras.saving.load_model(spec.target, compile=False, safe_mode=True)
    except Exception as err:  # Keras raises many kinds for a file it cannot read
        raise ConfigError(
            f"{spec.flag} does not load (safe_mode): {first_line(err, 300)}"
        ) from None
    network = _in_global_policy(spec, network)
    classes = network.output_shape[-1] if getattr(network, "outputs", None) else num_classes
    if classes != num_classes:
        network = _new_classifier(spec, network, classes, num_classes)
        notes.append(
            f"classifier {network.layers[-1].name} new ({classes} -> {num_classes} classes)"
        )
    return network


def _in_global_policy(spec: own.Own, network):
    """``network`` as it is when its layers compute in the global policy (--dtype), else
    rebuilt from its config without their stored policies and given its weights."""
    policy = keras.config.dtype_policy().name
    stored = {x.dtype_policy.name for x in layers_.nested_layers(network)[1:]}
    if stored <= {policy}:
        return network
    config = _without_policies(keras.saving.serialize_keras_object(network))
    try:
        rebuilt = keras.saving.deserialize_keras_object(config, safe_mode=True)
        rebuilt.set_weights(network.get_weights())
    except Exception as err:  # a custom class that cannot be rebuilt from its config
        raise ConfigError(
            f"{spec.flag} computes in {sorted(stored)} and cannot be rebuilt in --dtype={policy}: "
            f"{first_line(err, 200)}"
        ) from None
    return rebuilt


def _without_policies(value):
    """A serialized Keras object with its layers' ``dtype`` entries left out (so that they
    take the global policy); inputs and tensors keep theirs."""
    if isinstance(value, list):
        return [_without_policies(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _without_policies(v) for k, v in value.items()}
    keeps = value.get("class_name") in ("InputLayer", "__keras_tensor__", "DTypePolicy")
    if not keeps and isinstance(out.get("config"), dict):
        out["config"] = {k: v for k, v in out["config"].items() if k != "dtype"}
    return out


def _new_classifier(spec: own.Own, network, classes: int, num_classes: int):
    """``network`` with a new last Dense layer of ``num_classes`` units (same name, settings
    and input), as --init_weights does for a .keras file's logits."""
    last = network.layers[-1] if network.layers else None
    if not (isinstance(last, layers.Dense) and getattr(network, "inputs", None)):
        raise ConfigError(
            f"{spec.flag} predicts {classes} classes, the data has {num_classes}, and its last "
            f"layer ({getattr(last, 'name', None)}) is not a Dense classifier tfgpu could replace"
        )
    config = dict(last.get_config(), units=num_classes)
    fresh = layers.Dense.from_config(config)
    return keras.Model(network.inputs, fresh(last.input), name=network.name)


def _check_input(spec: own.Own, network, image_size: int) -> None:
    """A ConfigError when ``network`` declares inputs that are not one batch of NHWC RGB
    images of side ``image_size`` (a model not built yet is checked when called)."""
    inputs = getattr(network, "inputs", None) or []
    shapes = [tuple(x.shape) for x in inputs]
    if not shapes:
        return
    ok = len(shapes) == 1 and len(shapes[0]) == 4 and shapes[0][3] == 3
    if ok and all(s in (None, image_size) for s in shapes[0][1:3]):
        return
    shown = shapes[0] if len(shapes) == 1 else shapes
    raise ConfigError(
        f"{spec.flag} takes inputs of shape {shown}; tfgpu feeds one batch of images "
        f"(None, {image_size}, {image_size}, 3): NHWC, RGB, side --image_size"
    )


def input_scaling_choice(choice: str, spec: own.Own, network) -> str:
    """--input_scaling ``choice`` decided: ``auto`` is the preset's image converter for a
    KerasHub preset that has one, ``none`` for a network whose first layer is a Rescaling or
    Normalization (it scales its own input), else tfgpu's ImageNet normalization."""
    if choice != "auto":
        return choice
    if spec.kind == "hub_preset" and own.preset_scaling(spec.target):
        return "preset"
    first = _first_layer(network)
    return "none" if isinstance(first, (layers.Rescaling, layers.Normalization)) else "imagenet"


def _first_layer(model):
    """The first layer of ``model`` after its inputs, looking into a nested model."""
    for layer in model.layers:
        if not isinstance(layer, layers.InputLayer):
            return _first_layer(layer) if isinstance(layer, keras.Model) else layer
    return None


def input_scaling(choice: str, spec: own.Own) -> tuple:
    """(the layer that brings pixels in [0, 255] to what the network takes, or None; the
    words of the start line) for a decided --input_scaling ``choice``."""
    if choice == "imagenet":
        return layers_.normalize, "tfgpu's ImageNet mean/std normalization in front"
    if choice == "unit":
        return layers.Rescaling(1 / 255, name="scale_unit"), "x / 255 to [0, 1] in front"
    if choice == "symmetric":
        layer = layers.Rescaling(1 / 127.5, offset=-1.0, name="scale_symmetric")
        return layer, "x / 127.5 - 1 to [-1, 1] in front"
    if choice == "preset":
        scale, offset = own.preset_scaling(spec.target)
        words = f"the preset's image converter in front (x * {_shown(scale)} + {_shown(offset)})"
        return _affine(spec, scale, offset), words
    return None, "taken as they are (the network scales them: tfgpu adds nothing)"


def _shown(value) -> str:
    """A converter's scale or offset (a number, a list per channel, None) in few digits."""
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


def _affine(spec: own.Own, scale, offset):
    """A Normalization layer computing ``x * scale + offset`` per channel (each a number, a
    list per channel or None, as KerasHub's ImageConverter holds them)."""

    def per_channel(value, default):
        value = default if value is None else value
        return [float(v) for v in (value if isinstance(value, list) else [value] * 3)]

    scales, offsets = per_channel(scale, 1.0), per_channel(offset, 0.0)
    if len(scales) != 3 or len(offsets) != 3 or 0.0 in scales:
        raise ConfigError(f"{spec.flag}: image_converter.json's scale/offset is not per RGB")
    # (x - mean) / std = x * scale + offset  <=>  std = 1 / scale, mean = -offset / scale
    mean = [-o / s for o, s in zip(offsets, scales)]
    return layers.Normalization(mean=mean, variance=[1 / s**2 for s in scales], name="scale_preset")


def _assembled(spec: own.Own, network, scaling, num_classes: int, image_size: int):
    """Input -> ``scaling`` -> ``network`` (-> a KerasHub backbone's pooling and tfgpu's
    head) -> float32 logits; a ConfigError for a network that does not take the images or
    does not return ``num_classes`` logits."""
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = scaling(inputs) if scaling is not None else inputs
    try:
        y = network(x)
    except Exception as err:  # any layer of the user's may refuse the shape
        raise ConfigError(
            f"{spec.flag} does not take images of shape (None, {image_size}, {image_size}, 3): "
            f"{first_line(err, 300)}"
        ) from None
    if spec.kind in ("hub_arch", "hub_preset"):
        y = layers_.head(hub.pooled(network, y), num_classes)
    else:
        _check_logits(spec, network, y, num_classes)
    if y.dtype not in ("float32", "float64"):  # the loss and softmax in float32 (--dtype=mixed_*)
        y = layers.Activation("linear", dtype="float32", name="logits_float32")(y)
    return keras.Model(inputs, y, name=f"{network.name}_tfgpu")


def _check_logits(spec: own.Own, network, y, num_classes: int) -> None:
    """A ConfigError for outputs that are not one tensor of ``num_classes`` logits."""
    shape = tuple(y.shape) if hasattr(y, "shape") else None
    if shape is None or len(shape) != 2 or shape[1] != num_classes:
        raise ConfigError(
            f"{spec.flag} returns outputs of shape {shape}; expected logits (None, {num_classes}): "
            "one per class of the data"
        )
    last = network.layers[-1] if network.layers else None
    activation = getattr(getattr(last, "activation", None), "__name__", "")
    if isinstance(last, layers.Softmax) or activation in PROBABILITIES:
        raise ConfigError(
            f"{spec.flag}: its last layer {last.name!r} returns probabilities "
            f"({activation or 'softmax'}); tfgpu's losses take logits: leave the activation out"
        )


def check_any_size(model, name: str, side: int) -> None:
    """--progressive_stages: a ConfigError of one line when ``model`` (built as --model
    ``name``, its input widened by ``prepare.any_input_size``) does not take images of side
    ``side``, the first stage's (a ViT's position embeddings, a Flatten before a Dense).
    Registry models take any side."""
    if name in MODELS:
        return
    try:  # a forward pass, not a symbolic one: layers may say a shape they cannot compute
        model(keras.ops.zeros((1, side, side, 3)), training=False)
    except Exception as err:  # whichever layer refuses the side
        raise ConfigError(
            f"--progressive_stages trains at smaller images ({side}x{side} first), and "
            f"--model={name} takes one size only: {first_line(err, 200)}"
        ) from None
