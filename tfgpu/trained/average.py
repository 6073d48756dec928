"""The mean of a finished run's last K checkpoints, as timm's ``avg_checkpoints.py``, written as
a Keras ``.weights.h5`` file: what ``tfgpu-average`` does.

The run is built from its config.json as evaluation builds it (``trained.run``); each of the
newest K checkpoints of its checkpoints/ is read into it, and what evaluation would use of it
(its EMA weights when the run kept them, BatchNorm's statistics included; no optimizer state)
is averaged (``train.average``): what --average_checkpoints=K does at the end of a run. The
file holds the weights to evaluate as they are: ``tfgpu-evaluate``, ``tfgpu-predict`` and
``tfgpu-export`` take it as their ``--checkpoint`` beside the run's ``--model_dir``.
"""

import os

from tfgpu.errors import UsageError
from tfgpu.files import check_output, shown
from tfgpu.train import average as averaging
from tfgpu.trained import run
from tfgpu.trained.head import WEIGHTS_FILE, run_config

DEFAULT_OUTPUT = "averaged.weights.h5"  # in the run's folder


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
    if not output.endswith(WEIGHTS_FILE):
        raise UsageError(f"--output={shown(output)} must end with {WEIGHTS_FILE}")
    target = check_output(output)
    config = run_config(model_dir)
    paths = averaging.kept_checkpoints(os.path.join(config.model_dir, "checkpoints"))
    if last > len(paths):
        raise UsageError(
            f"--last={last}: {shown(model_dir)}/checkpoints keeps {len(paths)} checkpoint(s)"
        )
    paths = paths[-last:]
    r = run.build_run(config)
    values = averaging.mean_weights(r.model, r.optimizer, paths, lambda p: run.restore(r, p))
    averaging.assign_weights(r.model, values)
    _save(r.model, target)
    steps = [averaging.step_of(p) for p in paths]
    log(f"the mean of the checkpoints of steps {steps} written to {shown(output)}")
    return {"output": target, "checkpoints": paths, "steps": steps}


def _save(model, target: str) -> None:
    """``model``'s weights as the .weights.h5 file ``target``, whole or not at all: written to
    a temporary name beside it (Keras wants the suffix), then renamed."""
    temp = f"{target[: -len(WEIGHTS_FILE)]}.{os.getpid()}.tmp{WEIGHTS_FILE}"
    try:
        model.save_weights(temp)
        os.replace(temp, target)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
