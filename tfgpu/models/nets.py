"""The networks, built with Keras: ResNets by hand (keras.applications has no basic-block or
v1.5 ResNet), tiny_cnn, and DenseNets and EfficientNets from keras.applications without
weights (the machines are offline). ``models.py`` holds the registry that names them.

Every network takes float pixels in [0, 255], channels-last (NHWC: the layout cuDNN's fast
mixed-precision kernels and XLA prefer on GPUs, and what tf.data produces), and returns float32
logits; normalization is inside the network, so an exported model needs no tfgpu code around
it. Builders take (num_classes, image_size, small_input); ``small_input`` is a stem for 32x32
data.
"""

import keras
from keras import layers

from tfgpu.constants import IMAGENET_MEAN, IMAGENET_VAR


def _normalize(x):
    return layers.Normalization(mean=IMAGENET_MEAN, variance=IMAGENET_VAR, name="normalize")(x)


def _head(x, num_classes: int):
    # Logits stay float32 under mixed precision, so the softmax and loss are computed exactly;
    # a float64 model (--dtype=float64) keeps them float64.
    wide = "float64" if keras.config.dtype_policy().name == "float64" else "float32"
    return layers.Dense(num_classes, dtype=wide, name="logits")(x)


def build_tiny_cnn(num_classes: int, image_size: int, small_input: bool = True) -> keras.Model:
    """A small CNN with no BatchNorm: every example's gradient is independent of its batch,
    which is what the exact equivalence tests (accumulation, replicas) need."""
    del small_input
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)
    for i, filters in enumerate((32, 64, 128)):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv{i}a")(x)
        x = layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv{i}b")(x)
        x = layers.MaxPooling2D(2)(x) if i < 2 else x
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, _head(x, num_classes), name="tiny_cnn")


def _bn(x, name, zero_init=False):
    return layers.BatchNormalization(
        momentum=0.9,
        epsilon=1e-5,
        gamma_initializer="zeros" if zero_init else "ones",
        name=name,
    )(x)


def _conv(x, filters, kernel, strides, name):
    return layers.Conv2D(
        filters,
        kernel,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer="he_normal",
        name=name,
    )(x)


def _shortcut(x, filters, strides, name):
    if strides == 1 and x.shape[-1] == filters:
        return x
    return _bn(_conv(x, filters, 1, strides, name + "_proj"), name + "_proj_bn")


def _basic_block(x, filters, strides, name):
    shortcut = _shortcut(x, filters, strides, name)
    y = layers.ReLU()(_bn(_conv(x, filters, 3, strides, name + "_conv1"), name + "_bn1"))
    y = _bn(_conv(y, filters, 3, 1, name + "_conv2"), name + "_bn2", zero_init=True)
    return layers.ReLU()(layers.Add()([shortcut, y]))


def _bottleneck_block(x, filters, strides, name):
    """ResNet v1.5: the stride sits in the 3x3 convolution, not the first 1x1."""
    shortcut = _shortcut(x, filters * 4, strides, name)
    y = layers.ReLU()(_bn(_conv(x, filters, 1, 1, name + "_conv1"), name + "_bn1"))
    y = layers.ReLU()(_bn(_conv(y, filters, 3, strides, name + "_conv2"), name + "_bn2"))
    y = _bn(_conv(y, filters * 4, 1, 1, name + "_conv3"), name + "_bn3", zero_init=True)
    return layers.ReLU()(layers.Add()([shortcut, y]))


def build_resnet(
    num_classes: int, image_size: int, small_input: bool = False, depths=(2, 2, 2, 2), block="basic"
) -> keras.Model:
    """ResNet-18/34 (basic blocks) or ResNet-50/101/152 v1.5 (bottlenecks).

    ``small_input`` swaps the 7x7/2 stem and max-pool for one 3x3/1 convolution (32x32 data).
    """
    block_fn = _basic_block if block == "basic" else _bottleneck_block
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = _normalize(inputs)
    if small_input:
        x = layers.ReLU()(_bn(_conv(x, 64, 3, 1, "stem_conv"), "stem_bn"))
    else:
        x = layers.ReLU()(_bn(_conv(x, 64, 7, 2, "stem_conv"), "stem_bn"))
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    for stage, depth in enumerate(depths):
        for i in range(depth):
            strides = 2 if i == 0 and stage > 0 else 1
            x = block_fn(x, 64 * 2**stage, strides, f"stage{stage + 1}_block{i + 1}")
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, _head(x, num_classes), name=f"resnet{_depth_name(depths, block)}")


def _depth_name(depths, block) -> int:
    return sum(depths) * (2 if block == "basic" else 3) + 2


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


def build_application(
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
    x = _normalize(inputs) if family == "DenseNet" else inputs
    return keras.Model(inputs, _head(backbone(x), num_classes), name=app_name.lower())


# Registry family -> builder (models.MODELS names a family and its keyword arguments).
BUILDERS = {
    "tiny_cnn": build_tiny_cnn,
    "resnet": build_resnet,
    "application": build_application,
}
