"""What the step and evaluation return: one update's sums (``StepMetrics``) and evaluation's
(``EvalSums``), their names in order, and which way each evaluation metric is better
(``BEST_METRICS``: --best_metric's choices, and ``checkpoint.best``'s order). No TensorFlow
here."""

from typing import Any, TypedDict

Tensor = Any  # a tf.Tensor; this module must not import TensorFlow


class StepMetrics(TypedDict):
    """One update's sums over the global batch."""

    loss: Tensor  # summed cross-entropy / global batch (so it is the batch mean)
    correct: Tensor  # examples whose arg-max is the (hard) label
    count: Tensor  # examples
    skipped: Tensor  # examples with a broken image (weight 0)
    grad_norm: Tensor  # global norm of the all-reduced gradients, before clipping
    clipped: Tensor  # 1 when --clip_norm clipped this update, else 0


class EvalSums(TypedDict):
    """Sums over the examples of the evaluation batches seen."""

    loss: Tensor  # over the examples with finite logits
    top1: Tensor  # an example with non-finite logits is wrong for top-1 and top-5
    top5: Tensor
    count: Tensor
    non_finite: Tensor  # examples whose logits are not all finite


STEP_METRICS = tuple(StepMetrics.__annotations__)
EVAL_SUMS = tuple(EvalSums.__annotations__)
BEST_METRICS = {"top1": "max", "top5": "max", "loss": "min"}  # metric -> which way is better
