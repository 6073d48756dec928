"""``python -m tfgpu.evaluate`` (``tfgpu-evaluate``): a trained run's checkpoint on a split.

    python -m tfgpu.evaluate --model_dir=runs/r50
        [--checkpoint=latest|best|PATH|FILE.weights.h5|FILE.keras] [--eval_tta=none|flip]
        [--data_dir=OTHER] [--split=validation] [--output=eval.json] [--tensorboard_dir=DIR]
    python -m tfgpu.evaluate --model_dir=runs/r50 --watch [--watch_interval_s=10]
        [--watch_timeout_s=3600]     # every checkpoint as it appears (tfgpu/watch.py)

Top-1, top-5, loss, per-class accuracy and the confusion matrix, printed and (``--output``)
written as JSON; the confusion matrix also as a TensorBoard image, in the run's
``tensorboard/evaluate/`` (or ``--tensorboard_dir``). It is the run's own evaluation
(``train.evaluator``: the run's Config, data spec, registry model, ``pipeline.make_eval_dataset``
and ``loops.make_eval_step``, EMA weights when the run kept them, its --eval_tta unless given),
so on the same checkpoint and split it gives the run's numbers. A ``.weights.h5`` file (the
run's ``final.weights.h5``, ``tfgpu-average``'s mean of checkpoints) holds the weights to
evaluate as they are.
"""

import os

from absl import app, flags

from tfgpu.train import use, watch
from tfgpu.errors import UsageError, warn
from tfgpu.cli.app import run_app, run_command
from tfgpu.files import check_output, shown, write_json

FLAGS = flags.FLAGS
PROG = "tfgpu-evaluate"


def define_flags() -> None:
    """The command's flags (those also tfgpu.main's keep their type: one process may hold both)."""
    own = {
        "model_dir": ("", "A training run's --model_dir (its config.json names the data)."),
        "checkpoint": (
            "latest",
            "latest (newest in checkpoints/), best (best/best.json's first), a checkpoint "
            "path (.../ckpt-N), a .weights.h5 file of the run (final.weights.h5, "
            "tfgpu-average's) or an exported .keras file.",
        ),
        "data_dir": ("", "Another converted dataset with the same classes (default: the run's)."),
        "split": ("validation", "Which split: train, validation or any other converted one."),
        "output": (
            "",
            "Also write the results to this file (checked before anything is loaded; written "
            "whole through a temporary file in its folder, then renamed).",
        ),
    }
    for name, (default, help_text) in own.items():
        if name not in FLAGS:
            flags.DEFINE_string(name, default, help_text)
    if "eval_batch_size" not in FLAGS:
        flags.DEFINE_integer("eval_batch_size", 0, "Images per batch (0: the run's).")


def define_own_flags() -> None:
    """The flags of tfgpu.evaluate alone (not tfgpu.predict's, which shares the others)."""
    if "eval_tta" not in FLAGS:
        flags.DEFINE_string(
            "eval_tta",
            "",
            "Test-time augmentation: none, or flip (the softmax probabilities of each image and "
            "its mirror averaged). Default: the run's --eval_tta.",
        )
    if "tensorboard_dir" not in FLAGS:
        flags.DEFINE_string(
            "tensorboard_dir",
            "",
            "Where to write the confusion matrix as a TensorBoard image (default: the run's "
            "tensorboard/evaluate/; without --model_dir, nowhere unless given).",
        )


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
    config, path = use.config_and_checkpoint(
        model_dir, checkpoint, data_dir=data_dir, eval_batch_size=eval_batch_size, eval_tta=eval_tta
    )
    from tfgpu.data.spec import split_spec

    trained = use.load(config, path)
    spec = split_spec(trained.spec, split)
    names = use.class_names(spec)  # before evaluating: the report must not fail after it
    report = {
        "checkpoint": path,
        "step": trained.step,
        "data_dir": spec.data_dir,
        "split": split,
        **_per_class_results(trained, spec, config.data),
        "class_names": names,
    }
    log(format_report(report))
    if target:
        write_json(target, report)
        log(f"written to {shown(output)}")
    _write_image(report, tensorboard_dir or _default_tensorboard_dir(model_dir), log)
    return report


def _per_class_results(trained, spec, data) -> dict:
    """The evaluation of ``trained`` (``use.load``'s) on ``spec``'s split with ``data`` (the
    run's DataConfig), per-class counts included: the Evaluator's results."""
    from tfgpu.train.evaluator import Evaluator

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
    from tfgpu.train.results import EVALUATE_TB

    if not model_dir:
        return ""
    return os.path.join(os.path.expanduser(model_dir), "tensorboard", EVALUATE_TB)


def _write_image(report: dict, logdir: str, log) -> None:
    """The confusion matrix as a TensorBoard image in ``logdir`` (nothing when empty). A
    folder that cannot be written is a warning: the results are printed and written already."""
    if not logdir:
        return
    import tensorflow as tf

    from tfgpu.errors import op_error_cause
    from tfgpu.train.results import write_confusion_image

    logdir = os.path.expanduser(logdir)
    matrix, names = report["confusion_matrix"], report["class_names"]
    try:
        write_confusion_image(logdir, matrix, names, report["split"], report["step"] or 0)
    except (tf.errors.OpError, OSError) as err:
        why = op_error_cause(err)
        warn(f"no TensorBoard image: {logdir}: {why}", PROG)
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


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from tfgpu.train.op_errors import translate

    return run_command(_command, prog=PROG, translate=translate)


def _command() -> None:
    if FLAGS.watch:  # a side-car evaluator (tfgpu/watch.py)
        one = ("checkpoint", "data_dir", "split", "output", "eval_batch_size", "tensorboard_dir")
        given = [f"--{name}" for name in (*one, "eval_tta") if FLAGS[name].present]
        if given:
            raise UsageError(
                f"{', '.join(given)}: for one checkpoint; --watch evaluates every checkpoint as "
                "the run's loop would (its validation split, its batch, its --eval_tta)"
            )
        watch.watch(FLAGS.model_dir, FLAGS.watch_interval_s, FLAGS.watch_timeout_s)
        return
    evaluate(
        FLAGS.model_dir,
        FLAGS.checkpoint,
        FLAGS.data_dir,
        FLAGS.split,
        FLAGS.output,
        FLAGS.eval_batch_size,
        tensorboard_dir=FLAGS.tensorboard_dir,
        # Given, or the run's: tfgpu.main's flag of the same name (one process may define
        # both) has a default of its own, which must not replace the run's.
        eval_tta=FLAGS.eval_tta if FLAGS["eval_tta"].present else "",
    )


def run():
    """Console-script entry point (``tfgpu-evaluate``)."""
    define_flags()
    define_own_flags()
    watch.define_flags()
    run_app(main, prog=PROG)


if __name__ == "__main__":
    run()
