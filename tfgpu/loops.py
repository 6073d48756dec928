"""The compiled pieces of the outer loop, plain functions of what they run on:
``make_train_loop`` (many updates in one tf.function call, timing its wait for input) and
``make_eval_step`` (one distributed evaluation batch -> sums over the replicas).
"""

import time

import keras
import tensorflow as tf

from tfgpu import compat
from tfgpu.schema import STEP_METRICS
from tfgpu.step import TrainStep


def make_train_loop(step: TrainStep, global_step: tf.Variable, skipped_updates: tf.Variable):
    """``loop(iterator, num_steps) -> (totals, first_bad)``: ``num_steps`` updates in one
    tf.function call. ``totals`` sums the ``StepMetrics`` (and "steps") of the finite updates,
    and "input_wait_s", the seconds spent waiting for batches; ``first_bad`` is the first
    non-finite step, -1 if none. Without skipping, the loop stops at that step."""
    keys = (*STEP_METRICS, "steps")
    clock = _clock()

    @tf.function
    def loop(iterator, num_steps):
        totals = {k: tf.constant(0.0) for k in keys}
        waited = tf.constant(0.0, tf.float64)
        first_bad = tf.constant(-1, tf.int64)
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
            totals = {k: totals[k] + tf.where(ok, metrics[k], 0.0) for k in keys}
            skipped_updates.assign_add(tf.cast(tf.logical_not(ok), tf.int64))
            if first_bad < 0 and not ok:
                first_bad = global_step.read_value()
            if not step.skips_non_finite and not ok:
                break
        return dict(totals, input_wait_s=tf.cast(waited, tf.float32)), first_bad

    return loop


def _clock():
    """``clock() -> float64 seconds`` inside a tf.function: ``tf.timestamp``, or under op
    determinism (which refuses it) Python's clock through ``tf.py_function``."""
    if not compat.op_determinism_enabled():
        return tf.timestamp
    return lambda: tf.reshape(tf.py_function(time.perf_counter, [], tf.float64), [])


def make_eval_step(model: keras.Model, backend, num_classes: int = 0):
    """``eval_step(distributed EvalBatch) -> EvalSums`` summed over replicas; with
    ``num_classes``, also "confusion": float32 [true class, predicted class] counts (the
    arg-max that top-1 counts), for per-class accuracy (``tfgpu.evaluate``)."""

    def replica(batch):
        logits = tf.cast(model(tf.cast(batch["image"], tf.float32), training=False), tf.float32)
        labels, weight = batch["label"], batch["weight"]
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        top5 = tf.cast(tf.math.in_top_k(labels, logits, min(5, logits.shape[-1])), tf.float32)
        predicted = tf.argmax(logits, -1, tf.int32)
        top1 = tf.cast(tf.equal(predicted, labels), tf.float32)
        sums = {
            "loss": tf.reduce_sum(loss * weight),
            "top1": tf.reduce_sum(top1 * weight),
            "top5": tf.reduce_sum(top5 * weight),
            "count": tf.reduce_sum(weight),
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
