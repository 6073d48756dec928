"""The model registry: a small dict of builders, name -> keras.Model.

Every model takes float pixels in [0, 255], channels-last (NHWC: the layout cuDNN's fast
mixed-precision kernels and XLA prefer on GPUs, and what tf.data produces), and returns float32
logits; normalization is inside the model, so an exported model needs no tfgpu code around it.
Builders take (num_classes, image_size, small_input); ``small_input`` is a stem for 32x32 data.
ResNets are built here (keras.applications has no basic-block or v1.5 ResNet); DenseNets and
EfficientNets come from keras.applications without weights (the machines are offline), and
``--init_weights`` loads a local file instead (``load_initial_weights``).
"""

import functools
import os

import keras
from keras import layers

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_VAR = ((0.229 * 255) ** 2, (0.224 * 255) ** 2, (0.225 * 255) ** 2)


def _normalize(x):
    return layers.Normalization(mean=IMAGENET_MEAN, variance=IMAGENET_VAR, name="normalize")(x)


def _head(x, num_classes: int):
    # Logits stay float32 under mixed precision, so the softmax and loss are computed exactly.
    return layers.Dense(num_classes, dtype="float32", name="logits")(x)


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


def _small_stem(backbone: keras.Model, family: str) -> keras.Model:
    """Rebuilds a functional ``backbone`` from its config with the stem's stride set to 1."""
    config = backbone.get_config()
    changes = _SMALL_STEMS[family]
    for layer in config["layers"]:
        layer["config"].update(changes.get(layer["config"]["name"], {}))
    return keras.Model.from_config(config)


def _set_imagenet_stats(backbone: keras.Model) -> None:
    """EfficientNet v1: fills its Normalization layer (after Rescaling(1/255)) with ImageNet
    mean/variance; without ImageNet weights Keras leaves it at mean 0, variance 1."""
    (norm,) = [layer for layer in backbone.layers if isinstance(layer, layers.Normalization)]
    norm.adapt_mean.assign([m / 255 for m in IMAGENET_MEAN])
    norm.adapt_variance.assign([v / 255**2 for v in IMAGENET_VAR])
    norm.finalize_state()


def _from_applications(
    app_name: str, num_classes: int, image_size: int, small_input: bool = False
) -> keras.Model:
    """A keras.applications backbone (no weights: machines are offline) with tfgpu's head.

    ``small_input`` makes the stem stride 1 (see _SMALL_STEMS); layers and weights are the same.
    """
    family = _family(app_name)
    shape = (image_size, image_size, 3)
    backbone = getattr(keras.applications, app_name)(
        include_top=False, weights=None, input_shape=shape, pooling="avg"
    )
    if small_input:
        backbone = _small_stem(backbone, family)
    if family == "EfficientNetB":
        _set_imagenet_stats(backbone)
    inputs = keras.Input(shape, name="image")
    x = _normalize(inputs) if family == "DenseNet" else inputs
    return keras.Model(inputs, _head(backbone(x), num_classes), name=app_name.lower())


def _applications(prefix: str, app_prefix: str, suffixes) -> dict:
    return {
        f"{prefix}{s.lower()}": functools.partial(_from_applications, f"{app_prefix}{s}")
        for s in suffixes
    }


MODELS = {
    "tiny_cnn": build_tiny_cnn,
    "resnet18": functools.partial(build_resnet, depths=(2, 2, 2, 2), block="basic"),
    "resnet34": functools.partial(build_resnet, depths=(3, 4, 6, 3), block="basic"),
    "resnet50": functools.partial(build_resnet, depths=(3, 4, 6, 3), block="bottleneck"),
    "resnet101": functools.partial(build_resnet, depths=(3, 4, 23, 3), block="bottleneck"),
    "resnet152": functools.partial(build_resnet, depths=(3, 8, 36, 3), block="bottleneck"),
    **_applications("densenet", "DenseNet", ("121", "169", "201")),
    **_applications("efficientnet_", "EfficientNet", [f"B{i}" for i in range(8)]),
    **_applications("efficientnetv2_", "EfficientNetV2", ("B0", "B1", "B2", "B3", "S", "M", "L")),
}


def build_model(name: str, num_classes: int, image_size: int, small_input: bool = False):
    """Builds registry model ``name`` (NHWC float [0, 255] in, float32 logits out) under the
    current mixed-precision policy; raises KeyError naming the choices for an unknown name."""
    if name not in MODELS:
        raise KeyError(f"--model={name!r} is unknown; choose from {', '.join(sorted(MODELS))}")
    if keras.config.image_data_format() != "channels_last":
        # Every builder and the input pipeline are NHWC; channels-first would silently mismatch.
        raise ValueError("tfgpu models are channels-last: set image_data_format to channels_last")
    return MODELS[name](num_classes=num_classes, image_size=image_size, small_input=small_input)


def load_initial_weights(model: keras.Model, path: str) -> list[str]:
    """Loads ``--init_weights`` into ``model``; returns the names of the layers left as built.

    A ``.weights.h5`` file must fit exactly (same model and classes). A ``.keras`` file
    (loaded with safe_mode) may differ in its ``logits`` layer only, e.g. another number of
    classes for fine-tuning; that layer then keeps its fresh initialization. Any other
    mismatch, or a missing file, raises ConfigError with a one-line message.
    """
    from tfgpu.config import ConfigError  # here: config.py imports this module

    flag = f"--init_weights={path}"
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise ConfigError(f"{flag}: no such file")
    try:
        if path.endswith(".weights.h5"):
            model.load_weights(path)
            return []
        if path.endswith(".keras"):
            source = keras.saving.load_model(path, compile=False, safe_mode=True)
            return _copy_weights(source, model)
    except (ValueError, OSError, TypeError) as err:
        first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ConfigError(f"{flag} does not fit model {model.name!r}: {first}") from None
    raise ConfigError(f"{flag}: expected a .weights.h5 or .keras file")


def _copy_weights(source: keras.Model, model: keras.Model) -> list[str]:
    """Copies ``source``'s weights into ``model`` in order (same builder = same order)."""
    if len(source.weights) != len(model.weights):
        raise ValueError(
            f"it holds {len(source.weights)} weight tensors, the model {len(model.weights)} "
            f"(saved model {source.name!r})"
        )
    skipped = set()
    for src, dst in zip(source.weights, model.weights):
        if tuple(src.shape) == tuple(dst.shape):
            dst.assign(src.value)
        elif dst.path.startswith("logits/"):
            skipped.add("logits")
        else:
            raise ValueError(
                f"{dst.path} has shape {tuple(dst.shape)}, the file {tuple(src.shape)}"
            )
    return sorted(skipped)
