"""``python -m tfgpu.average`` (``tfgpu-average``): the mean of a finished run's last K
checkpoints, as timm's ``avg_checkpoints.py``, written as a Keras ``.weights.h5`` file.

    python -m tfgpu.average --model_dir=runs/r50 --last=3 [--output=FILE.weights.h5]
    python -m tfgpu.evaluate --model_dir=runs/r50 --checkpoint=runs/r50/averaged.weights.h5

The run is built from its config.json as evaluation builds it (``train.use``); each of the
newest K checkpoints of its checkpoints/ is read into it, and what evaluation would use of it
(its EMA weights when the run kept them, BatchNorm's statistics included; no optimizer state)
is averaged (``train.average``): what --average_checkpoints=K does at the end of a run. The
file holds the weights to evaluate as they are: ``tfgpu-evaluate``, ``tfgpu-predict`` and
``tfgpu-export`` take it as their ``--checkpoint`` beside the run's ``--model_dir``.
"""

import os

from absl import app, flags

from tfgpu.cli import quiet as startup
from tfgpu.errors import UsageError
from tfgpu.cli.app import run_app, run_command
from tfgpu.files import check_output, shown
from tfgpu.train import use

FLAGS = flags.FLAGS
PROG = "tfgpu-average"
DEFAULT_OUTPUT = "averaged.weights.h5"  # in --model_dir


def define_flags() -> None:
    """The command's flags (``model_dir`` keeps tfgpu.main's type: one process may hold both)."""
    if "model_dir" not in FLAGS:
        flags.DEFINE_string("model_dir", "", "A finished training run's --model_dir.")
    if "last" not in FLAGS:
        flags.DEFINE_integer("last", 0, "How many of the run's newest checkpoints to average.")
    if "output" not in FLAGS:
        flags.DEFINE_string(
            "output",
            "",
            f"The .weights.h5 file to write (default: --model_dir's {DEFAULT_OUTPUT}).",
        )


def average(model_dir: str, last: int, output: str = "", log=print) -> dict:
    """Averages the newest ``last`` checkpoints of the run in ``model_dir`` into ``output``
    (default ``model_dir/averaged.weights.h5``), as the command does. Returns {"output",
    "checkpoints": their paths, oldest first, "steps"}. A missing run, a ``last`` below 1 or
    above the checkpoints kept, or an output that cannot be written is a UsageError, said
    before any checkpoint is read."""
    if not model_dir:
        raise UsageError("give --model_dir, the run whose checkpoints to average")
    if last < 1:
        raise UsageError(f"--last={last}: give how many checkpoints to average (1 or more)")
    output = output or os.path.join(os.path.expanduser(model_dir), DEFAULT_OUTPUT)
    if not output.endswith(use.WEIGHTS_FILE):
        raise UsageError(f"--output={shown(output)} must end with {use.WEIGHTS_FILE}")
    target = check_output(output)
    config = use.run_config(model_dir)  # no TensorFlow yet: a wrong --model_dir is one line
    startup.import_tensorflow()
    from tfgpu.train import average as averaging

    paths = averaging.kept_checkpoints(os.path.join(config.model_dir, "checkpoints"))
    if last > len(paths):
        raise UsageError(
            f"--last={last}: {shown(model_dir)}/checkpoints keeps {len(paths)} checkpoint(s)"
        )
    paths = paths[-last:]
    r = use.build_run(config)
    values = averaging.mean_weights(r.model, r.optimizer, paths, lambda p: use.restore(r, p))
    averaging.assign_weights(r.model, values)
    _save(r.model, target)
    steps = [averaging.step_of(p) for p in paths]
    log(f"the mean of the checkpoints of steps {steps} written to {shown(output)}")
    return {"output": target, "checkpoints": paths, "steps": steps}


def _save(model, target: str) -> None:
    """``model``'s weights as the .weights.h5 file ``target``, whole or not at all: written to
    a temporary name beside it (Keras wants the suffix), then renamed."""
    temp = f"{target[: -len(use.WEIGHTS_FILE)]}.{os.getpid()}.tmp{use.WEIGHTS_FILE}"
    try:
        model.save_weights(temp)
        os.replace(temp, target)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from tfgpu.train.op_errors import translate

    return run_command(_command, prog=PROG, translate=translate)


def _command() -> None:
    average(FLAGS.model_dir, FLAGS.last, FLAGS.output)


def run():
    """Console-script entry point (``tfgpu-average``)."""
    define_flags()
    run_app(main, prog=PROG)


if __name__ == "__main__":
    run()
