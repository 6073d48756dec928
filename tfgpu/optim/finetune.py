"""Fine-tuning controls: the backbone unfrozen after N updates (``--unfreeze_after_steps``)
and learning rates per block (``--backbone_lr_multiplier``, ``--layer_lr_decay``).

**Blocks and depth.** A registry model's trainable layers are split into blocks by their
names (``BLOCK_RULES``), counted from the head: the head (``logits``) is depth 0, the block
just before it depth 1, and so on down to the stem:

- EfficientNet and EfficientNetV2 (keras.applications' names): ``top`` (top_conv, top_bn),
  ``blockN`` .. ``block1``, ``stem`` (stem_conv, stem_bn);
- DenseNet: ``conv5`` (the last dense block and the final ``bn``), ``conv4`` (dense block 3
  and its transition ``pool4``) .. ``conv2``, ``conv1`` (the stem);
- ResNet (tfgpu's): ``stage4`` .. ``stage1``, ``stem``.

A backbone variable at depth d trains with ``lr * M * D**d`` (M: --backbone_lr_multiplier,
D: --layer_lr_decay), the head with ``lr``.

**How.** Keras 3 optimizers have one learning rate for every variable. Scaling a variable's
gradient instead is equivalent for plain SGD only: Adam, AdamW and Lamb normalize the
gradient's scale away, and decoupled weight decay does not see it. So each group of variables
(the head; one per depth, or the whole backbone when D is 1) gets an optimizer of its own
(``GroupedOptimizer``), built with the run's optimizer settings and ``lr * m``: its update is
that of an optimizer at ``lr * m``, weight decay included. Every group follows the head's
schedule, read at the head's update count, so warmup and decay stay in step whatever a group
has done. (Scaling each variable's update after one optimizer's step, ``v + m * (v_opt - v)``,
is exact too, but would keep one update count for Adam's bias correction, see below, and feed
the unscaled step to the EMA.)

**Unfreezing.** The groups' optimizers are built at the start on all their variables, frozen
ones too, in the backend's scope, so their slots exist from the first checkpoint on, with the
same layout before and after the unfreeze (exact resume on either side). A frozen group's
optimizer is not applied, so its update count stays 0 until the unfreeze: Adam's moments then
start from zero with their bias correction counted from there, as for an optimizer made at that
point. With one optimizer, the backbone's moments would start from zero with a correction
meant for N updates: for a steady gradient, Adam's steps then reach 3.4x the learning rate
(N=300) to 6.6x (N=5,000) over the next dozen updates, where a pretrained backbone wants small
ones. At the loop boundary after update N, ``Unfreeze`` (``actions.py``) makes the backbone
trainable and the step traces anew for it (``TrainStep.trainable_changed``).

These settings are checked before TensorFlow starts, against the model registry
(``models.check_finetune``).
"""

import re

import tensorflow as tf

from tfgpu import optim
from tfgpu.models import MODELS, backbone, pretrained
from tfgpu.models.layers import batchnorm_layers, batchnorm_statistics
from tfgpu.optim import lookahead

# Family -> rules (pattern on a layer's name, its block's place counted from the input, label).
# A place of None is the number the pattern matched; places rank blocks, from the stem (0).
BLOCK_RULES = {
    "EfficientNetB": ((r"stem_", 0, "stem"), (r"block(\d+)", None, "block"), (r"top_", 99, "top")),
    "DenseNet": ((r"(?:conv|pool)(\d)_", None, "conv"), (r"bn$", 5, "conv5")),
    "ResNet": ((r"stem_", 0, "stem"), (r"stage(\d+)_", None, "stage")),
}
BLOCK_RULES["EfficientNetV2"] = BLOCK_RULES["EfficientNetB"]
HEAD = "logits"


def _block(family: str, layer_name: str):
    """(place from the input, label) of the block a layer belongs to, or None."""
    for pattern, place, label in BLOCK_RULES[family]:
        match = re.match(pattern, layer_name)
        if match:
            number = int(match.group(1)) if place is None else place
            return number, f"{label}{number}" if place is None else label
    return None


