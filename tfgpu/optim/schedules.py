"""The learning-rate schedule, counted in optimizer updates (not micro-batches).

A Keras object (it subclasses LearningRateSchedule), so it lives apart from ``optim.py``'s
registries, which ``config.py`` reads before TensorFlow starts.
"""

import math

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable("tfgpu")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to ``base_lr`` over ``warmup_steps``, then cosine, linear, poly or step
    decay to 0 at ``total_steps`` (poly: ``(1 - progress) ** power``, MLPerf's ResNet-50 decay
    with power 2; step: x0.1 at 30%, 60% and 90% of the post-warmup steps)."""

    def __init__(
        self,
        base_lr: float,
        total_steps: int,
        warmup_steps: int = 0,
        decay="cosine",
        power: float = 2.0,
    ):
        self.base_lr = float(base_lr)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.power = float(power)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = tf.cast(self.warmup_steps, tf.float32)
        span = tf.maximum(tf.cast(self.total_steps, tf.float32) - warmup, 1.0)
        progress = tf.clip_by_value((step - warmup) / span, 0.0, 1.0)
        if self.decay == "cosine":
            factor = 0.5 * (1.0 + tf.cos(math.pi * progress))
        elif self.decay == "linear":
            factor = 1.0 - progress
        elif self.decay == "poly":
            factor = (1.0 - progress) ** self.power
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
            "power": self.power,
        }
