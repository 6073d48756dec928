"""``tfgpu-evaluate`` (``python -m tfgpu.evaluate``): a trained run's checkpoint on a split,
or with --watch every checkpoint of a run as it appears (the side-car evaluator).

    tfgpu-evaluate --model_dir=runs/r50
        [--checkpoint=latest|best|PATH|FILE.weights.h5|FILE.keras] [--eval_tta=none|flip]
        [--data_dir=OTHER] [--split=validation] [--output=eval.json] [--tensorboard_dir=DIR]
    tfgpu-evaluate --model_dir=runs/r50 --watch [--watch_interval_s=10]
        [--watch_timeout_s=3600]

``trained.evaluate`` says what is computed, ``trained.sidecar`` how a run is followed.
"""

from dataclasses import dataclass

from absl import app, flags

from tfgpu.cli import sidecar
from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import define_settings, settings_from
from tfgpu.cli.trained import RunHead, start
from tfgpu.errors import UsageError
from tfgpu.schema import setting
from tfgpu.train.faults import translate

FLAGS = flags.FLAGS
PROG = "tfgpu-evaluate"


@dataclass(frozen=True)
class EvaluateSettings(RunHead):
    """What tfgpu-evaluate evaluates, and where its results go."""

    split: str = setting("validation", "Which split: train, validation or any other converted one.")
    output: str = setting(
        "",
        "Also write the results to this file (checked before anything is loaded; written "
        "whole through a temporary file in its folder, then renamed).",
    )
    eval_batch_size: int = setting(0, "Images per batch (0: the run's).")
    eval_tta: str = setting(
        "",
        "Test-time augmentation: none, or flip (the softmax probabilities of each image and "
        "its mirror averaged). Default: the run's --eval_tta.",
    )
    tensorboard_dir: str = setting(
        "",
        "Where to write the confusion matrix as a TensorBoard image (default: the run's "
        "tensorboard/evaluate/; without --model_dir, nowhere unless given).",
    )
    watch: bool = setting(
        False,
        "Evaluate every checkpoint of --model_dir as it appears, until the run's last (a "
        "side-car evaluator; docs/evaluator.md).",
    )


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


def define_flags(flag_values=FLAGS) -> None:
    """The command's flags (those also tfgpu-train's keep their type: one process may hold
    both)."""
    define_settings(EvaluateSettings, PROG, flag_values)
    sidecar.define_flags(flag_values)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    return run_command(_command, prog=PROG, translate=translate)


def _command() -> None:
    s = settings_from(EvaluateSettings)
    if s.watch:
        given = [f"--{name}" for name in ONE_CHECKPOINT if FLAGS[name].present]
        if given:
            raise UsageError(
                f"{', '.join(given)}: for one checkpoint; --watch evaluates every checkpoint as "
                "the run's loop would (its validation split, its batch, its --eval_tta)"
            )
        sidecar.follow(s.model_dir, settings_from(sidecar.SidecarSettings))
        return
    start(s)
    from tfgpu.trained.evaluate import evaluate  # noqa: PLC0415 (TensorFlow: after its quiet start)

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
        eval_tta=s.eval_tta if FLAGS["eval_tta"].present else "",
    )


def run():
    """Console-script entry point (``tfgpu-evaluate``)."""
    define_flags()
    run_app(main, prog=PROG)


if __name__ == "__main__":
    run()
