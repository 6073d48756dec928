"""Optimizers by name: small registries, and the function that builds one for a run.

No Keras at import: ``config.py`` checks ``--optimizer`` and ``--lr_schedule`` against these
registries before TensorFlow starts.
"""

import math

from tfgpu import compat

# --optimizer -> (keras.optimizers class, or tfgpu's own in optim/<module>.py, its fixed
# arguments).
OPTIMIZERS = {
    "sgd": ("SGD", {"nesterov": False}),
    "nesterov": ("SGD", {"nesterov": True}),
    "adam": ("Adam", {}),
    "adamw": ("AdamW", {}),
    "lamb": ("Lamb", {}),
    "lars": ("lars.LARS", {}),
}
SCHEDULES = ("constant", "cosine", "linear", "poly", "step")  # schedules.WarmupDecay's decays
LR_SCALINGS = ("none", "linear", "sqrt")  # --lr_scaling: the rate's factor of global / base
LOSSES = ("cross_entropy", "bce")  # --loss: step/losses.py
# BatchNorm scales/offsets and biases are not decayed (Goyal et al. 2017, "no bias decay").
NO_DECAY = ["bias", "gamma", "beta"]


def patterns(text: str) -> list[str]:
    """The regular expressions of a comma-separated setting, empty ones left out."""
    return [p.strip() for p in text.split(",") if p.strip()]


def scaled_learning_rate(
    base_lr: float, global_batch_size: int, scaling: str = "none", base_batch_size: int = 256
) -> float:
    """``base_lr`` (the rate of a batch of ``base_batch_size``) at ``global_batch_size``:
    as it is (none), times the ratio (linear: Goyal et al. 2017) or its square root (sqrt:
    Krizhevsky 2014, timm's rule for adaptive optimizers)."""
    ratio = global_batch_size / base_batch_size
    return base_lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[scaling]


def lr_scaling_of(o) -> tuple[str, int]:
    """(rule, base batch) of ``o`` (a config.OptimConfig): --scale_lr_with_batch is linear
    from 256."""
    return ("linear", 256) if o.scale_lr_with_batch else (o.lr_scaling, o.base_batch_size)


def run_learning_rate(o, global_batch_size: int) -> float:
    """The peak learning rate a run of ``o`` uses at ``global_batch_size``."""
    return scaled_learning_rate(o.learning_rate, global_batch_size, *lr_scaling_of(o))


def describe_learning_rate(o, global_batch_size: int) -> str:
    """The start-up line of a scaled learning rate ("" when --learning_rate is used as is)."""
    rule, base = lr_scaling_of(o)
    if rule == "none":
        return ""
    rate = run_learning_rate(o, global_batch_size)
    return (
        f"learning rate: {rate:.6g} at the global batch {global_batch_size} (--learning_rate="
        f"{o.learning_rate:g} for a batch of {base}, scaled {rule})"
    )


def optimizer_options(o) -> dict:
    """``build_optimizer``'s keyword arguments for the run's settings ``o``."""
    return dict(
        momentum=o.momentum,
        weight_decay=o.weight_decay,
        ema_decay=o.ema_decay,
        ema_warmup=o.ema_warmup,
        eeta=o.lars_eeta,
        lars_no_decay=patterns(o.lars_exclude_from_decay),
        lars_no_adaptation=patterns(o.lars_exclude_from_adaptation),
    )


def build_optimizer(
    name: str,
    learning_rate,
    *,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    ema_decay: float = 0.0,
    ema_warmup: bool = False,
    ema_extra=(),
    eeta: float = 0.001,
    lars_no_decay=tuple(NO_DECAY),
    lars_no_adaptation=tuple(NO_DECAY),
):
    """A Keras optimizer by registry name; decay skips BatchNorm and bias variables (lars:
    those matching ``lars_no_decay``). With ``ema_decay``, it keeps an average of the weights,
    warmed up with ``ema_warmup`` and of ``ema_extra`` (BatchNorm's moving statistics) too."""
    import keras

    class_name, fixed = OPTIMIZERS[name]
    ema = dict(use_ema=True, ema_momentum=ema_decay) if ema_decay else {}
    if class_name == "lars.LARS":
        from tfgpu.optim.lars import LARS  # noqa: PLC0415  (TensorFlow: config/ reads this package before it starts; test_imports)

        optimizer = LARS(
            learning_rate,
            momentum=momentum,
            weight_decay_rate=weight_decay,
            eeta=eeta,
            exclude_from_weight_decay=list(lars_no_decay),
            exclude_from_layer_adaptation=list(lars_no_adaptation),
            **ema,
        )
    else:
        kwargs = dict(fixed, weight_decay=weight_decay or None, **ema)
        if class_name == "SGD":
            kwargs["momentum"] = momentum
        if class_name == "AdamW":
            kwargs["weight_decay"] = weight_decay  # AdamW's own default would be 0.004
        optimizer = getattr(keras.optimizers, class_name)(learning_rate, **kwargs)
        if weight_decay:
            optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    if ema_decay and (ema_warmup or ema_extra):
        compat.average_more(optimizer, warmup=ema_warmup, extra=list(ema_extra))
    return optimizer


def build_for_run(optim, global_batch_size: int, total_steps: int, ema_extra=()):
    """The optimizer ``optim`` (a config.OptimConfig) asks for, with its warmup-and-decay
    schedule over ``total_steps`` updates; ``ema_extra``: variables its weight average
    covers beside the trained ones (``models.layers.batchnorm_statistics``)."""
    from tfgpu.optim.schedules import WarmupDecay  # noqa: PLC0415  (TensorFlow: config/ reads this package before it starts; test_imports)

    lr = run_learning_rate(optim, global_batch_size)
    schedule = WarmupDecay(
        lr, total_steps, optim.warmup_steps, optim.lr_schedule, power=optim.lr_poly_power
    )
    return build_optimizer(optim.name, schedule, ema_extra=ema_extra, **optimizer_options(optim))
