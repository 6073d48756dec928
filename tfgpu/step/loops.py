"""The compiled pieces of the outer loop, plain functions of what they run on:
``make_train_loop`` (many updates in one tf.function call, timing its wait for input) and
``make_eval_step`` (one distributed evaluation batch -> sums over the replicas).
"""

import math
import time

import keras
import tensorflow as tf

from tfgpu import compat
from tfgpu.metrics import STEP_METRICS
from tfgpu.step.train_step import TrainStep, global_norm


def make_train_loop(
    step: TrainStep, global_step: tf.Variable, skipped_updates: tf.Variable, max_skipped: int = 0
):
    """``loop(iterator, num_steps, variant=0) -> (totals, first_bad, diverged)``: ``num_steps``
    updates in one tf.function call. ``variant``: the step's ``TrainStep.variant``, a Python int
    (a new one traces anew: a step whose trainable layers changed runs as traced for them).
    ``totals``: the call's sums (``_window_totals``). ``first_bad``: the first non-finite step,
    -1 if none; without skipping, the loop stops there. With skipping, it stops after
    ``max_skipped`` (0: never) skipped updates in a row, under float16 only those at the loss
    scale's floor (``_count_skip``); ``diverged`` is then that step, else -1."""
    clock = _clock()
    # Skipped updates in a row (at the floor); not checkpointed: a resumed run counts afresh.
    streak = tf.Variable(0, dtype=tf.int64, trainable=False, name="skip_streak")

    @tf.function
    def loop(iterator, num_steps, variant=0):
        del variant  # only a key of the trace
        sums = _zero_sums()
        first_bad, diverged = tf.constant(-1, tf.int64), tf.constant(-1, tf.int64)
        for _ in tf.range(num_steps):
            batch, waited = _next_timed(iterator, clock)
            metrics, ok = _counted_update(step, batch, global_step)
            sums = _add_update(sums, metrics, ok, waited)
            _count_skip(ok, skipped_updates, streak, step.loss_scale)
            if first_bad < 0 and not ok:
                first_bad = global_step.read_value()
            if not step.skips_non_finite and not ok:
                break
            if max_skipped > 0 and streak >= max_skipped:
                diverged = global_step.read_value()
                break
        return _window_totals(step, sums), first_bad, diverged

    return loop


_SUMMED = (*STEP_METRICS, "steps")  # the keys of an update's metrics that _add_update sums


def _zero_sums() -> dict:
    """The empty sums of a loop call: float32 zeros for ``_SUMMED`` and "skipped_updates", a
    float64 zero for "input_wait_s"."""
    sums = {k: tf.constant(0.0) for k in (*_SUMMED, "skipped_updates")}
    return dict(sums, input_wait_s=tf.constant(0.0, tf.float64))


def _next_timed(iterator, clock):
    """``(batch, seconds)``: the iterator's next batch and the float64 seconds ``clock``
    (``_clock``) saw pass while waiting for it."""
    start = clock()
    with tf.control_dependencies([start]):
        batch = next(iterator)
    with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
        waited = clock() - start
    return batch, waited


def _counted_update(step: TrainStep, batch, global_step: tf.Variable):
    """Runs ``step.update`` on ``batch`` and adds 1 to ``global_step``; returns (its
    ``StepMetrics`` plus "steps": 1, ok: whether its gradients and loss were finite)."""
    metrics, finite = step.update(batch)
    # After the update (other variables would not order it): the heartbeat board
    # reads the counter as "updates completed".
    with tf.control_dependencies(tf.nest.flatten(metrics)):
        global_step.assign_add(1)
    ok = tf.logical_and(finite, tf.math.is_finite(metrics["loss"]))
    return dict(metrics, steps=tf.constant(1.0)), ok


