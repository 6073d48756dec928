"""ResNets v1.5 by hand (keras.applications has no basic-block or v1.5 ResNet): resnet18 ...
resnet152, with the registry's ``depths`` and ``block``."""

import keras
from keras import layers

from tfgpu.models import layers as layers_


def _bn(x, name, zero_init=False):
    return layers.BatchNormalization(
        momentum=0.9,
        epsilon=1e-5,
        gamma_initializer="zeros" if zero_init else "ones",
        name=name,
    )(x)


def _shortcut(x, filters, strides, name):
    if strides == 1 and x.shape[-1] == filters:
        return x
    return _bn(layers_.conv(x, filters, 1, strides, name + "_proj"), name + "_proj_bn")


def _basic_block(x, filters, strides, name):
    shortcut = _shortcut(x, filters, strides, name)
    y = layers.ReLU()(_bn(layers_.conv(x, filters, 3, strides, name + "_conv1"), name + "_bn1"))
    y = _bn(layers_.conv(y, filters, 3, 1, name + "_conv2"), name + "_bn2", zero_init=True)
    return layers.ReLU()(layers.Add()([shortcut, y]))


def _bottleneck_block(x, filters, strides, name):
    """ResNet v1.5: the stride sits in the 3x3 convolution, not the first 1x1."""
    shortcut = _shortcut(x, filters * 4, strides, name)
    y = layers.ReLU()(_bn(layers_.conv(x, filters, 1, 1, name + "_conv1"), name + "_bn1"))
    y = layers.ReLU()(_bn(layers_.conv(y, filters, 3, strides, name + "_conv2"), name + "_bn2"))
    y = _bn(layers_.conv(y, filters * 4, 1, 1, name + "_conv3"), name + "_bn3", zero_init=True)
    return layers.ReLU()(layers.Add()([shortcut, y]))


def build(
    num_classes: int, image_size: int, small_input: bool = False, depths=(2, 2, 2, 2), block="basic"
) -> keras.Model:
    """ResNet-18/34 (basic blocks) or ResNet-50/101/152 v1.5 (bottlenecks).

    ``small_input`` swaps the 7x7/2 stem and max-pool for one 3x3/1 convolution (32x32 data).
    """
    block_fn = _basic_block if block == "basic" else _bottleneck_block
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = layers_.normalize(inputs)
    if small_input:
        x = layers.ReLU()(_bn(layers_.conv(x, 64, 3, 1, "stem_conv"), "stem_bn"))
    else:
        x = layers.ReLU()(_bn(layers_.conv(x, 64, 7, 2, "stem_conv"), "stem_bn"))
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    for stage, depth in enumerate(depths):
        for i in range(depth):
            strides = 2 if i == 0 and stage > 0 else 1
            x = block_fn(x, 64 * 2**stage, strides, f"stage{stage + 1}_block{i + 1}")
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(
        inputs, layers_.head(x, num_classes), name=f"resnet{_depth_name(depths, block)}"
    )


def _depth_name(depths, block) -> int:
    return sum(depths) * (2 if block == "basic" else 3) + 2
