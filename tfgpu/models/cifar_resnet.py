"""The CIFAR ResNets of He et al. 2016 (§4.2): resnet20, 32, 44, 56 and 110.

A 3x3 convolution of 16 filters, then three stages of n basic blocks (16, 32 and 64 filters,
the last two starting with stride 2), global average pooling and the classifier: 6n + 2
layers. Shortcuts are the paper's option A, parameter-free: an identity that, where a stage
starts, takes every second pixel and adds zero channels. So the parameter counts are the
paper's (0.27M, 0.46M, 0.66M, 0.85M, 1.7M) and ``tests/models/test_models.py`` holds them to it.
Built from Keras' own layers only, so a saved ``.keras`` file loads without tfgpu.
"""

import keras
from keras import layers

from tfgpu.models import layers as layers_

WIDTHS = (16, 32, 64)


def _conv_bn(x, filters, strides, name):
    x = layers_.conv(x, filters, 3, strides, name + "_conv")
    return layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=name + "_bn")(x)


def _shortcut_a(x, filters, strides, name):
    """Option A: subsample by ``strides`` and pad the channels with zeros up to ``filters``."""
    if strides > 1:
        x = layers.MaxPooling2D(1, strides=strides, name=name + "_subsample")(x)
    extra = filters - x.shape[-1]
    if extra <= 0:
        return x
    # Zeros of x's own shape (Rescaling by 0), concatenated: the channels the paper pads.
    if extra != x.shape[-1]:
        raise ValueError(f"option-A shortcuts double the width: {x.shape[-1]} -> {filters}")
    zeros = layers.Rescaling(0.0, name=name + "_zeros")(x)
    return layers.Concatenate(name=name + "_pad")([x, zeros])


def _block(x, filters, strides, name):
    y = layers.ReLU()(_conv_bn(x, filters, strides, name + "_1"))
    y = _conv_bn(y, filters, 1, name + "_2")
    return layers.ReLU()(layers.Add()([_shortcut_a(x, filters, strides, name), y]))


def build(num_classes: int, image_size: int, small_input: bool = True, depth: int = 20):
    """ResNet-``depth`` (depth = 6n + 2) for small images; ``small_input`` is ignored (the
    family is built for 32x32-scale data)."""
    del small_input
    n = (depth - 2) // 6
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = layers.ReLU()(_conv_bn(layers_.normalize(inputs), WIDTHS[0], 1, "stem"))
    for stage, filters in enumerate(WIDTHS):
        for i in range(n):
            strides = 2 if i == 0 and stage > 0 else 1
            x = _block(x, filters, strides, f"stage{stage + 1}_block{i + 1}")
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers_.head(x, num_classes), name=f"resnet{depth}")