def _add_update(sums: dict, metrics: dict, ok, waited) -> dict:
    """``sums`` (``_zero_sums``) plus one update: its ``metrics`` if ``ok``, else one
    "skipped_updates"; and the float64 seconds ``waited`` for its batch either way."""
    # A skipped update's loss and counts are not the model's: they stay out.
    added = {k: sums[k] + tf.where(ok, metrics[k], 0.0) for k in _SUMMED}
    added["skipped_updates"] = sums["skipped_updates"] + tf.cast(tf.logical_not(ok), tf.float32)
    added["input_wait_s"] = sums["input_wait_s"] + waited
    return added


def _count_skip(ok, skipped_updates: tf.Variable, streak: tf.Variable, loss_scale) -> None:
    """Counts an update that was not ``ok`` in ``skipped_updates`` and in ``streak``, the skips
    in a row; with a float16 ``loss_scale``, ``streak`` counts only those at its floor
    (``DynamicLossScale.at_floor``: halving cannot help any more). Any other update sets
    ``streak`` back to 0. Returns nothing."""
    skipped_updates.assign_add(tf.cast(tf.logical_not(ok), tf.int64))
    counts = tf.logical_not(ok)
    if loss_scale is not None:
        counts = tf.logical_and(counts, loss_scale.at_floor())
    streak.assign(tf.where(counts, streak + 1, 0))


def _window_totals(step: TrainStep, sums: dict) -> dict:
    """The ``totals`` a loop call returns, from its ``sums`` (``_add_update``): the
    ``StepMetrics`` and "steps" of the applied updates only, "grad_norm" and "clipped" summed
    like the rest, the count of skipped ones ("skipped_updates") and "input_wait_s", the
    seconds spent waiting for batches (float32 here); with ``step.extra_metrics``,
    "weight_norm" (the global norm of the trainable weights), and under float16 "loss_scale":
    both as they are at the call's end (``results.Window`` keeps the last)."""
    totals = dict(sums, input_wait_s=tf.cast(sums["input_wait_s"], tf.float32))
    if step.extra_metrics:
        weights = [v.value for v in step.model.trainable_variables]
        totals["weight_norm"] = global_norm(weights)
    if step.loss_scale is not None:
        totals["loss_scale"] = tf.identity(step.loss_scale.scale)
    return totals


def _clock():
    """``clock() -> float64 seconds`` inside a tf.function: ``tf.timestamp``, or under op
    determinism (which refuses it) Python's clock through ``tf.py_function``."""
    if not compat.op_determinism_enabled():
        return tf.timestamp
    return lambda: tf.reshape(tf.py_function(time.perf_counter, [], tf.float64), [])


def make_eval_step(model: keras.Model, backend, num_classes: int = 0, tta: str = "none"):
    """``eval_step(distributed EvalBatch) -> EvalSums`` summed over replicas. An example
    whose logits are not all finite counts as wrong for top-1 and top-5 (its arg-max and
    top-k mean nothing), stays out of the loss sum and is counted in "non_finite". With
    ``num_classes``, also "confusion": float32 [true class, predicted class] counts (the
    arg-max that top-1 counts), for per-class accuracy (``tfgpu.evaluate``). ``tta``:
    --eval_tta, the views whose probabilities are averaged (``tta_logits``)."""

    def replica(batch):
        logits = tta_logits(model, tf.cast(batch["image"], tf.float32), tta)
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


def tta_logits(model: keras.Model, images, tta: str = "none"):
    """float32 logits [N, K] of ``model`` (inference mode) on float ``images`` [N, H, W, C].
    With ``tta`` "flip": logits whose softmax is the mean of the softmax probabilities of each
    image and of its left-right mirror (``mean_of_softmax``), so that the loss, top-1 and top-5
    computed from logits are those of the averaged probabilities. "flip_translate" (airbench's
    multi-view TTA): six views (``tta_views``), their probabilities weighted
    (``weighted_mean_of_softmax``). Per example: any replica may run it."""
    return logits_of_views(view_logits(model, images, tta), tta)


