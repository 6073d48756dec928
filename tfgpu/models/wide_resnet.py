"""Wide ResNets (Zagoruyko & Komodakis 2016): wrn16_4, wrn16_8, wrn28_10, wrn40_4.

WRN-d-k: a 3x3 convolution of 16 filters, three stages of (d - 4) / 6 pre-activation blocks
(BN-ReLU-conv3x3, BN-ReLU-[dropout]-conv3x3) of 16k, 32k and 64k filters (stages 2 and 3 start
with stride 2), a 1x1 projection where the width changes, then BN-ReLU, global average pooling
and the classifier: the layout of the authors' code, whose parameter counts the paper gives
(WRN-16-4 2.7M, WRN-28-10 36.5M; ``tests/models/test_models.py`` holds them).
"""

import keras
from keras import layers

from tfgpu.models import layers as layers_


def _bn_relu(x, name):
    x = layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=name + "_bn")(x)
    return layers.ReLU(name=name + "_relu")(x)


def _block(x, filters, strides, dropout, name):
    """A pre-activation block; the projection (when the width or size changes) reads the
    activated input, as in the authors' code."""
    act = _bn_relu(x, name + "_pre")
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = layers_.conv(act, filters, 1, strides, name + "_proj")
    y = layers_.conv(act, filters, 3, strides, name + "_conv1")
    y = _bn_relu(y, name + "_mid")
    if dropout:
        y = layers.Dropout(dropout, name=name + "_dropout")(y)
    y = layers_.conv(y, filters, 3, 1, name + "_conv2")
    return layers.Add(name=name + "_add")([shortcut, y])


def build(
    num_classes: int,
    image_size: int,
    small_input: bool = True,
    depth: int = 28,
    widen: int = 10,
    dropout: float = 0.0,
):
    """WRN-``depth``-``widen`` for small images (depth = 6n + 4); ``dropout`` between a
    block's convolutions (the paper's 0.3 is a recipe's choice: 0 here, as the counts
    are the same). ``small_input`` is ignored: the family is built for 32x32-scale data."""
    del small_input
    n = (depth - 4) // 6
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = layers_.conv(layers_.normalize(inputs), 16, 3, 1, "stem_conv")
    for stage in range(3):
        for i in range(n):
            strides = 2 if i == 0 and stage > 0 else 1
            x = _block(x, 16 * widen * 2**stage, strides, dropout, f"stage{stage + 1}_block{i + 1}")
    x = layers.GlobalAveragePooling2D()(_bn_relu(x, "final"))
    return keras.Model(inputs, layers_.head(x, num_classes), name=f"wrn{depth}_{widen}")
