"""The train step's loss: softmax cross-entropy or one-vs-all sigmoid (BCE), with label
smoothing, class weights and broken images.

Split out of ``step.py`` so that the arithmetic of the targets (what a smoothed, weighted or
all-zero row means) reads apart from the accumulation and the all-reduce around it.
"""

import tensorflow as tf


class Loss:
    """``loss(logits, targets)``: the summed cross-entropy of a micro-batch, over the global
    batch size (a scalar of the logits' dtype), so that the micro-batches of an update add up
    to the mean over the global batch.

    Built from ``global_batch_size``, ``label_smoothing`` (0: off) and ``class_weights`` (a
    [K] array of each class's weight, ``data/balance.py``; None: off).

    ``targets`` are int labels [N] or soft labels [N, K] (MixUp/CutMix; an all-zero row is a
    broken image, which must add nothing). Label smoothing moves a share of each row's own
    mass, so a zero row stays zero. With class weights, class c's share of a target counts
    w_c times: an example's term is fixed before any split of the batch.

    ``kind="bce"``: each class a sigmoid against its share of the (smoothed) target, the mean
    over the K classes per example, as timm's ``BinaryCrossEntropy``; with
    ``bce_target_threshold`` t > 0 a share above t becomes 1 and the others 0 (timm's
    ``target_threshold``: both classes of a MixUp count fully). The example then counts with
    its weight as above: its row's mass (0 when broken), under class weights sum_c w_c t_c;
    the class weights weigh examples, not the binary targets.
    """

    def __init__(
        self,
        global_batch_size: int,
        label_smoothing: float = 0.0,
        class_weights=None,
        kind: str = "cross_entropy",
        bce_target_threshold: float = 0.0,
    ):
        self.global_batch_size = global_batch_size
        self.label_smoothing = label_smoothing
        self.class_weights = None if class_weights is None else tf.constant(class_weights)
        self.kind = kind
        self.bce_target_threshold = bce_target_threshold

    def __call__(self, logits, targets):
        num_classes = logits.shape[-1]
        if targets.dtype.is_integer:
            targets = tf.one_hot(targets, num_classes, dtype=logits.dtype)
        targets = tf.cast(targets, logits.dtype)
        mass = tf.reduce_sum(targets, -1, keepdims=True)  # 1; 0 when broken
        if self.label_smoothing:
            smooth = self.label_smoothing
            targets = targets * (1 - smooth) + mass * (smooth / num_classes)
        # BCE's targets are the class shares, before any class weight (which weighs examples).
        unit = targets / tf.where(mass > 0, mass, tf.ones_like(mass))
        if self.class_weights is not None:
            targets = targets * tf.cast(self.class_weights, logits.dtype)
            mass = tf.reduce_sum(targets, -1, keepdims=True)  # the example's weight
        if self.kind == "bce":
            terms = _binary_cross_entropy(unit, mass, logits, self.bce_target_threshold)
        else:
            terms = _cross_entropy(targets, mass, logits)
        return tf.reduce_sum(terms) / self.global_batch_size


def _cross_entropy(targets, mass, logits):
    """[N] -sum_c targets * log softmax(logits) for targets [N, C] of any row sums ``mass``
    [N, 1] (0 for a broken image, a class weight, ...).

    The fused op's gradient is softmax - targets, right only for rows that sum to 1 (a zero
    row got the gradient softmax, not 0): it is given the rows scaled to 1, and the loss is
    scaled back, which keeps its kernel (and its numbers for rows of mass 1).
    """
    unit = targets / tf.where(mass > 0, mass, tf.ones_like(mass))
    return tf.nn.softmax_cross_entropy_with_logits(unit, logits) * mass[:, 0]


def _binary_cross_entropy(unit, weight, logits, threshold: float):
    """[N] weight * mean_c BCE(sigmoid(logits), unit) for targets ``unit`` [N, C] (rows of sum
    1, or 0 for a broken image) and the examples' ``weight`` [N, 1]; with ``threshold`` > 0
    the targets are binarized first (> threshold -> 1, else 0)."""
    if threshold:
        unit = tf.cast(unit > threshold, unit.dtype)
    terms = tf.nn.sigmoid_cross_entropy_with_logits(labels=unit, logits=logits)
    return tf.reduce_mean(terms, -1) * weight[:, 0]
