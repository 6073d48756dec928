"""A replica's share of one update, before the step's one all-reduce: k micro-batches ->
summed float32 gradients, summed loss, correct count and summed BatchNorm moving statistics.

Split out of ``step.py`` so that the micro-batch loop, with what follows the model's trainable
layers (the BatchNorm statistics training moves, and the compiled function that moves them),
reads apart from the all-reduce and the update around it (``step.py`` says what the sums are).
"""

import tensorflow as tf

from tfgpu import compat
from tfgpu.step import batchnorm, losses
from tfgpu.distribute import Backend


class MicroBatches:
    """``gradients(batch, start_stats) -> (summed float32 gradients, summed loss, correct
    count, summed moving statistics)``: this replica's share of an update, in
    ``grad_accum_steps`` micro-batches of ``prepare(batch)``, XLA-compiled with
    ``jit_compile``. Each micro-batch starts from ``start_stats``, the values of
    ``moving_stats`` (the ``batchnorm.MovingStats`` training moves) before the update.

    Built from the step's pieces (``TrainStep`` says what they are); ``loss_scale`` scales the
    loss before differentiating (the gradients stay scaled); with ``sync_batchnorm`` the
    model's BatchNorm layers normalize with moments over ``backend``'s replicas
    (``batchnorm.synchronize``). ``moving_stats`` and ``gradients`` follow the model's
    trainable layers: call ``follow_trainable`` after they change.
    """

    def __init__(
        self,
        model,
        loss: losses.Loss,
        loss_scale,
        prepare,
        backend: Backend,
        *,
        grad_accum_steps: int,
        skips_non_finite: bool,
        sync_batchnorm: bool,
        jit_compile: bool,
    ):
        self.model = model
        self.loss = loss
        self.loss_scale = loss_scale
        self.prepare = prepare
        self.num_replicas = backend.num_replicas
        self.grad_accum_steps = grad_accum_steps
        self.skips_non_finite = skips_non_finite
        self.sync_batchnorm = sync_batchnorm
        self.jit_compile = jit_compile
        if sync_batchnorm:
            batchnorm.synchronize(model, backend.sum_over_replicas)
        self.follow_trainable()

    def follow_trainable(self) -> None:
        """What depends on which layers train: the BatchNorm statistics that training moves,
        and the (XLA-compiled) gradient function that computes them."""
        self.moving_stats = batchnorm.MovingStats(
            self.model, self.num_replicas, self.grad_accum_steps, self.skips_non_finite
        )
        self.gradients = (
            tf.function(self._gradients, jit_compile=True) if self.jit_compile else self._gradients
        )

    def _micro_step(self, images, labels):
        """One micro-batch: (gradients, summed loss, correct count)."""
        with tf.GradientTape() as tape:
            logits = _at_least_float32(self.model(images, training=True))
            loss = self.loss(logits, labels)
            if self.model.losses:  # this micro-batch's share of the once-per-update penalty
                share = tf.cast(tf.shape(labels)[0], loss.dtype) / self.loss.global_batch_size
                loss += tf.add_n([tf.cast(x, loss.dtype) for x in self.model.losses]) * share
            scaled = loss * self.loss_scale.scale if self.loss_scale else loss
        grads = tape.gradient(scaled, self.model.trainable_variables)
        hard = labels if labels.dtype.is_integer else tf.argmax(labels, -1, tf.int32)
        correct = tf.reduce_sum(
            tf.cast(tf.equal(tf.argmax(logits, -1, tf.int32), hard), tf.float32)
        )
        variables = self.model.trainable_variables
        grads = [tf.cast(g, compat.tf_variable(v).dtype) for g, v in zip(grads, variables)]
        return grads, tf.cast(loss, tf.float32), correct

    def _gradients(self, batch: dict, start_stats: list):
        """``gradients``, uncompiled (the class docstring says what it returns)."""
        images, labels = self.prepare(batch)
        k = self.grad_accum_steps
        micro = tf.shape(labels)[0] // k
        grads = [tf.zeros_like(compat.tf_variable(v)) for v in self.model.trainable_variables]
        sums = (grads, tf.constant(0.0), tf.constant(0.0), self.moving_stats.zeros(start_stats))

        def add(i, sums):
            """``sums`` (gradients, loss, correct, statistics) plus micro-batch ``i``'s."""
            # Each micro-batch normalizes with its own statistics, from the update's start.
            self.moving_stats.restart(start_stats)
            lo = i * micro
            g, loss, correct = self._micro_step(images[lo : lo + micro], labels[lo : lo + micro])
            grads, loss_sum, correct_sum, stats = sums
            grads = [a + b for a, b in zip(grads, g)]
            return grads, loss_sum + loss, correct_sum + correct, self.moving_stats.add(stats)

        # k == 1 runs without a loop: XLA on CPU runs convolutions inside a while loop ~70x
        # slower (measured, bench/models.py); k > 1 is a tf.while_loop, traced once whatever k,
        # except with --sync_batchnorm: MirroredStrategy's all-reduce (a merge_call) cannot sit
        # in a while loop, so the k micro-batches are traced one after the other.
        if k == 1 or self.sync_batchnorm:
            for i in range(k):
                sums = add(i, sums)
        else:
            _, sums = tf.while_loop(
                lambda i, _: i < k, lambda i, sums: (i + 1, add(i, sums)), (tf.constant(0), sums)
            )
        return sums


def _at_least_float32(tensor):
    """float16/bfloat16 -> float32; float32 and float64 (exactness tests) as they are."""
    return tensor if tensor.dtype in (tf.float32, tf.float64) else tf.cast(tensor, tf.float32)
