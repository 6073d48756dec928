"""What BatchNorm means when training is spread over replicas, workers, ranks and micro-batches.

Keras' BatchNormalization keeps its moving mean and variance in variables with aggregation
"none": under tf.distribute each replica's forward pass updates only its own component of the
MirroredVariable, and each Horovod rank its own variable, so left alone the replicas drift apart
and a checkpoint holds replica 0's statistics. tfgpu defines them instead:

- **Moving statistics are the same everywhere, after every update.** Each replica's new values
  travel in the update's one gradient all-reduce (``TrainStep.replica_step``), divided by the
  number of replicas, and every replica assigns the mean. The moving averages are linear, so
  this is the average the replicas would reach if each had averaged its batch statistics first.
- **Accumulation: each micro-batch normalizes with its own statistics** (as timm and NVIDIA's
  ConvNets do), and the moving averages move **once per update**, by the mean of the
  micro-batches' statistics: every micro-batch starts from the update's starting values, and the
  update keeps the mean of their results. So k micro-batches on one device update them exactly
  as k replicas would, and ``momentum`` keeps its meaning per optimizer update whatever k is.
- **``--sync_batchnorm``**: batch moments are computed over all replicas at the same micro-step,
  two small collectives per layer (``synchronize``), so N replicas of b normalize as one device
  of N*b.

An update skipped for non-finite gradients leaves the moving statistics where they were.
"""

import keras
import tensorflow as tf

from tfgpu import compat
from tfgpu.models.layers import batchnorm_layers


def moving_statistics(model: keras.Model) -> list:
    """The moving means and variances that training updates (BatchNorm layers that are
    trainable: a frozen one normalizes with its stored statistics and never changes them)."""
    return [
        v
        for layer in batchnorm_layers(model)
        if layer.trainable and not layer.renorm
        for v in (layer.moving_mean, layer.moving_variance)
    ]


def synchronize(model: keras.Model, sum_over_replicas) -> int:
    """Makes every BatchNorm layer of ``model`` compute its batch moments over all replicas;
    ``sum_over_replicas(tensor) -> tensor`` is a differentiable sum across replicas, called
    inside a replica step (``backend.sum_over_replicas``). Returns the number of layers."""
    layers = batchnorm_layers(model)
    for layer in layers:
        compat.set_batchnorm_moments(layer, _synced_moments(sum_over_replicas))
    return len(layers)


def _synced_moments(sum_over_replicas):
    """``moments(x, axes) -> (mean, variance)`` over the union of every replica's ``x``.

    Two passes, as one device's ``tf.nn.moments``: the sums and the count in one collective,
    then the squared distances to the global mean in a second. The one-pass E[x^2] - E[x]^2
    of Keras' ``synchronized=True`` (three collectives) loses precision to cancellation when
    a channel's mean is large against its spread, and is bound to tf.distribute; this one
    runs through whichever backend runs the step."""

    def moments(x, axes):
        x = tf.cast(x, tf.float64 if x.dtype == tf.float64 else tf.float32)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
        total = sum_over_replicas(tf.concat([tf.reduce_sum(x, axes), tf.reshape(count, [1])], 0))
        n = total[-1]
        mean = total[:-1] / n
        squares = tf.reduce_sum(tf.math.squared_difference(x, tf.stop_gradient(mean)), axes)
        return mean, sum_over_replicas(squares) / n

    return moments


class MovingStats:
    """The BatchNorm moving statistics that a train step moves, and how one update moves them:
    micro-batches from the update's start values, their sum, each replica's share of the mean
    in the all-reduce, the mean assigned after it (``TrainStep.replica_step`` asks, in order).

    Built from the model's trainable layers (``moving_statistics``) at the step's construction
    and again when they change (``TrainStep.trainable_changed``).
    """

    def __init__(self, model, num_replicas: int, grad_accum_steps: int, skips_non_finite: bool):
        self.variables = moving_statistics(model)
        # Averaged in the all-reduce when more than one forward pass moved them per update.
        self.averaged = bool(self.variables) and (num_replicas > 1 or grad_accum_steps > 1)
        self.grad_accum_steps = grad_accum_steps
        self.share = 1.0 / (num_replicas * grad_accum_steps)
        self.skips_non_finite = skips_non_finite

    def start(self) -> list:
        """The values before the update (tensors): each micro-batch starts from them."""
        return [tf.identity(compat.tf_variable(v)) for v in self.variables]

    def zeros(self, start: list) -> list:
        """The empty sum of the micro-batches' statistics, shaped as ``start``."""
        return [tf.zeros_like(s) for s in start]

    def restart(self, start: list) -> None:
        """Before each of k > 1 micro-batches: the statistics back to the update's ``start``."""
        if self.grad_accum_steps > 1 and self.averaged:
            for var, value in zip(self.variables, start):
                var.assign(value)

    def add(self, summed: list) -> list:
        """``summed`` plus the statistics the last micro-batch left; as it is when they are
        not averaged (no reads of every BatchNorm variable)."""
        if not self.averaged:
            return summed
        return [a + compat.tf_variable(v) for a, v in zip(summed, self.variables)]

    def shares(self, summed: list) -> list:
        """This replica's share of the mean of ``summed``, to add to the all-reduce; [] when
        the statistics are not averaged."""
        return [s * self.share for s in summed] if self.averaged else []

    def update(self, start: list, reduced: list, finite) -> None:
        """After the all-reduce: the statistics become ``reduced`` (the all-reduced
        ``shares``), or stay as the forward pass left them when not averaged; back to
        ``start`` when the update is not ``finite``."""
        if self.variables and (self.averaged or self.skips_non_finite):
            new = reduced if self.averaged else [compat.tf_variable(v) for v in self.variables]
            average_update(self.variables, start, new, finite)


def average_update(stats: list, start: list, summed: list, finite) -> None:
    """Assigns to ``stats`` the all-reduced ``summed`` values (already the mean over replicas
    and micro-batches), or back the update's ``start`` values when it was not ``finite``."""
    for var, before, value in zip(stats, start, summed):
        var.assign(tf.where(finite, value, before))
