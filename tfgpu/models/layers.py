"""What every network of tfgpu shares: ImageNet normalization in front, a float32 (or
float64) logits layer at the end.

Every network takes float pixels in [0, 255], channels-last (NHWC: the layout cuDNN's fast
mixed-precision kernels and XLA prefer on GPUs, and what tf.data produces), and returns float32
logits; normalization is inside the network, so an exported model needs no tfgpu code around
it. A family's ``build`` takes (num_classes, image_size, small_input) and its registry
arguments; ``small_input`` is a stem for 32x32 data. Below them, what walks a built model's
layers: its nested layers, its BatchNorms, the state its layers derive from their variables
(recomputed after a restore), --dirac_init.
"""

import keras
from keras import layers

from tfgpu import compat
from tfgpu.imagenet import IMAGENET_MEAN, IMAGENET_VAR  # noqa: F401  (tests read them here)


def normalize(x):
    return layers.Normalization(mean=IMAGENET_MEAN, variance=IMAGENET_VAR, name="normalize")(x)


def conv(x, filters: int, kernel: int, strides: int, name: str):
    """A "same"-padded convolution without bias (a BatchNorm follows or precedes it), He
    normal initialization: the ResNets' and Wide ResNets' convolution."""
    return layers.Conv2D(
        filters,
        kernel,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer="he_normal",
        name=name,
    )(x)


def head(x, num_classes: int):
    # Logits stay float32 under mixed precision, so the softmax and loss are computed exactly;
    # a float64 model (--dtype=float64) keeps them float64.
    wide = "float64" if keras.config.dtype_policy().name == "float64" else "float32"
    return layers.Dense(num_classes, dtype=wide, name="logits")(x)


def nested_layers(model) -> list:
    """``model``, its layers and those of its nested models and layers, once each, in order
    (a layer before its own): a subclassed model's blocks (plain Layers holding a BatchNorm)
    are looked into as nested models are."""
    found, seen = [], set()

    def walk(layer):
        if id(layer) in seen:
            return
        seen.add(id(layer))
        found.append(layer)
        for sub in compat.sublayers(layer):
            walk(sub)

    walk(model)
    return found


def refresh_derived_state(model) -> None:
    """After ``model``'s variables were restored or assigned: Keras layers that compute with
    tensors derived from their variables recompute them (``finalize_state``: EfficientNet's
    Normalization keeps its mean and variance as constants made from its variables). Keras'
    own loaders do this; tf.train.Checkpoint does not, and the layer would go on using the
    values it was built with."""
    for layer in nested_layers(model):
        finalize = getattr(layer, "finalize_state", None)
        if callable(finalize):
            finalize()


def batchnorm_layers(model) -> list:
    """Every BatchNormalization layer in ``model`` and its nested models, once each, in order."""
    return [layer for layer in nested_layers(model) if isinstance(layer, layers.BatchNormalization)]


def batchnorm_statistics(model) -> list:
    """The moving means and variances of every BatchNormalization layer of ``model`` and its
    nested models, once each (what --ema_batchnorm averages)."""
    return [v for bn in batchnorm_layers(model) for v in (bn.moving_mean, bn.moving_variance)]


def dirac_init(model) -> int:
    """Identity (Dirac) initialisation, airbench's: in every trainable ``Conv2D`` of ``model``
    (nested models too) with an odd kernel and one group, the first min(C_in, C_out) filters
    become identities (filter i passes input channel i through at the kernel's centre), as
    ``torch.nn.init.dirac_`` on the first C_in filters; the others keep their initialization.
    Returns how many convolutions it set. Call it outside any replica context."""
    import numpy as np

    count = 0
    for layer in nested_layers(model):
        if type(layer) is not layers.Conv2D or not layer.trainable or layer.groups != 1:
            continue
        kh, kw, cin, cout = layer.kernel.shape
        if kh % 2 == 0 or kw % 2 == 0:
            continue
        kernel = keras.ops.convert_to_numpy(layer.kernel)
        n = min(cin, cout)
        kernel[:, :, :, :n] = 0.0
        kernel[kh // 2, kw // 2, np.arange(n), np.arange(n)] = 1.0
        layer.kernel.assign(kernel)
        count += 1
    return count
