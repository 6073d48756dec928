"""The train step: k micro-batches -> summed float32 gradients -> ONE all-reduce -> ONE update.

Each replica gets its whole share of a global batch and walks it in ``grad_accum_steps``
micro-batches inside a ``tf.while_loop`` (so k costs no extra tracing). Each micro-batch's loss
is summed over its examples and divided by the *global* batch, so the summed gradients equal
those of one large batch; the layers' own losses (``model.losses``: weight and activity
regularizers, both means over examples in Keras 3) count with the micro-batch's share of the
global batch, so that they too add up to once per update. The replicas then all-reduce once,
and the optimizer applies once, outside the replicas (cross-replica context), which is also
where an update with non-finite gradients is skipped under float16 loss scaling.

BatchNorm's moving statistics ride in the same all-reduce (``batchnorm.py`` says what they mean
under replicas and accumulation). A replica's micro-batch loop is ``accumulate.py``'s.
"""

import tensorflow as tf

from tfgpu import compat
from tfgpu.batches import TrainBatch
from tfgpu.step import accumulate, batchnorm, losses
from tfgpu.data import device_ops
from tfgpu.distribute import Backend
from tfgpu.errors import NonFiniteLoss  # noqa: F401  (raised by the loop, caught by main)
from tfgpu.metrics import StepMetrics


class DynamicLossScale:
    """Float16 dynamic loss scaling: halve on overflow, double after ``period`` good steps,
    never below ``MIN_SCALE``.

    The floor is 1.0, as in TensorFlow's and Keras' LossScaleOptimizer: a scale below 1 only
    shrinks the gradients, so it cannot cure an overflow that still happens at 1 (the forward
    pass or the update itself is non-finite: the run diverged) and would flush more small
    gradients to zero. Updates still skipped at the floor are counted (``at_floor``), and the
    loop stops after --max_skipped_updates of them in a row (``loops.make_train_loop``).
    """

    MIN_SCALE = 1.0

    def __init__(self, initial: float = 2.0**15, period: int = 2000):
        agg = tf.VariableAggregation.ONLY_FIRST_REPLICA
        self.scale = tf.Variable(initial, trainable=False, dtype=tf.float32, aggregation=agg)
        self.good_steps = tf.Variable(0, trainable=False, dtype=tf.int64, aggregation=agg)
        self.period = period

    def update(self, finite: tf.Tensor) -> None:
        """Called once per update, in cross-replica context, with the global finiteness."""
        grow = tf.logical_and(finite, self.good_steps + 1 >= self.period)
        self.scale.assign(
            tf.where(
                finite,
                tf.where(grow, self.scale * 2.0, self.scale),
                tf.maximum(self.scale * 0.5, self.MIN_SCALE),
            )
        )
        self.good_steps.assign(tf.where(finite & ~grow, self.good_steps + 1, 0))

    def at_floor(self) -> tf.Tensor:
        return self.scale <= self.MIN_SCALE


def all_finite(tensors) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def clip_by_global_norm(grads, clip_norm: float, norm=None):
    """Clips the all-reduced (global) gradients; Keras would clip each replica's part instead.
    ``norm``: their global norm, when already known."""
    if not clip_norm:
        return grads
    norm = global_norm(grads) if norm is None else norm
    # tf.clip_by_global_norm's arithmetic, with the scale cast to each gradient's dtype.
    scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm)
    scale = tf.where(tf.math.is_finite(norm), scale, float("nan"))
    return [g * tf.cast(scale, g.dtype) for g in grads]