def backbone_blocks(model) -> list[tuple[str, list]]:
    """[(label, variables)] of ``model``'s blocks before the head, from the head's side
    (depth 1 first). Takes a model not yet frozen (a frozen layer lists no trainable weights);
    a trainable layer in no block is a ValueError (a family ``BLOCK_RULES`` does not know)."""
    backbone = pretrained.backbone_of(model)
    family = pretrained.family_of(backbone.name) if backbone else "ResNet"
    layers = backbone.layers if backbone else [x for x in model.layers if x.name != HEAD]
    blocks: dict = {}
    for layer in layers:
        if not layer.trainable_weights:
            continue
        found = _block(family, layer.name)
        if found is None:
            raise ValueError(f"layer {layer.name!r} of {model.name} is in no block ({family})")
        blocks.setdefault(found, []).extend(layer.trainable_weights)
    return [(label, variables) for (_, label), variables in sorted(blocks.items(), reverse=True)]


def lr_groups(o, m, model) -> list[tuple[str, float, list]] | None:
    """[(label, learning-rate multiplier, variables)] of the optimizer groups of ``model``
    under ``o`` (an optim.config.OptimConfig) and ``m`` (its models.config.ModelConfig), the
    head's first (x1); None when one optimizer does (no fine-tuning flag set and
    --batchnorm_lr_multiplier 1: the plain path). With --batchnorm_lr_multiplier=M, each
    group's BatchNorm offsets and scales form a group of their own at M times its rate."""
    groups = _block_groups(o, m, model)
    multiplier = o.batchnorm_lr_multiplier
    if multiplier == 1.0:
        return groups
    if groups is None:
        groups = [("weights", 1.0, list(model.trainable_variables))]
    return _batchnorm_apart(groups, model, multiplier)


def _batchnorm_apart(groups: list, model, multiplier: float) -> list:
    """``groups`` with the BatchNorm offsets and scales of each moved into a group of their
    own ("<label>/batchnorm", at ``multiplier`` x the group's rate), after all the others
    (the first group stays the head's); groups left empty are dropped."""
    ids = {id(v) for bn in batchnorm_layers(model) for v in (bn.gamma, bn.beta) if v is not None}
    rest, apart = [], []
    for label, rate, variables in groups:
        rest.append((label, rate, [v for v in variables if id(v) not in ids]))
        apart.append(
            (f"{label}/batchnorm", rate * multiplier, [v for v in variables if id(v) in ids])
        )
    return [group for group in rest + apart if group[2]]


def _block_groups(o, m, model) -> list[tuple[str, float, list]] | None:
    """``lr_groups``' groups of the fine-tuning flags (the head, the backbone or its blocks),
    or None when none is set."""
    unfreeze, decay, scale = m.unfreeze_after_steps, o.layer_lr_decay, o.backbone_lr_multiplier
    if not unfreeze and decay == 1.0 and scale == 1.0:
        return None
    if m.name not in MODELS:  # one's own: its head, and one group for the rest
        head_variables, rest = backbone.head_and_rest(model, m)
        return [(HEAD, 1.0, head_variables), ("backbone", scale, rest)]
    head = [(HEAD, 1.0, list(model.get_layer(HEAD).trainable_weights))]
    blocks = backbone_blocks(model)
    if decay == 1.0:  # one multiplier for the whole backbone: one group
        return head + [("backbone", scale, [v for _, group in blocks for v in group])]
    return head + [
        (label, scale * decay**depth, group) for depth, (label, group) in enumerate(blocks, 1)
    ]


class _Groups:
    """The model's variables of each group (a plain object: tf.Module would track them, and
    they are the model's, checkpointed there)."""

    def __init__(self, groups: list):
        self.variables = [list(g) for g in groups]
        self.index = {id(v): i for i, g in enumerate(self.variables) for v in g}


class GroupedOptimizer(tf.Module):
    """Keras optimizers as one, each updating its group of variables (module docstring). The
    first is the head's (the run's schedule); ``learning_rate``, ``iterations`` and
    ``use_ema`` are its. ``optimizers`` lists them (``compat`` reaches into each)."""

    def __init__(self, optimizers: list, groups: list, labels: list, multipliers: list):
        super().__init__(name="grouped_optimizer")
        self.optimizers = list(optimizers)
        self._groups = _Groups(groups)
        self.labels, self.multipliers = tuple(labels), tuple(multipliers)

    @property
    def learning_rate(self):
        return self.optimizers[0].learning_rate

    @property
    def iterations(self):
        return self.optimizers[0].iterations

    @property
    def use_ema(self) -> bool:
        return self.optimizers[0].use_ema

    @property
    def variables(self) -> list:
        """Every group optimizer's variables (what a checkpoint broadcast sends)."""
        return [v for opt in self.optimizers for v in opt.variables]

    def check_known(self, variables) -> None:
        """Raises ValueError naming a variable that is in no group."""
        unknown = [v.path for v in variables if id(v) not in self._groups.index]
        if unknown:
            raise ValueError(f"{unknown[0]} is in no optimizer group")

    def build(self, variables) -> None:
        """Builds every group's optimizer on all its variables, those not trained yet (a
        frozen backbone's) too: ``variables``, what trains now, must be among them."""
        self.check_known(variables)
        for opt, group in zip(self.optimizers, self._groups.variables):
            opt.build(group)

    def apply(self, grads, variables) -> None:
        """Hands each (gradient, variable) pair to its group's optimizer; a group with no
        pair (frozen) is not applied, and its update count stays where it is."""
        pairs: list = [[] for _ in self.optimizers]
        for grad, var in zip(grads, variables):
            pairs[self._groups.index[id(var)]].append((grad, var))
        # The head's last: the others' learning rate reads its schedule at its update count,
        # which its own apply then advances.
        for opt, group in reversed(list(zip(self.optimizers, pairs))):
            if group:
                opt.apply([g for g, _ in group], [v for _, v in group])


