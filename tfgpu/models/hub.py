"""KerasHub backbones (``--model=hub:...``, read by ``own.py``): built from a configuration
with no download, or from a preset saved to a local directory with its weights, and the
pooling that puts tfgpu's head on their features (``foreign.py`` puts the model together).

keras-hub is the optional ``[hub]`` extra, imported only when a hub: model is built.
"""

import os

import keras
from keras import layers

from tfgpu.errors import ConfigError, first_line, install_extra
from tfgpu.models import own

WEIGHTS_FILES = ("model.weights.h5", "model.weights.json")  # whole, or sharded (KerasHub's)


def keras_hub(flag: str):
    """The keras_hub module; a ConfigError naming ``flag`` and the extra when it is missing."""
    try:
        import keras_hub as module  # noqa: PLC0415  (optional: the [hub] extra, for hub: only)
    except ImportError:
        raise ConfigError(f"{flag} needs KerasHub: {install_extra('hub')}") from None
    return module


def backbone(spec: own.Own, image_size: int) -> tuple:
    """(the KerasHub Backbone of ``spec``, words saying what it is) for images of side
    ``image_size``, in the global dtype policy (--dtype); a ConfigError of one line for a
    backbone that cannot be made or does not take such images."""
    hub = keras_hub(spec.flag)
    shape, policy = (image_size, image_size, 3), keras.config.dtype_policy().name
    if spec.kind == "hub_arch":
        name, arguments = own.HUB_ARCHITECTURES.get(spec.target, (spec.target, {}))
        cls = getattr(hub.models, name, None)
        if not (isinstance(cls, type) and issubclass(cls, hub.models.Backbone)):
            raise ConfigError(f"{spec.flag}: keras_hub.models has no backbone class {name}")
        arguments = dict(arguments, **dict(spec.arguments))
        try:
            model = cls(**arguments, image_shape=shape, dtype=policy)
        except (TypeError, ValueError) as err:
            why = first_line(err, 300)
            raise ConfigError(f"{spec.flag}: {name} refuses its arguments: {why}") from None
        return model, f"KerasHub {name} built from its configuration"
    has_weights = any(os.path.exists(os.path.join(spec.target, f)) for f in WEIGHTS_FILES)
    try:
        model = hub.models.Backbone.from_preset(spec.target, load_weights=has_weights, dtype=policy)
    except Exception as err:  # KerasHub's loaders raise many kinds: one line
        raise ConfigError(f"{spec.flag}: the preset does not load: {first_line(err)}") from None
    expected = model.input_shape[1:]
    if any(e is not None and e != s for e, s in zip(expected, shape)):
        raise ConfigError(
            f"{spec.flag} takes images of shape {tuple(expected)}, and --image_size={image_size} "
            f"makes {shape}: set --image_size={expected[0]}"
        )
    weights = "weights from the preset" if has_weights else "no weights in the preset: fresh"
    return model, f"KerasHub preset {type(model).__name__}, {weights}"


def pooled(backbone_model, features):
    """One vector per image of ``features`` (what ``backbone_model`` returns): the average
    of a feature map [N, H, W, C]; of tokens [N, T, C], the class token when the backbone
    has one (ViT, DeiT), else their average. Keras' own layers only: the model saves and
    loads with safe_mode, without tfgpu."""
    rank = len(features.shape)
    if rank == 4:
        return layers.GlobalAveragePooling2D(name="pool")(features)
    if rank == 3 and getattr(backbone_model, "use_class_token", False):
        first = layers.Cropping1D((0, features.shape[1] - 1), name="class_token")(features)
        return layers.Flatten(name="pool")(first)
    if rank == 3:
        return layers.GlobalAveragePooling1D(name="pool")(features)
    if rank == 2:
        return features
    raise ConfigError(f"a backbone's features of shape {tuple(features.shape)} have no pooling")
