"""The mean of a run's last K checkpoints, as timm's ``avg_checkpoints.py``: at the end of a
run (--average_checkpoints=K, ``averaged``) and for a finished one (``tfgpu-average``,
``average``: written as a Keras ``.weights.h5`` file, which ``tfgpu-evaluate``,
``tfgpu-predict`` and ``tfgpu-export`` take as their ``--checkpoint`` beside the run's
``--model_dir``).

What is averaged is what evaluation would use of each checkpoint: the model's weights with the
optimizer's EMA swapped in where the run keeps one (``compat.ema_weights``), BatchNorm's moving
statistics included (timm averages them too); the optimizer's own state is not. Float weights
are summed in float64 and divided once, so K equal checkpoints average to themselves bit for
bit; any other weight (an integer counter) is the newest checkpoint's.
"""

import contextlib
import json
import os

import keras
import numpy as np
import tensorflow as tf

from tfgpu import compat
from tfgpu.checkpoint import network as networks
from tfgpu.checkpoint.store import DAMAGED, variables_of
from tfgpu.models.layers import refresh_derived_state
from tfgpu.errors import CheckpointError, UsageError, first_line, warn
from tfgpu.files import check_output, shown
from tfgpu.results.folder import WEIGHTS_FILE

DEFAULT_OUTPUT = "averaged.weights.h5"  # tfgpu-average's, in the run's folder


def kept_checkpoints(directory: str) -> list[str]:
    """The checkpoints the run's CheckpointManager keeps in ``directory``, oldest first."""
    state = tf.train.get_checkpoint_state(directory)
    return list(state.all_model_checkpoint_paths) if state else []


def step_of(path: str) -> int:
    """The update of checkpoint ``path`` (``.../ckpt-S``: the run numbers them by step)."""
    return int(path.rsplit("-", 1)[1])


def evaluation_weights(model, optimizer) -> list[np.ndarray]:
    """``model.weights``' values as evaluation sees them: with ``optimizer``'s EMA swapped in
    when it keeps one (None: as they are)."""
    held = compat.ema_weights(optimizer) if optimizer is not None else contextlib.nullcontext()
    with held:
        return [np.array(keras.ops.convert_to_numpy(w)) for w in model.weights]


def mean_weights(model, optimizer, paths: list[str], read) -> list[np.ndarray]:
    """The element-wise mean, over checkpoints ``paths``, of ``evaluation_weights(model,
    optimizer)`` once ``read(path)`` has read each into them (they hold the last one read
    after). Float weights: the float64 sum divided by len(paths), in their own dtype; others
    the last path's."""
    total = None
    for path in paths:
        read(path)
        values = evaluation_weights(model, optimizer)
        if total is None:
            total = [v.astype(np.float64) if _is_float(v) else v for v in values]
        else:
            total = [t + v if _is_float(v) else v for t, v in zip(total, values)]
    return [(t / len(paths)).astype(v.dtype) if _is_float(v) else t for t, v in zip(total, values)]


def _is_float(value: np.ndarray) -> bool:
    return np.issubdtype(value.dtype, np.floating)


def assign_weights(model, values: list[np.ndarray]) -> None:
    """Sets ``model.weights`` to ``values`` (in their order). What layers derive from their
    variables is the caller's to recompute once the values are final (``averaged``, after
    the broadcast); a .weights.h5 file holds the variables alone."""
    for weight, value in zip(model.weights, values):
        weight.assign(value)


def read_model_and_optimizer(model, optimizer, path: str) -> None:
    """Reads ``model``'s and ``optimizer``'s variables (the rest of the run's checkpoint is
    left out) from checkpoint ``path``, for ``mean_weights`` to read them back: what layers
    derive from their variables is not recomputed (``averaged`` does, once the mean is in).
    One that does not read back is a CheckpointError naming it."""
    try:
        tf.train.Checkpoint(model=model, optimizer=optimizer).read(path).expect_partial()
    except DAMAGED as err:
        reason = first_line(err, 200)
        raise CheckpointError(f"checkpoint {path} does not read back: {reason}") from None


