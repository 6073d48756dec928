"""The model registry: a small dict of builders, name -> keras.Model.

Every model takes float pixels in [0, 255] (NHWC) and returns float32 logits; normalization is
its first layer, so an exported model needs no tfgpu code around it.
"""

import functools

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


def _from_applications(app_name: str, normalize: bool, num_classes: int, image_size: int, small_input=False):
    """A keras.applications backbone (no weights: machines are offline) with tfgpu's head."""
    del small_input
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = _normalize(inputs) if normalize else inputs
    backbone = getattr(keras.applications, app_name)(
        include_top=False, weights=None, input_shape=(image_size, image_size, 3), pooling="avg"
    )
    x = backbone(x)
    return keras.Model(inputs, _head(x, num_classes), name=app_name.lower())


MODELS = {
    "tiny_cnn": build_tiny_cnn,
    "resnet18": functools.partial(build_resnet, depths=(2, 2, 2, 2), block="basic"),
    "resnet34": functools.partial(build_resnet, depths=(3, 4, 6, 3), block="basic"),
    "resnet50": functools.partial(build_resnet, depths=(3, 4, 6, 3), block="bottleneck"),
    "resnet101": functools.partial(build_resnet, depths=(3, 4, 23, 3), block="bottleneck"),
    "resnet152": functools.partial(build_resnet, depths=(3, 8, 36, 3), block="bottleneck"),
}
# DenseNet expects normalized input; EfficientNets normalize inside (from [0, 255]).
MODELS.update(
    {
        f"densenet{n}": functools.partial(_from_applications, f"DenseNet{n}", True)
        for n in (121, 169, 201)
    }
)
MODELS.update(
    {
        f"efficientnet_b{i}": functools.partial(_from_applications, f"EfficientNetB{i}", False)
        for i in range(8)
    }
)
MODELS.update(
    {
        f"efficientnetv2_{v.lower()}": functools.partial(
            _from_applications, f"EfficientNetV2{v}", False
        )
        for v in ("B0", "B1", "B2", "B3", "S", "M", "L")
    }
)


def build_model(name: str, num_classes: int, image_size: int, small_input: bool = False):
    """Builds registry model ``name``; raises KeyError naming the choices for an unknown one."""
    if name not in MODELS:
        raise KeyError(f"--model={name!r} is unknown; choose from {', '.join(sorted(MODELS))}")
    return MODELS[name](num_classes=num_classes, image_size=image_size, small_input=small_input)
