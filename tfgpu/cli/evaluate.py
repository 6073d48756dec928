"""``tfgpu-evaluate`` (``python -m tfgpu.evaluate``): a trained run's checkpoint on a split,
or with --watch every checkpoint of a run as it appears (the side-car evaluator).

    tfgpu-evaluate --model_dir=runs/r50
        [--checkpoint=latest|best|PATH|FILE.weights.h5|FILE.keras]
        [--eval_tta=none|flip|flip_translate]
        [--data_dir=OTHER] [--split=validation] [--output=eval.json] [--tensorboard_dir=DIR]
    tfgpu-evaluate --model_dir=runs/r50 --watch [--watch_interval_s=10]
        [--watch_timeout_s=3600]

``inference.evaluate`` says what is computed, ``inference.sidecar`` how a run is followed.
"""

from absl import app

from tfgpu.cli import sidecar
from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import command_settings, define_flags
from tfgpu.cli import head
from tfgpu.errors import UsageError
from tfgpu.files import check_output
from tfgpu.train.op_errors import translate

PROG = "tfgpu-evaluate"  # its flags: cli/settings.py EvaluateSettings


# What evaluates one checkpoint: not with --watch, which evaluates each as the loop would.
ONE_CHECKPOINT = (
    "checkpoint",
    "data_dir",
    "split",
    "output",
    "eval_batch_size",
    "tensorboard_dir",
    "eval_tta",
)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    return run_command(_command, prog=PROG, translate=translate)


def _command() -> None:
    s, present = command_settings(PROG)
    if s.watch:
        given = [f"--{name}" for name in ONE_CHECKPOINT if name in present]
        if given:
            raise UsageError(
                f"{', '.join(given)}: for one checkpoint; --watch evaluates every checkpoint as "
                "the run's loop would (its validation split, its batch, its --eval_tta)"
            )
        sidecar.follow(s.model_dir, s.watch_interval_s, s.watch_timeout_s)
        return
    head.start(s)
    evaluate(
        s.model_dir,
        s.checkpoint,
        s.data_dir,
        s.split,
        s.output,
        s.eval_batch_size,
        tensorboard_dir=s.tensorboard_dir,
        # Given, or the run's: tfgpu-train's flag of the same name (one process may define
        # both) has a default of its own, which must not replace the run's.
        eval_tta=s.eval_tta if "eval_tta" in present else "",
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
    """Evaluates as the command does (``inference.evaluate.evaluate`` on the run opened by
    ``head.open_run``); returns the results (what ``--output`` holds). ``eval_tta``: "none",
    "flip" or "flip_translate" ("": the run's --eval_tta). Call it once TensorFlow has
    started."""
    if not model_dir and not (checkpoint.endswith(".keras") and data_dir):
        raise UsageError("give --model_dir, or --checkpoint=FILE.keras with --data_dir")
    if output:
        check_output(output)  # before any work: a result is never lost
    from tfgpu.inference import evaluate as evaluation  # noqa: PLC0415 (TensorFlow: after its quiet start)

    overrides = dict(data_dir=data_dir, eval_batch_size=eval_batch_size, eval_tta=eval_tta)
    # --checkpoint=latest of a run still training: the newest when it is read.
    trained = head.open_run(model_dir, checkpoint, newest=checkpoint == "latest", **overrides)
    return evaluation.evaluate(trained, split, output, log, tensorboard_dir)


def run():
    """Console-script entry point (``tfgpu-evaluate``)."""
    define_flags(command=PROG)
    run_app(main, prog=PROG, doc=__doc__)


if __name__ == "__main__":
    run()
