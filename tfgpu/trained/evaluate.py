"""A trained run's checkpoint evaluated on a split: what ``tfgpu-evaluate`` does.

Top-1, top-5, loss, per-class accuracy and the confusion matrix, printed and (``output``)
written as JSON; the confusion matrix also as a TensorBoard image, in the run's
``tensorboard/evaluate/`` (or ``tensorboard_dir``). It is the run's own evaluation
(``train.evaluator``: the run's Config, data spec, registry model, ``pipeline.make_eval_dataset``
and ``loops.make_eval_step``, EMA weights when the run kept them, its --eval_tta unless given),
so on the same checkpoint and split it gives the run's numbers. A ``.weights.h5`` file (the
run's ``final.weights.h5``, ``tfgpu-average``'s mean of checkpoints) holds the weights to
evaluate as they are.
"""

import os

import tensorflow as tf

from tfgpu.data.dataset_info import leak_line
from tfgpu.data.spec import split_spec
from tfgpu.errors import UsageError, op_error_cause, warn
from tfgpu.files import check_output, shown, write_json
from tfgpu.train.evaluator import Evaluator
from tfgpu.train.results import EVALUATE_TB, write_confusion_image
from tfgpu.trained import run


def evaluate(
    model_dir: str = "",
    checkpoint: str = "latest",
    data_dir: str = "",
    split: str = "validation",
    output: str = "",
    eval_batch_size: int = 0,
    log=print,
    tensorboard_dir: str = "",
    eval_tta: str = "",
) -> dict:
    """Evaluates as the command does; returns the results (what ``--output`` holds). The
    confusion matrix image goes to ``tensorboard_dir``, by default ``model_dir``'s
    tensorboard/evaluate/ (none without either). ``eval_tta``: "none" or "flip" ("": the
    run's --eval_tta)."""
    if not model_dir and not (checkpoint.endswith(".keras") and data_dir):
        raise UsageError("give --model_dir, or --checkpoint=FILE.keras with --data_dir")
    target = check_output(output) if output else ""  # before any work: a result is never lost
    config, path = run.config_and_checkpoint(
        model_dir, checkpoint, data_dir=data_dir, eval_batch_size=eval_batch_size, eval_tta=eval_tta
    )
    # --checkpoint=latest of a run still training: the newest when it is read.
    trained = run.load(config, path, newest_in=model_dir if checkpoint == "latest" else "")
    path = trained.checkpoint
    spec = split_spec(trained.spec, split)
    names = run.class_names(spec)  # before evaluating: the report must not fail after it
    report = {
        "checkpoint": path,
        "step": trained.step,
        "data_dir": spec.data_dir,
        "split": split,
        **_per_class_results(trained, spec, config.data),
        "class_names": names,
        "data_quality": leak_line(spec.data_dir, split),
    }
    log(format_report(report))
    if target:
        write_json(target, report)
        log(f"written to {shown(output)}")
    _write_image(report, tensorboard_dir or _default_tensorboard_dir(model_dir), log)
    return report


def _per_class_results(trained, spec, data) -> dict:
    """The evaluation of ``trained`` (``run.load``'s) on ``spec``'s split with ``data`` (the
    run's DataConfig), per-class counts included: the Evaluator's results."""
    evaluator = Evaluator(
        trained.model,
        trained.backend,
        spec,
        data,
        trained.eval_global_batch,
        trained.optimizer,
        per_class=True,
        tta=trained.config.train.eval_tta,
    )
    return evaluator()


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
