"""Optimizers and learning-rate schedules, counted in optimizer updates (not micro-batches)."""

import math

import keras
import tensorflow as tf

OPTIMIZERS = ("sgd", "nesterov", "adam", "adamw", "lamb")
SCHEDULES = ("constant", "cosine", "linear", "step")
# BatchNorm scales/offsets and biases are not decayed (Goyal et al. 2017, "no bias decay").
NO_DECAY = ["bias", "gamma", "beta"]


@keras.saving.register_keras_serializable("tfgpu")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to ``base_lr`` over ``warmup_steps``, then cosine, linear or step decay
    to 0 at ``total_steps`` (step: x0.1 at 30%, 60% and 90% of the post-warmup steps)."""

    def __init__(self, base_lr: float, total_steps: int, warmup_steps: int = 0, decay="cosine"):
        self.base_lr = float(base_lr)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = tf.cast(self.warmup_steps, tf.float32)
        span = tf.maximum(tf.cast(self.total_steps, tf.float32) - warmup, 1.0)
        progress = tf.clip_by_value((step - warmup) / span, 0.0, 1.0)
        if self.decay == "cosine":
            factor = 0.5 * (1.0 + tf.cos(math.pi * progress))
        elif self.decay == "linear":
            factor = 1.0 - progress
        elif self.decay == "step":
            factor = 0.1 ** tf.reduce_sum(tf.cast(progress >= [0.3, 0.6, 0.9], tf.float32))
        else:
            factor = tf.constant(1.0)
        if self.warmup_steps:
            factor = tf.where(step < warmup, (step + 1.0) / warmup, factor)
        return self.base_lr * factor

    def get_config(self):
        return {
            "base_lr": self.base_lr,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
        }


def scaled_learning_rate(base_lr: float, global_batch_size: int, scale_with_batch: bool) -> float:
    """The linear scaling rule: ``base_lr * global_batch / 256`` when asked for."""
    return base_lr * global_batch_size / 256 if scale_with_batch else base_lr


def build_optimizer(
    name: str,
    learning_rate,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    ema_decay: float = 0.0,
) -> keras.optimizers.Optimizer:
    """A Keras optimizer by name; decay skips BatchNorm and bias variables."""
    common = {"weight_decay": weight_decay or None}
    if ema_decay:
        common.update(use_ema=True, ema_momentum=ema_decay)
    if name in ("sgd", "nesterov"):
        opt = keras.optimizers.SGD(
            learning_rate, momentum=momentum, nesterov=name == "nesterov", **common
        )
    elif name == "adam":
        opt = keras.optimizers.Adam(learning_rate, **common)
    elif name == "adamw":
        common["weight_decay"] = weight_decay  # AdamW's own default would be 0.004
        opt = keras.optimizers.AdamW(learning_rate, **common)
    elif name == "lamb":
        opt = keras.optimizers.Lamb(learning_rate, **common)
    else:
        raise KeyError(f"--optimizer={name!r} is unknown; choose from {', '.join(OPTIMIZERS)}")
    if weight_decay:
        opt.exclude_from_weight_decay(var_names=NO_DECAY)
    return opt