class TrainStep:
    """Builds the per-update function run by the loop; holds no data, only the recipe.

    ``prepare(batch) -> (float images, int or soft targets)`` turns a batch into the model's
    input (``device_ops.make_batch_fn``); ``unpack(batch)``, when given, runs before it and
    outside XLA (packed crops -> fixed-size images: XLA would compile again for every new
    length). With ``jit_compile``, XLA compiles the part with the FLOPs (preparation, forward,
    backward, accumulation); the all-reduce and the update stay in the graph.
    """

    def __init__(
        self,
        model,
        optimizer,
        backend: Backend,
        *,
        global_batch_size: int,
        grad_accum_steps: int = 1,
        label_smoothing: float = 0.0,
        clip_norm: float = 0.0,
        loss_scale: DynamicLossScale | None = None,
        skip_non_finite: bool = False,
        prepare=device_ops.train_batch,
        unpack=None,
        jit_compile: bool = False,
        sync_batchnorm: bool = False,
        class_weights=None,
        loss: str = "cross_entropy",
        bce_target_threshold: float = 0.0,
    ):
        self.model = model
        self.backend = backend
        self.global_batch_size = global_batch_size
        self.loss = losses.Loss(
            global_batch_size, label_smoothing, class_weights, loss, bce_target_threshold
        )
        self.clip_norm = clip_norm
        self.loss_scale = loss_scale
        self.prepare = prepare  # also run alone, by bench/gpu_probes.py
        self.unpack = unpack
        # The per-window diagnostics (grad_norm, clipped, and the loop's weight_norm); off
        # only to measure what they cost (bench/train_step.py). Read when the step is traced.
        self.extra_metrics = True
        # Float16 overflows are expected (that is what the loss scale probes); elsewhere a
        # non-finite update is skipped only when asked, else the loop stops at it.
        self.skips_non_finite = skip_non_finite or loss_scale is not None
        self.micro_batches = self._micro_batches(grad_accum_steps, sync_batchnorm, jit_compile)
        self.variant = 0  # what the loop's tf.function traces for: see trainable_changed
        # The optimizer applies the gradients this step all-reduced itself: not again.
        self.optimizer = compat.without_implicit_all_reduce(optimizer)
        with backend.scope():
            # Built here: variables cannot be created inside the cond that may skip an update.
            self.optimizer.build(model.trainable_variables)

    def _micro_batches(self, grad_accum_steps, sync_batchnorm, jit_compile):
        """A replica's micro-batch loop (``accumulate.MicroBatches``) over this step's model,
        loss, loss scale, preparation and backend."""
        return accumulate.MicroBatches(
            self.model,
            self.loss,
            self.loss_scale,
            self.prepare,
            self.backend,
            grad_accum_steps=grad_accum_steps,
            skips_non_finite=self.skips_non_finite,
            sync_batchnorm=sync_batchnorm,
            jit_compile=jit_compile,
        )

    @property
    def moving_stats(self) -> batchnorm.MovingStats:
        """The BatchNorm statistics that training moves (``MicroBatches.moving_stats``)."""
        return self.micro_batches.moving_stats

    def trainable_changed(self) -> None:
        """Call at a loop boundary after layers were frozen or unfrozen (``finetune.unfreeze``):
        the step follows the model's trainable layers again, and ``variant`` changes, so that
        the loop traces it anew (Keras reads ``trainable`` when the step is traced)."""
        self.micro_batches.follow_trainable()
        self.variant += 1

    def use_input(self, prepare, unpack=None) -> None:
        """Call at a loop boundary when the train batches change (a --progressive_stages
        stage): the step prepares them with ``prepare`` and ``unpack`` (as ``__init__``'s), and
        the loop traces it anew."""
        self.prepare, self.unpack = prepare, unpack
        self.micro_batches.prepare = prepare
        self.trainable_changed()

    def replica_step(self, batch: TrainBatch):
        """Runs on each replica: accumulate k micro-batches, then all-reduce once.

        Returns (all-reduced gradients, whether they are all finite, their global norm before
        clipping, this replica's sums of loss, correct and skipped).
        """
        if self.unpack is not None:
            batch = self.unpack(batch)
        start = self.moving_stats.start()
        grads, loss, correct, stats = self.micro_batches.gradients(batch, start)
        # The only gradient synchronization of the update: after the last micro-batch. The
        # moving statistics travel with it, each replica's share of their mean.
        extra = self.moving_stats.shares(stats)
        grads, stats = self.backend.all_reduce_sum(grads, extra=extra)
        if self.loss_scale:
            grads = [g / self.loss_scale.scale for g in grads]
        finite = all_finite(grads)
        # Their mean, everywhere; a skipped update restores the update's start values.
        self.moving_stats.update(start, stats, finite)
        # The global norm of the all-reduced gradients, before clipping (which reuses it).
        norm = global_norm(grads) if self.extra_metrics else None
        grads = clip_by_global_norm(grads, self.clip_norm, norm)
        # Examples whose image was broken (weight 0: zero targets, no gradient).
        skipped = tf.reduce_sum(1.0 - batch["weight"])
        norm = tf.constant(0.0) if norm is None else norm
        return grads, finite, norm, {"loss": loss, "correct": correct, "skipped": skipped}

    def update(self, batch) -> tuple:
        """One optimizer update from one distributed global batch; returns (``StepMetrics``
        summed over replicas, whether the update was finite)."""
        grads, finite, norm, metrics = self.backend.each_replica(self.replica_step, args=(batch,))
        # Identical on every replica (computed after the all-reduce): skip or apply together.
        finite = self.backend.local_values(finite)[0]
        norm = self.backend.local_values(norm)[0]
        clipped = tf.cast(norm > self.clip_norm, tf.float32) if self.clip_norm else 0.0
        if self.skips_non_finite:
            # A cond with merge_call inside must sit in cross-replica context (as Keras'
            # LossScaleOptimizer does), so the apply re-enters the replicas from inside it.
            tf.cond(finite, lambda: self._apply(grads), lambda: tf.constant(False))
            if self.loss_scale:
                self.loss_scale.update(finite)
        else:
            self._apply(grads)
        # The count is known, not summed: Horovod's collectives are not marked stateful, and
        # TensorFlow's graph optimizer would run one on a constant input while compiling the
        # function (each rank then waits there for the others, outside of any step).
        count = tf.constant(float(self.global_batch_size))
        sums = self.backend.reduce_sum(metrics)
        return StepMetrics(**sums, count=count, grad_norm=norm, clipped=clipped), finite

    def _apply(self, grads):
        self.backend.each_replica(
            self.optimizer.apply, args=(grads, self.model.trainable_variables)
        )
        return tf.constant(True)


def global_norm(tensors) -> tf.Tensor:
    """The float32 global norm of ``tensors`` (float64 ones too: ``--dtype=float64``)."""
    return tf.linalg.global_norm([tf.cast(t, tf.float32) for t in tensors])
