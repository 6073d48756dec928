"""DenseNets and EfficientNets (v1, v2) from keras.applications, built without weights (the
machines are offline; ``--init_weights=imagenet`` loads them: ``pretrained.py``), with tfgpu's
normalization and head."""

import keras
from keras import layers

from tfgpu.models import layers as layers_
from tfgpu.imagenet import IMAGENET_MEAN, IMAGENET_VAR

# How each keras.applications family brings pixels from [0, 255] to what it was designed for.
# DenseNet has no preprocessing layer inside: tfgpu puts ImageNet mean/std in front of it.
# EfficientNet (v1) has Rescaling(1/255) + a Normalization layer whose statistics are only
# filled in by ImageNet weights; tfgpu sets them to the ImageNet mean/std itself.
# EfficientNetV2 normalizes inside (B0-B3: ImageNet mean/std; S/M/L: to [-1, 1], as the paper).
_SMALL_STEMS = {
    # layer name -> config changes that keep the layer (and so its weights) but stop it from
    # downsampling: stride 1, padding that keeps the size. 32x32 inputs then end at 4x4 (DenseNet)
    # or 2x2 (EfficientNets) instead of 1x1.
    "DenseNet": {"conv1_conv": {"strides": [1, 1]}, "pool1": {"strides": [1, 1]}},
    "EfficientNetB": {
        "stem_conv_pad": {"padding": [[1, 1], [1, 1]]},
        "stem_conv": {"strides": [1, 1]},
    },
    "EfficientNetV2": {"stem_conv": {"strides": [1, 1]}},
}


def _family(app_name: str) -> str:
    return next(
        f for f in ("DenseNet", "EfficientNetV2", "EfficientNetB") if app_name.startswith(f)
    )


KERAS_DROP_PATH_RATE = 0.2  # keras.applications' drop_connect_rate for every EfficientNet


def _rebuilt(backbone: keras.Model, family: str, small_input: bool, drop_path_rate: float):
    """``backbone`` rebuilt from its config with the stem's stride set to 1 (``small_input``)
    and its stochastic-depth rates scaled to ``drop_path_rate`` (-1: as built). Keras builds
    EfficientNets with drop_connect_rate 0.2 and no argument to change it; each block's
    Dropout (``*_drop``, one draw per example) holds 0.2 * block / blocks."""
    if not small_input and drop_path_rate < 0:
        return backbone
    config = backbone.get_config()
    changes = _SMALL_STEMS[family] if small_input else {}
    for layer in config["layers"]:
        cfg = layer["config"]
        cfg.update(changes.get(cfg["name"], {}))
        if (
            drop_path_rate >= 0
            and layer["class_name"] == "Dropout"
            and cfg["name"].endswith("_drop")
        ):
            cfg["rate"] = cfg["rate"] * drop_path_rate / KERAS_DROP_PATH_RATE
    return keras.Model.from_config(config)


def _set_imagenet_stats(backbone: keras.Model) -> None:
    """EfficientNet v1: fills its Normalization layer (after Rescaling(1/255)) with ImageNet
    mean/variance; without ImageNet weights Keras leaves it at mean 0, variance 1."""
    (norm,) = [layer for layer in backbone.layers if isinstance(layer, layers.Normalization)]
    norm.adapt_mean.assign([m / 255 for m in IMAGENET_MEAN])
    norm.adapt_variance.assign([v / 255**2 for v in IMAGENET_VAR])
    norm.finalize_state()


def build(
    app_name: str,
    num_classes: int,
    image_size: int,
    small_input: bool = False,
    drop_path_rate: float = -1.0,
) -> keras.Model:
    """A keras.applications backbone (no weights: machines are offline) with tfgpu's head.

    ``small_input`` makes the stem stride 1 (see _SMALL_STEMS); layers and weights are the same.
    ``drop_path_rate``: EfficientNets' stochastic depth (-1: Keras' 0.2; DenseNets have none).
    """
    family = _family(app_name)
    shape = (image_size, image_size, 3)
    backbone = getattr(keras.applications, app_name)(
        include_top=False, weights=None, input_shape=shape, pooling="avg"
    )
    backbone = _rebuilt(backbone, family, small_input, drop_path_rate)
    if family == "EfficientNetB":
        _set_imagenet_stats(backbone)
    inputs = keras.Input(shape, name="image")
    x = layers_.normalize(inputs) if family == "DenseNet" else inputs
    return keras.Model(inputs, layers_.head(backbone(x), num_classes), name=app_name.lower())
