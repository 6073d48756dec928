"""What ``--freeze=backbone`` freezes and ``--unfreeze_after_steps`` trains again, for every
model: a registry model's keras.applications backbone (``pretrained.backbone_of``), and for a
model of the user's own (``foreign.py``) every layer with weights but its head: the layers
--head_layers names, else the last layer with weights. A KerasHub model's head is tfgpu's
``logits`` layer, its backbone the KerasHub Backbone.

A frozen layer's variables are not trained, and Keras runs a non-trainable BatchNorm in
inference mode (``batchnorm.moving_statistics`` leaves its statistics out).
"""

import keras

from tfgpu.errors import ConfigError
from tfgpu.models import MODELS, own, pretrained


def _network(model, spec: own.Own):
    """The layers' owner whose last one is the head: the user's network nested in the model
    ``foreign.build`` made, or for a KerasHub model that model itself (backbone, logits)."""
    if spec.kind in ("hub_arch", "hub_preset"):
        return model
    nested = [layer for layer in model.layers if isinstance(layer, keras.Model)]
    return nested[0] if len(nested) == 1 else model


def parts(model, m) -> tuple[list, list]:
    """(backbone layers, head layers) of ``model`` built for ``m`` (the run's ModelConfig,
    a model of the user's own); a ConfigError names a --head_layers entry not found."""
    spec = own.parse(m.name)
    network = _network(model, spec)
    weighted = [layer for layer in network.layers if layer.weights]
    names = [n.strip() for n in m.head_layers.split(",") if n.strip()] or [weighted[-1].name]
    known = {layer.name for layer in weighted}
    missing = [n for n in names if n not in known]
    if missing:
        shown = ", ".join(layer.name for layer in weighted[-8:])
        raise ConfigError(
            f"--head_layers: {spec.flag} has no layer {missing[0]!r} with weights among its "
            f"own (the last ones: {shown})"
        )
    head = [layer for layer in weighted if layer.name in names]
    return [layer for layer in weighted if layer.name not in names], head


def freeze(model, m) -> str:
    """--freeze=backbone on ``model`` (built for ``m``, the run's ModelConfig); returns the
    words of the start line saying what trains."""
    if m.name in MODELS:
        pretrained.freeze_backbone(model)
        return "backbone frozen (its BatchNorm in inference mode), training the head only"
    frozen, head = parts(model, m)
    for layer in frozen:
        layer.trainable = False
    return (
        f"{len(frozen)} layer(s) frozen (BatchNorm in inference mode), training "
        f"{', '.join(layer.name for layer in head)} only"
    )


def unfreeze(model, m) -> None:
    """--unfreeze_after_steps: the layers ``freeze`` froze train again."""
    if m.name in MODELS:
        pretrained.backbone_of(model).trainable = True
        return
    for layer in parts(model, m)[0]:
        layer.trainable = True


def head_and_rest(model, m) -> tuple[list, list]:
    """(the head's trainable variables, every other trainable variable) of a model of the
    user's own, taken before it is frozen: the learning-rate groups of fine-tuning."""
    head = {id(v) for layer in parts(model, m)[1] for v in layer.trainable_weights}
    variables = model.trainable_variables
    return [v for v in variables if id(v) in head], [v for v in variables if id(v) not in head]
