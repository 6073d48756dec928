"""Optimizers by name: small registries, and the function that builds one for a run.

No Keras at import: ``config.py`` checks ``--optimizer`` and ``--lr_schedule`` against these
registries before TensorFlow starts.
"""

# --optimizer -> (keras.optimizers class, its fixed arguments).
OPTIMIZERS = {
    "sgd": ("SGD", {"nesterov": False}),
    "nesterov": ("SGD", {"nesterov": True}),
    "adam": ("Adam", {}),
    "adamw": ("AdamW", {}),
    "lamb": ("Lamb", {}),
}
SCHEDULES = ("constant", "cosine", "linear", "step")  # schedules.WarmupDecay's decays
# BatchNorm scales/offsets and biases are not decayed (Goyal et al. 2017, "no bias decay").
NO_DECAY = ["bias", "gamma", "beta"]


def scaled_learning_rate(base_lr: float, global_batch_size: int, scale_with_batch: bool) -> float:
    """The linear scaling rule: ``base_lr * global_batch / 256`` when asked for."""
    return base_lr * global_batch_size / 256 if scale_with_batch else base_lr


def build_optimizer(
    name: str,
    learning_rate,
    *,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    ema_decay: float = 0.0,
):
    """A Keras optimizer by registry name; decay skips BatchNorm and bias variables."""
    import keras

    class_name, fixed = OPTIMIZERS[name]
    kwargs = dict(fixed, weight_decay=weight_decay or None)
    if class_name == "SGD":
        kwargs["momentum"] = momentum
    if class_name == "AdamW":
        kwargs["weight_decay"] = weight_decay  # AdamW's own default would be 0.004
    if ema_decay:
        kwargs.update(use_ema=True, ema_momentum=ema_decay)
    optimizer = getattr(keras.optimizers, class_name)(learning_rate, **kwargs)
    if weight_decay:
        optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    return optimizer


def build_for_run(optim, global_batch_size: int, total_steps: int):
    """The optimizer ``optim`` (a config.OptimConfig) asks for, with its warmup-and-decay
    schedule over ``total_steps`` updates."""
    from tfgpu.optim.schedules import WarmupDecay

    lr = scaled_learning_rate(optim.learning_rate, global_batch_size, optim.scale_lr_with_batch)
    schedule = WarmupDecay(lr, total_steps, optim.warmup_steps, optim.lr_schedule)
    return build_optimizer(
        optim.name,
        schedule,
        momentum=optim.momentum,
        weight_decay=optim.weight_decay,
        ema_decay=optim.ema_decay,
    )