@contextlib.contextmanager
def averaged(model, optimizer, backend, directory: str, k: int):
    """Inside: ``model`` holds the mean of the evaluation weights (``optimizer``'s EMA) of the
    last ``k`` checkpoints in ``directory`` (--average_checkpoints), on every worker of
    ``backend`` (the chief reads them; the others take its values); evaluate it without the
    EMA swap, which is in the mean already. After: the last trained model and optimizer, as
    the final checkpoint holds them. Yields the steps averaged (fewer than K, with a warning,
    when fewer are kept: a run stopped early). A checkpoint that does not read back stops
    every worker with a CheckpointError."""
    held = variables_of([model, optimizer])
    last = [v.numpy() for v in held]
    chief = backend.is_chief
    values, outcome = _chief_mean(model, optimizer, directory, k) if chief else (None, {})
    shared = json.loads(backend.all_gather_bytes(json.dumps(outcome).encode())[0])
    if shared.get("failure"):
        raise CheckpointError(shared["failure"])
    if chief:
        for variable, value in zip(held, last):  # the reads moved the chief's optimizer
            variable.assign(value)
        assign_weights(model, values)
    backend.broadcast_from_chief(variables_of([model]))
    refresh_derived_state(model)
    try:
        yield shared["steps"]
    finally:
        for variable, value in zip(held, last):
            variable.assign(value)
        refresh_derived_state(model)


def _chief_mean(model, optimizer, directory: str, k: int) -> tuple:
    """(the mean weights of the last ``k`` checkpoints in ``directory``, {"steps": theirs}),
    or (None, {"failure": why}): what the chief reads."""
    paths = kept_checkpoints(directory)[-k:]
    if len(paths) < k:
        warn(
            f"--average_checkpoints={k}: {directory} keeps {len(paths)} "
            "checkpoint(s) (the run stopped early?); averaging those"
        )
    if not paths:
        return None, {"failure": f"{directory} holds no checkpoint to average"}
    read = lambda path: read_model_and_optimizer(model, optimizer, path)  # noqa: E731
    try:
        values = mean_weights(model, optimizer, paths, read)
    except CheckpointError as err:
        return None, {"failure": str(err)}
    return values, {"steps": [step_of(p) for p in paths]}


def check_request(model_dir: str, last: int, output: str = "") -> str:
    """``tfgpu-average``'s file to write (``output``, default ``model_dir``'s
    averaged.weights.h5) once the request can be done: a run named, ``last`` at least 1, an
    output that is a .weights.h5 file and can be written. Else a UsageError, said before any
    checkpoint is read."""
    if not model_dir:
        raise UsageError("give --model_dir, the run whose checkpoints to average")
    if last < 1:
        raise UsageError(f"--last={last}: give how many checkpoints to average (1 or more)")
    output = output or os.path.join(os.path.expanduser(model_dir), DEFAULT_OUTPUT)
    if not output.endswith(WEIGHTS_FILE):
        raise UsageError(f"--output={shown(output)} must end with {WEIGHTS_FILE}")
    return check_output(output)


def average(network, model_dir: str, last: int, output: str, log=print) -> dict:
    """``tfgpu-average``: averages the newest ``last`` checkpoints of the run in ``model_dir``
    into ``output`` (``check_request``'s). ``network``: the run's network with fresh weights
    (``network.build``, with its optimizer where the run kept a weight average); each
    checkpoint is read into it, and what evaluation would use of it is averaged, as
    --average_checkpoints=K does at the end of a run. Returns {"output", "checkpoints": their
    paths, oldest first, "steps"}. A ``last`` above the checkpoints kept is a UsageError,
    said before any is read."""
    paths = kept_checkpoints(os.path.join(os.path.expanduser(model_dir), "checkpoints"))
    if last > len(paths):
        raise UsageError(
            f"--last={last}: {shown(model_dir)}/checkpoints keeps {len(paths)} checkpoint(s)"
        )
    paths = paths[-last:]
    read = lambda p: networks.restore(network, p)  # noqa: E731
    assign_weights(network.model, mean_weights(network.model, network.optimizer, paths, read))
    _save(network.model, output)
    steps = [step_of(p) for p in paths]
    log(f"the mean of the checkpoints of steps {steps} written to {shown(output)}")
    return {"output": output, "checkpoints": paths, "steps": steps}


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