def view_logits(model: keras.Model, images, tta: str = "none") -> list:
    """float32 logits [N, K] of ``model`` (inference mode) on each view of ``tta_views``, in
    order. Keras ops: the same in a Keras functional model (``export.litert``)."""
    views, _ = tta_views(images, tta)
    return [keras.ops.cast(model(view, training=False), "float32") for view in views]


def logits_of_views(logits: list, tta: str = "none"):
    """``tta_logits`` from the views' logits (``view_logits``)."""
    if tta == "none":
        return logits[0]
    if tta == "flip":
        return mean_of_softmax(*logits)
    return weighted_mean_of_softmax(logits, TTA_WEIGHTS[tta])


# The weight of each view of tta_views, by --eval_tta.
TTA_WEIGHTS = {
    "none": [1.0],
    "flip": [0.5, 0.5],
    "flip_translate": [0.25, 0.25, 0.125, 0.125, 0.125, 0.125],
}


def tta_views(images, tta: str = "none") -> tuple[list, list]:
    """(views of float ``images`` [N, H, W, C], their weights summing to 1) of --eval_tta:
    none: the images; flip: them and their left-right mirrors (1/2 each); flip_translate
    (airbench's): those (1/4 each), and the images shifted by one pixel up-left and
    down-right (edges reflected) with their mirrors (1/8 each). Keras ops: the same in a
    Keras functional model (``export.litert``), a tf.function and tf.data."""
    if tta == "none":
        return [images], TTA_WEIGHTS[tta]
    if tta == "flip":
        return [images, keras.ops.flip(images, axis=2)], TTA_WEIGHTS[tta]
    height, width = images.shape[1], images.shape[2]
    padded = keras.ops.pad(images, [[0, 0], [1, 1], [1, 1], [0, 0]], mode="reflect")
    shifted = [padded[:, :height, :width], padded[:, 2 : height + 2, 2 : width + 2]]
    views = []
    for view in [images, *shifted]:
        views += [view, keras.ops.flip(view, axis=2)]
    return views, TTA_WEIGHTS[tta]


def tta_probabilities(model: keras.Model, images, tta: str = "none"):
    """float32 probabilities [N, K]: the weighted mean of ``model``'s softmax over the views
    of ``tta_views`` (what the exports compute: no log-sum-exp for a converter to carry)."""
    return probabilities_of_views(view_logits(model, images, tta), tta)


def probabilities_of_views(logits: list, tta: str = "none"):
    """``tta_probabilities`` from the views' logits (``view_logits``)."""
    total = 0.0
    for view, weight in zip(logits, TTA_WEIGHTS[tta]):
        total = keras.ops.softmax(view) * weight + total
    return total


def mean_of_softmax(a, b):
    """Logits ``c`` [N, K] with softmax(c) = (softmax(a) + softmax(b)) / 2, for logits ``a`` and
    ``b``: c = a + log((1 + e^d) / 2), d = log_softmax(b) - log_softmax(a) (so that e^c is
    proportional to p_a + p_b). Computed as max(d, 0) + log(0.5 + 0.5 e^-|d|), which cannot
    overflow, and is exactly 0 where d is: equal views give exactly ``a``, and so exactly the
    numbers of an evaluation without TTA. A non-finite view makes ``c`` non-finite."""
    d = tf.nn.log_softmax(b) - tf.nn.log_softmax(a)
    return a + (tf.maximum(d, 0.0) + tf.math.log(0.5 + 0.5 * tf.exp(-tf.abs(d))))


def weighted_mean_of_softmax(logits: list, weights: list):
    """Logits ``c`` [N, K] with softmax(c) = sum_i w_i softmax(logits_i) (weights summing to
    1): log-sum-exp over the views of log w_i + log_softmax(logits_i), which cannot overflow."""
    stacked = tf.stack([tf.nn.log_softmax(x) + float(math.log(w)) for x, w in zip(logits, weights)])
    return tf.reduce_logsumexp(stacked, axis=0)