def run_optimizer(o, m, model, global_batch_size: int, total_steps: int):
    """The optimizer of ``model`` under ``o`` (an optim.config.OptimConfig) and ``m`` (its
    models.config.ModelConfig: the fine-tuning groups follow its freeze), its schedule over
    ``total_steps`` updates of ``global_batch_size``: ``optim.build_for_run``'s, or a
    GroupedOptimizer when groups of learning rates are asked for (``lr_groups``); each with
    lookahead (--lookahead_steps). Made, not built (the train step, or
    ``checkpoint.network.load``, builds it). Call it before the backbone is frozen."""
    # BatchNorm's moving statistics (--ema_batchnorm, lookahead) are averaged by the head's
    # optimizer, the one applied at every update.
    extra = batchnorm_statistics(model) if o.ema_batchnorm else ()
    head = optim.build_for_run(o, global_batch_size, total_steps, ema_extra=extra)
    groups = lr_groups(o, m, model)
    optimizers = [head]
    for _, multiplier, _ in (groups or [None])[1:]:
        rate = lambda m=multiplier: head.learning_rate * m  # noqa: E731 (the head's schedule, now)
        optimizers.append(optim.build_optimizer(o.name, rate, **optim.optimizer_options(o)))
    if o.lookahead_steps:
        for i, member in enumerate(optimizers):
            statistics = batchnorm_statistics(model) if i == 0 else ()
            lookahead.with_lookahead(
                member,
                every=o.lookahead_steps,
                decay=o.lookahead_decay,
                total_steps=total_steps,
                extra=statistics,
            )
    if groups is None:
        return head
    labels, multipliers, variables = zip(*groups)
    return GroupedOptimizer(optimizers, list(variables), list(labels), list(multipliers))


def describe(optimizer, o, m, total_steps: int) -> str:
    """The start-up lines of the learning-rate groups of ``optimizer`` (``run_optimizer``'s
    under ``o``, the optimizer's settings, and ``m``, the model's: when the backbone
    unfreezes, --unfreeze_after_steps, in a run of ``total_steps`` updates) and of lookahead
    ("" when neither)."""
    ahead = lookahead.describe(o.lookahead_steps, o.lookahead_decay) if o.lookahead_steps else ""
    if not isinstance(optimizer, GroupedOptimizer):
        return ahead
    rates = ", ".join(
        f"{label} x{m:.3g}" for label, m in zip(optimizer.labels, optimizer.multipliers)
    )
    n = m.unfreeze_after_steps
    tuning = n or o.layer_lr_decay != 1.0 or o.backbone_lr_multiplier != 1.0
    line = f"{'fine-tune: ' if tuning else ''}learning rate {rates}"
    if n and n < total_steps:
        line += f"; the backbone trains from update {n + 1} on (--unfreeze_after_steps={n})"
    elif n:
        line += f"; --unfreeze_after_steps={n} is not before the last update: it stays frozen"
    return "\n".join(x for x in (line, ahead) if x)


def unfreeze(model, m, step) -> None:
    """Makes the backbone of ``model`` (built for ``m``, the run's models.config.ModelConfig:
    a registry model's backbone, or what --head_layers left frozen in a model of one's own)
    trainable, its BatchNorm layers back in training mode, and has ``step`` (its
    ``TrainStep``) follow (``TrainStep.trainable_changed``). The step's optimizer has known
    its variables since the start (``GroupedOptimizer.build``)."""
    backbone.unfreeze(model, m)
    step.optimizer.check_known(model.trainable_variables)
    step.trainable_changed()
