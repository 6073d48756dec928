"""airbench's network (Keller Jordan's cifar10-airbench, ``airbench94.py``): the fastest known
small-image trainer's shape, for 28-32 px data.

A frozen patch-whitening convolution (``whitening.py``: 2 x 2, initialised from the training
data) and GELU, then one "conv group" per width: a 3 x 3 convolution, a 2 x 2 max-pool,
BatchNorm, GELU, a second 3 x 3 convolution, BatchNorm, GELU. BatchNorm has no scale (its
offset trains; airbench gives it a 64x learning rate: ``--batchnorm_lr_multiplier``) and a
fast momentum (0.6, to go with lookahead: ``--lookahead_steps``); the convolutions have no
bias. A global max-pool, then the logits, scaled down (x 1/9: the logits layer's input, so
its output starts small and the softmax soft). Built from Keras' own layers only, so a saved
``.keras`` file loads without tfgpu. airbench's identity initialisation of the convolutions
is ``--dirac_init`` (``layers.dirac_init``), a flag of every model.
"""

import keras
from keras import layers

from tfgpu.models import layers as layers_
from tfgpu.models import whitening


def _conv_group(x, filters: int, momentum: float, activation: str, name: str):
    for i in (1, 2):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv{i}")(x)
        if i == 1:
            x = layers.MaxPooling2D(2, name=f"{name}_pool")(x)
        bn = layers.BatchNormalization(
            momentum=momentum, epsilon=1e-5, scale=False, name=f"{name}_bn{i}"
        )
        x = layers.Activation(activation, name=f"{name}_act{i}")(bn(x))
    return x


def build(
    num_classes: int,
    image_size: int,
    small_input: bool = True,
    widths=(64, 256, 256),
    whiten_kernel: int = 2,
    whiten_components: int = 12,
    batchnorm_momentum: float = 0.6,
    logit_scale: float = 1 / 9,
    activation: str = "gelu",
) -> keras.Model:
    """airbench's network with conv groups of ``widths``, a ``whiten_kernel`` squared
    whitening of ``whiten_components`` directions (x2 filters: ``whitening.py``); the family is
    built for 28-32 px data: ``small_input`` is ignored."""
    del small_input
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = layers.Conv2D(
        2 * whiten_components, whiten_kernel, padding="valid", name=whitening.NAME, trainable=False
    )(layers_.normalize(inputs))
    x = layers.Activation(activation, name="whiten_act")(x)
    for i, width in enumerate(widths):
        x = _conv_group(x, width, batchnorm_momentum, activation, f"group{i + 1}")
    x = layers.GlobalMaxPooling2D(name="pool")(x)
    x = layers.Rescaling(logit_scale, name="logit_scale")(x)
    name = "airbench" + "_".join(str(w) for w in widths)
    return keras.Model(inputs, layers_.head(x, num_classes), name=name)
