"""Evaluating a model: the one ``Evaluator``, which the training loop (periodic and
end-of-run evaluation), the side-car evaluator (``inference.sidecar``) and ``tfgpu-evaluate``
share: the same data, preprocessing, compiled step and reduction, so that they give the same
numbers for the same checkpoint; and ``evaluate``, what ``tfgpu-evaluate`` does with it.

``evaluate``: a trained run's checkpoint on a split. Top-1, top-5, loss, per-class accuracy
and the confusion matrix, printed and (``output``) written as JSON; the confusion matrix also
as a TensorBoard image, in the run's ``tensorboard/evaluate/`` (or ``tensorboard_dir``). It is
the run's own evaluation (the run's settings, data spec, registry model,
``pipeline.make_eval_dataset`` and ``loops.make_eval_step``, EMA weights when the run kept
them, its --eval_tta unless given), so on the same checkpoint and split it gives the run's
numbers. A ``.weights.h5`` file (the run's ``final.weights.h5``, ``tfgpu-average``'s mean of
checkpoints) holds the weights to evaluate as they are.
"""

import contextlib
import os

import numpy as np
import tensorflow as tf

from tfgpu import compat
from tfgpu.data import pipeline
from tfgpu.data.dataset_info import leak_line
from tfgpu.data.spec import split_spec
from tfgpu.errors import op_error_cause, warn
from tfgpu.files import check_output, shown, write_json
from tfgpu.inference import opened
from tfgpu.metrics import EVAL_SUMS
from tfgpu.results.writer import EVALUATE_TB, write_confusion_image
from tfgpu.step.loops import make_eval_step


class Evaluator:
    """Top-1, top-5 and loss over the whole validation split (or ``spec``'s eval files),
    each example once, with the EMA weights when there are any. The dataset is made on first
    use, then reused. ``per_class``: also per-class accuracy and the confusion matrix
    (``tfgpu.evaluate``). ``tta``: --eval_tta (``loops.tta_logits``), which every result
    names. ``of(run)`` is a run's own (the loop's, the side-car's, an opened run's)."""

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

    def __call__(self, ema: bool = True) -> dict:
        """The results ({} without a validation split). ``ema=False``: the weights the model
        holds, not the optimizer's EMA (they already are what is evaluated: an average of
        checkpoints' evaluation weights, ``checkpoint.average``)."""
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


def of(trained, spec=None, per_class=False) -> Evaluator:
    """The evaluation of ``trained`` (an ``opened.Opened``) on its validation split, or
    ``spec``'s, with its run's evaluation batch and --eval_tta."""
    return Evaluator(
        trained.model,
        trained.backend,
        spec or trained.spec,
        trained.data,
        trained.eval_global_batch,
        trained.optimizer,
        per_class,
        trained.train.eval_tta,
    )


def evaluate(
    trained,
    split: str = "validation",
    output: str = "",
    log=print,
    tensorboard_dir: str = "",
) -> dict:
    """Evaluates ``trained`` (an ``opened.Opened``: the run at one checkpoint, with the
    overrides of the command's flags) on ``split`` as the command does; returns the results
    (what ``output`` holds). The confusion matrix image goes to ``tensorboard_dir``, by
    default the run's tensorboard/evaluate/ (none without either)."""
    target = check_output(output) if output else ""  # before any work: a result is never lost
    spec = split_spec(trained.spec, split)
    names = opened.class_names(spec)  # before evaluating: the report must not fail after it
    report = {
        "checkpoint": trained.checkpoint,
        "step": trained.step,
        "data_dir": spec.data_dir,
        "split": split,
        **_per_class_results(trained, spec),
        "class_names": names,
        "data_quality": leak_line(spec.data_dir, split),
    }
    log(format_report(report))
    if target:
        write_json(target, report)
        log(f"written to {shown(output)}")
    logdir = tensorboard_dir or _default_tensorboard_dir(trained.model_dir)
    _write_image(report, logdir, log)
    return report


def _per_class_results(trained, spec) -> dict:
    """The evaluation of ``trained`` (an ``opened.Opened``) on ``spec``'s split, per-class
    counts included: the Evaluator's results."""
    return of(trained, spec, per_class=True)()


def _default_tensorboard_dir(model_dir: str) -> str:
    """Where the image goes without --tensorboard_dir: the run's tensorboard/evaluate/."""
    if not model_dir:
        return ""
    return os.path.join(os.path.expanduser(model_dir), "tensorboard", EVALUATE_TB)


def _write_image(report: dict, logdir: str, log) -> None:
    """The confusion matrix as a TensorBoard image in ``logdir`` (nothing when empty). A
    folder that cannot be written is a warning: the results are printed and written already."""
    if not logdir:
        return
    logdir = os.path.expanduser(logdir)
    matrix, names = report["confusion_matrix"], report["class_names"]
    try:
        write_confusion_image(logdir, matrix, names, report["split"], report["step"] or 0)
    except (tf.errors.OpError, OSError) as err:
        why = op_error_cause(err)
        warn(f"no TensorBoard image: {logdir}: {why}")
        return
    log(f"confusion matrix image in {logdir} (tensorboard --logdir {logdir}, Images tab)")


def format_report(r: dict) -> str:
    """The printed result: totals, per-class accuracy, the confusion matrix."""
    step = f" (step {r['step']})" if r["step"] is not None else ""
    where = f"{shown(r['checkpoint'])}{step} on {r['split']} of {shown(r['data_dir'])}"
    tta = "" if r.get("tta", "none") == "none" else f" (TTA {r['tta']})"
    lines = [
        f"{where}: {r['num_examples']} examples{tta}",
        f"top1 {r['top1']:.4f}  top5 {r['top5']:.4f}  loss {r['loss']:.4f}",
    ]
    if r.get("data_quality"):
        lines.append(r["data_quality"])
    names, matrix = r["class_names"], r["confusion_matrix"]
    width = max(6, *(len(n) for n in names[:50]), len(str(max(map(max, matrix), default=0))))
    lines.append("per class (accuracy, examples):")
    for name, acc, row in zip(names, r["per_class_accuracy"], matrix):
        lines.append(f"  {name:>{width}}  {acc:.4f}  {sum(row)}")
    if len(names) <= 30:  # wider matrices are in --output only
        lines.append("confusion matrix (rows: true class, columns: predicted):")
        lines.append(" " * (width + 2) + "".join(f"{n:>{width + 1}}" for n in names))
        for name, row in zip(names, matrix):
            lines.append(f"  {name:>{width}}" + "".join(f"{v:>{width + 1}}" for v in row))
    return "\n".join(lines)
