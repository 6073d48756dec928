"""LARS, layer-wise adaptive rate scaling (You, Gitman and Ginsburg 2017,
https://arxiv.org/abs/1708.03888), for the Keras 3 optimizer API.

The arithmetic is TF Model Garden's ``official/modeling/optimization/lars.py`` (Keras 2 only)
with classic momentum, which MLPerf's ResNet-50 references use: for each variable w with
gradient g,

    g <- g + weight_decay * w                      (unless excluded from decay)
    trust = eeta * |w| / |g|   (1 when |w| or |g| is 0; unless excluded from adaptation)
    v <- momentum * v + lr * trust * g
    w <- w - v

The norms are of the whole variable (a layer's kernel), taken on the all-reduced gradient, so
every replica, worker and rank computes the same update; accumulation changes nothing (the
step hands the optimizer the summed gradients of the global batch). Exclusions are regular
expressions searched in a variable's path (``layer/name``): ``bias``, ``gamma`` and ``beta``
by default, BatchNorm's scale and offset and every bias, as MLPerf's rules allow.
"""

import re

import keras
import tensorflow as tf

from tfgpu import compat


def _matches(patterns, path: str) -> bool:
    return any(re.search(p, path) for p in patterns)


@keras.saving.register_keras_serializable("tfgpu")
class LARS(keras.optimizers.Optimizer):
    """LARS with classic momentum (module docstring). ``weight_decay_rate`` is L2 added to the
    gradient before the trust ratio (Keras' own ``weight_decay``, decoupled, stays off);
    ``exclude_from_weight_decay`` and ``exclude_from_layer_adaptation`` are lists of regular
    expressions matched against variable paths (the latter defaults to the former)."""

    def __init__(
        self,
        learning_rate=0.01,
        momentum: float = 0.9,
        weight_decay_rate: float = 0.0,
        eeta: float = 0.001,
        exclude_from_weight_decay=None,
        exclude_from_layer_adaptation=None,
        name: str = "lars",
        **kwargs,
    ):
        kwargs.pop("weight_decay", None)  # decoupled decay is not LARS': weight_decay_rate
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.momentum = float(momentum)
        self.weight_decay_rate = float(weight_decay_rate)
        self.eeta = float(eeta)
        self.exclude_from_weight_decay = list(exclude_from_weight_decay or [])
        adaptation = exclude_from_layer_adaptation
        self.exclude_from_layer_adaptation = list(
            self.exclude_from_weight_decay if adaptation is None else adaptation
        )

    def build(self, variables):
        """Momentum slots, and which variables are decayed and adapted (by their paths)."""
        if self.built:
            return
        super().build(variables)
        self.momentums = self.add_optimizer_variables(variables, "momentum")
        decay = self.weight_decay_rate > 0
        self._decayed = [
            decay and not _matches(self.exclude_from_weight_decay, v.path) for v in variables
        ]
        self._adapted = [
            not _matches(self.exclude_from_layer_adaptation, v.path) for v in variables
        ]

    def decays(self, variable) -> bool:
        """Whether ``variable`` (one the optimizer was built on) is weight-decayed."""
        return self._decayed[compat.variable_index(self, variable)]

    def adapts(self, variable) -> bool:
        """Whether ``variable`` trains with the trust ratio."""
        return self._adapted[compat.variable_index(self, variable)]

    def update_step(self, gradient, variable, learning_rate):
        """One LARS update of ``variable`` (a replica's component under tf.distribute)."""
        index = compat.variable_index(self, variable)
        dtype = variable.dtype
        rate = tf.cast(learning_rate, dtype)
        grad = tf.cast(gradient, dtype)
        weights = tf.convert_to_tensor(variable)
        if self._decayed[index]:
            grad = grad + tf.cast(self.weight_decay_rate, dtype) * weights
        if self._adapted[index]:
            w_norm, g_norm = tf.norm(weights), tf.norm(grad)
            one = tf.ones_like(g_norm)
            ratio = tf.cast(self.eeta, dtype) * w_norm / tf.where(g_norm > 0, g_norm, one)
            rate = rate * tf.where((w_norm > 0) & (g_norm > 0), ratio, one)
        velocity = self.momentums[index]
        self.assign(velocity, tf.cast(self.momentum, dtype) * velocity + rate * grad)
        self.assign_sub(variable, velocity)

    def get_config(self):
        config = super().get_config()
        config.update(
            momentum=self.momentum,
            weight_decay_rate=self.weight_decay_rate,
            eeta=self.eeta,
            exclude_from_weight_decay=self.exclude_from_weight_decay,
            exclude_from_layer_adaptation=self.exclude_from_layer_adaptation,
        )
        return config
