"""The run's evaluation, which the loop, ``tfgpu.evaluate`` and the side-car evaluator
(``trained.sidecar``) share: the same data, preprocessing, compiled step and reduction, so that they
give the same numbers for the same checkpoint."""

import contextlib

import numpy as np

from tfgpu import compat
from tfgpu.data import pipeline
from tfgpu.metrics import EVAL_SUMS
from tfgpu.step.loops import make_eval_step
from tfgpu.train.build import Training


class Evaluator:
    """Top-1, top-5 and loss over the whole validation split (or ``spec``'s eval files),
    each example once, with the EMA weights when there are any. The dataset is made on first
    use, then reused. ``per_class``: also per-class accuracy and the confusion matrix
    (``tfgpu.evaluate``). ``tta``: --eval_tta (``loops.tta_logits``), which every result
    names. ``Evaluator.of(run)`` is the run's own."""

    def __init__(
        self,
        model,
        backend,
        spec,
        data,
        global_batch,
        optimizer=None,
        per_class=False,
        tta="none",
    ):
        num_classes = spec.num_classes if per_class else 0
        self._eval_step = make_eval_step(model, backend, num_classes, tta)
        self.tta = tta
        self._optimizer = optimizer
        self._steps = pipeline.eval_steps(spec.num_eval, global_batch)
        self._make = lambda: backend.distribute_dataset(
            lambda shard: pipeline.make_eval_dataset(
                spec,
                data,
                shard,
                batch_size=global_batch // backend.num_replicas,
                global_batch_size=global_batch,
            )
        )
        self._dataset = None
        self._per_class = per_class

    @classmethod
    def of(cls, training: Training, spec=None, per_class=False) -> "Evaluator":
        """The evaluation of ``training`` (on its validation split, or ``spec``'s), with its
        --eval_tta."""
        spec = spec or training.spec
        global_batch = training.plan.eval_global_batch
        return cls(
            training.model,
            training.backend,
            spec,
            training.config.data,
            global_batch,
            training.optimizer,
            per_class,
            training.config.train.eval_tta,
        )

    def __call__(self, ema: bool = True) -> dict:
        """The results ({} without a validation split). ``ema=False``: the weights the model
        holds, not the optimizer's EMA (they already are what is evaluated: an average of
        checkpoints' evaluation weights, ``train.average``)."""
        if not self._steps:
            return {}
        self._dataset = self._dataset or self._make()
        sums = dict.fromkeys(EVAL_SUMS, 0.0)
        confusion = 0.0
        use_ema = ema and self._optimizer is not None
        weights = compat.ema_weights(self._optimizer) if use_ema else contextlib.nullcontext()
        with weights:
            iterator = iter(self._dataset)
            for _ in range(self._steps):
                out = self._eval_step(next(iterator))
                sums = {k: sums[k] + float(out[k]) for k in EVAL_SUMS}
                if self._per_class:
                    confusion = confusion + out["confusion"].numpy().astype(np.float64)
        n, finite = max(sums["count"], 1.0), sums["count"] - sums["non_finite"]
        result = {k: sums[k] / n for k in ("top1", "top5")}
        # The loss of the examples whose logits are finite; None when there are none.
        result["loss"] = sums["loss"] / finite if finite > 0 else None
        result = dict(result, num_examples=int(sums["count"]), non_finite=int(sums["non_finite"]))
        result["tta"] = self.tta  # so that figures with and without TTA never mix unseen
        if self._per_class:
            per_class = np.diag(confusion) / np.maximum(confusion.sum(axis=1), 1.0)
            result["per_class_accuracy"] = per_class.tolist()
            result["confusion_matrix"] = confusion.astype(np.int64).tolist()
        return result
