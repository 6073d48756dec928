"""What a built network gets beyond its builder, for a run: ``initialize`` (a whitening
layer from the data, --dirac_init), ``any_input_size`` (--progressive_stages) and
``rematerialized`` (--remat). Keras and TensorFlow at import: the registry (``__init__``)
stays light for ``config/``, which reads it before TensorFlow starts; ``checkpoint.network``
and the trainer's conductor (``train.loop``: the model its train step runs) call these.
"""

import keras

from tfgpu.models import MODELS, layers, remat, whitening as whiten


def initialize(model, dirac: bool, sample_images, whitening: str = "data") -> list[str]:
    """Initialisations a builder cannot make alone: the whitening layer of a model that has
    one, from ``sample_images()`` (uint8 [N, S, S, 3], called only then: ``whitening.py``),
    or with ``whitening`` "trained" made an ordinary trained convolution; and ``dirac``
    (--dirac_init: identity convolutions, ``layers.dirac_init``). Returns their start-up
    lines. Call it outside any replica context, before the optimizer is built."""
    lines, layer = [], whiten.whitening_layer(model)
    if layer is not None and whitening == "trained":
        layer.trainable = True
        lines.append(f"--whitening=trained: {layer.name} trains from a random start")
    elif layer is not None:
        lines.append(whiten.initialize(model, sample_images()))
    if dirac:
        count = layers.dirac_init(model)
        lines.append(f"--dirac_init: {count} convolutions start as identities where shapes allow")
    return lines


def any_input_size(model) -> None:
    """Lets ``model`` (and every model nested in it, as keras.applications' backbones) take
    images of any side, for --progressive_stages: its layers are the same, only the input
    check built for --image_size is widened (convolutions and global pooling need no fixed
    side)."""
    model.input_spec = keras.InputSpec(shape=(None, None, None, model.input_shape[-1]))
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            any_input_size(layer)


def rematerialized(model, name: str, any_size: bool = False):
    """``model`` (built as registry model ``name``) wrapped so that its forward pass keeps only
    each block's input and the backward pass recomputes the block (``--remat``: ``remat.py``);
    it shares ``model``'s layers and variables. ``any_size``: its blocks take any image side,
    as ``any_input_size`` makes ``model``'s."""
    wrapped = remat.rematerialized(model, MODELS[name][0])
    for segment in wrapped.segments if any_size else ():
        any_input_size(segment)
    return wrapped
