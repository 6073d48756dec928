"""``tfgpu-average`` (``python -m tfgpu.average``): the mean of a finished run's last K
checkpoints, written as a Keras ``.weights.h5`` file (``checkpoint.average``).

    tfgpu-average --model_dir=runs/r50 --last=3 [--output=FILE.weights.h5]
    tfgpu-evaluate --model_dir=runs/r50 --checkpoint=runs/r50/averaged.weights.h5
"""

from absl import app

from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import command_settings, define_flags
from tfgpu.cli.settings import RunHead
from tfgpu.cli import head
from tfgpu.train.op_errors import translate

PROG = "tfgpu-average"  # its flags: cli/settings.py AverageSettings


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    return run_command(_command, prog=PROG, translate=translate)


def _command() -> None:
    s, _ = command_settings(PROG)
    head.start(RunHead(model_dir=s.model_dir))
    average(s.model_dir, s.last, s.output)


def average(model_dir: str, last: int, output: str = "", log=print) -> dict:
    """Averages as the command does (``checkpoint.average.average`` of the run's network,
    ``head.open_run``'s, built as the run built it, with no checkpoint read); returns
    {"output", "checkpoints", "steps"}. Call it once TensorFlow has started."""
    from tfgpu.checkpoint import average as averaging  # noqa: PLC0415 (TensorFlow: after its quiet start)

    target = averaging.check_request(model_dir, last, output)
    trained = head.open_run(model_dir)  # the optimizer too where the run kept a weight average
    return averaging.average(trained.network, model_dir, last, target, log)


def run():
    """Console-script entry point (``tfgpu-average``)."""
    define_flags(command=PROG)
    run_app(main, prog=PROG, doc=__doc__)


if __name__ == "__main__":
    run()
