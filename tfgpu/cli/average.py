"""``tfgpu-average`` (``python -m tfgpu.average``): the mean of a finished run's last K
checkpoints, written as a Keras ``.weights.h5`` file (``trained.average``).

    tfgpu-average --model_dir=runs/r50 --last=3 [--output=FILE.weights.h5]
    tfgpu-evaluate --model_dir=runs/r50 --checkpoint=runs/r50/averaged.weights.h5
"""

from dataclasses import dataclass

from absl import app, flags

from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import define_settings, settings_from
from tfgpu.cli.trained import RunHead, start
from tfgpu.schema import setting
from tfgpu.train.faults import translate

FLAGS = flags.FLAGS
PROG = "tfgpu-average"


@dataclass(frozen=True)
class AverageSettings:
    """Which run's checkpoints to average, how many, and where the mean goes."""

    model_dir: str = setting("", "A finished training run's --model_dir.")
    last: int = setting(0, "How many of the run's newest checkpoints to average.")
    output: str = setting(
        "", "The .weights.h5 file to write (default: --model_dir's averaged.weights.h5)."
    )


def define_flags(flag_values=FLAGS) -> None:
    """The command's flags (``model_dir`` keeps tfgpu-train's type: one process may hold
    both)."""
    define_settings(AverageSettings, PROG, flag_values)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    return run_command(_command, prog=PROG, translate=translate)


def _command() -> None:
    s = settings_from(AverageSettings)
    start(RunHead(model_dir=s.model_dir))
    from tfgpu.trained.average import average  # noqa: PLC0415 (TensorFlow: after its quiet start)

    average(s.model_dir, s.last, s.output)


def run():
    """Console-script entry point (``tfgpu-average``)."""
    define_flags()
    run_app(main, prog=PROG)


if __name__ == "__main__":
    run()
