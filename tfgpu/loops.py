"""The compiled pieces of the outer loop, plain functions of what they run on:
``make_train_loop`` (many updates in one tf.function call, timing its wait for input) and
``make_eval_step`` (one distributed evaluation batch -> sums over the replicas).
"""

import time

import keras
import tensorflow as tf

from tfgpu import compat
from tfgpu.schema import STEP_METRICS
from tfgpu.step import TrainStep, global_norm


def make_train_loop(
    step: TrainStep, global_step: tf.Variable, skipped_updates: tf.Variable, max_skipped: int = 0
):
    """``loop(iterator, num_steps, variant=0) -> (totals, first_bad, diverged)``: ``num_steps``
    updates in one tf.function call; ``variant`` is the step's ``TrainStep.variant``, a Python
    int: tf.function traces anew for a new one, so a step whose trainable layers changed (an
    unfrozen backbone) runs as traced for them. ``totals`` sums the ``StepMetrics`` (and
    "steps") of the applied updates only, counts the skipped ones ("skipped_updates"), and sums
    "input_wait_s", the seconds spent waiting for batches; ``first_bad`` is the first non-finite
    step, -1 if none. The step's "grad_norm" and "clipped" are summed like the rest;
    "weight_norm" (the global norm of the trainable weights) and "loss_scale" (float16) are
    their values at the end. Without skipping, the loop stops at that step. With skipping, it
    stops after ``max_skipped`` (0: never) skipped updates in a row, counting under float16 only
    those at the loss scale's floor (``DynamicLossScale.at_floor``: halving cannot help any
    more); ``diverged`` is then that step, else -1."""
    keys = (*STEP_METRICS, "steps")
    clock = _clock()
    # Skipped updates in a row (at the floor); not checkpointed: a resumed run counts afresh.
    streak = tf.Variable(0, dtype=tf.int64, trainable=False, name="skip_streak")
    loss_scale = step.loss_scale

    @tf.function
    def loop(iterator, num_steps, variant=0):
        del variant  # only a key of the trace
        totals = {k: tf.constant(0.0) for k in keys}
        skipped = tf.constant(0.0)
        waited = tf.constant(0.0, tf.float64)
        first_bad = tf.constant(-1, tf.int64)
        diverged = tf.constant(-1, tf.int64)
        for _ in tf.range(num_steps):
            start = clock()
            with tf.control_dependencies([start]):
                batch = next(iterator)
            with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                waited += clock() - start
            metrics, finite = step.update(batch)
            # After the update (other variables would not order it): the heartbeat board
            # reads the counter as "updates completed".
            with tf.control_dependencies(tf.nest.flatten(metrics)):
                global_step.assign_add(1)
            ok = tf.logical_and(finite, tf.math.is_finite(metrics["loss"]))
            metrics = dict(metrics, steps=tf.constant(1.0))
            # A skipped update's loss and counts are not the model's: they stay out.
            totals = {k: totals[k] + tf.where(ok, metrics[k], 0.0) for k in keys}
            skipped += tf.cast(tf.logical_not(ok), tf.float32)
            skipped_updates.assign_add(tf.cast(tf.logical_not(ok), tf.int64))
            counts = tf.logical_not(ok)
            if loss_scale is not None:
                counts = tf.logical_and(counts, loss_scale.at_floor())
            streak.assign(tf.where(counts, streak + 1, 0))
            if first_bad < 0 and not ok:
                first_bad = global_step.read_value()
            if not step.skips_non_finite and not ok:
                break
            if max_skipped > 0 and streak >= max_skipped:
                diverged = global_step.read_value()
                break
        totals = dict(totals, skipped_updates=skipped, input_wait_s=tf.cast(waited, tf.float32))
        if step.extra_metrics:  # as they are at the call's end (results.Window keeps the last)
            weights = [v.value for v in step.model.trainable_variables]
            totals["weight_norm"] = global_norm(weights)
        if loss_scale is not None:
            totals["loss_scale"] = tf.identity(loss_scale.scale)
        return totals, first_bad, diverged

    return loop


def _clock():
    """``clock() -> float64 seconds`` inside a tf.function: ``tf.timestamp``, or under op
    determinism (which refuses it) Python's clock through ``tf.py_function``."""
    if not compat.op_determinism_enabled():
        return tf.timestamp
    return lambda: tf.reshape(tf.py_function(time.perf_counter, [], tf.float64), [])


def make_eval_step(model: keras.Model, backend, num_classes: int = 0):
    """``eval_step(distributed EvalBatch) -> EvalSums`` summed over replicas. An example
    whose logits are not all finite counts as wrong for top-1 and top-5 (its arg-max and
    top-k mean nothing), stays out of the loss sum and is counted in "non_finite". With
    ``num_classes``, also "confusion": float32 [true class, predicted class] counts (the
    arg-max that top-1 counts), for per-class accuracy (``tfgpu.evaluate``)."""

    def replica(batch):
        logits = tf.cast(model(tf.cast(batch["image"], tf.float32), training=False), tf.float32)
        labels, weight = batch["label"], batch["weight"]
        finite = tf.reduce_all(tf.math.is_finite(logits), axis=-1)
        good = weight * tf.cast(finite, tf.float32)
        safe = tf.where(finite[:, None], logits, 0.0)  # no NaN into the sums (0 * NaN = NaN)
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, safe)
        top5 = tf.cast(tf.math.in_top_k(labels, safe, min(5, logits.shape[-1])), tf.float32)
        predicted = tf.argmax(safe, -1, tf.int32)
        top1 = tf.cast(tf.equal(predicted, labels), tf.float32)
        sums = {
            "loss": tf.reduce_sum(loss * good),
            "top1": tf.reduce_sum(top1 * good),
            "top5": tf.reduce_sum(top5 * good),
            "count": tf.reduce_sum(weight),
            "non_finite": tf.reduce_sum(weight - good),
        }
        if num_classes:
            sums["confusion"] = tf.math.confusion_matrix(
                labels, predicted, num_classes, weights=weight, dtype=tf.float32
            )
        return sums

    @tf.function
    def eval_step(batch):
        return backend.reduce_sum(backend.each_replica(replica, args=(batch,)))

    return eval_step
