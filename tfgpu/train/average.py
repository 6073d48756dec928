"""The mean of a run's last K checkpoints, as timm's ``avg_checkpoints.py``: at the end of a
run (--average_checkpoints=K, ``averaged``) and for a finished one (``tfgpu-average``).

What is averaged is what evaluation would use of each checkpoint: the model's weights with the
optimizer's EMA swapped in where the run keeps one (``compat.ema_weights``), BatchNorm's moving
statistics included (timm averages them too); the optimizer's own state is not. Float weights
are summed in float64 and divided once, so K equal checkpoints average to themselves bit for
bit; any other weight (an integer counter) is the newest checkpoint's.
"""

import contextlib
import json

import keras
import numpy as np
import tensorflow as tf

from tfgpu import compat
from tfgpu.errors import CheckpointError, first_line, warn
from tfgpu.train.checkpoints import DAMAGED, refresh_derived_state, variables_of


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
    """Sets ``model.weights`` to ``values`` (in their order); derived state follows."""
    for weight, value in zip(model.weights, values):
        weight.assign(value)
    refresh_derived_state(model)


def read_model_and_optimizer(model, optimizer, path: str) -> None:
    """Reads ``model`` and ``optimizer`` (the rest of the run's checkpoint is left out) from
    checkpoint ``path``; one that does not read back is a CheckpointError naming it."""
    try:
        tf.train.Checkpoint(model=model, optimizer=optimizer).read(path).expect_partial()
    except DAMAGED as err:
        reason = first_line(err, 200)
        raise CheckpointError(f"checkpoint {path} does not read back: {reason}") from None
    refresh_derived_state(model)


@contextlib.contextmanager
def averaged(r):
    """Inside: ``r``'s model (``build.Training``) holds the mean of the evaluation weights of
    its last --average_checkpoints checkpoints, on every worker (the chief reads them from
    --model_dir; the others take its values); evaluate it without the EMA swap, which is in
    the mean already. After: the last trained model and optimizer, as the final checkpoint
    holds them. Yields the steps averaged (fewer than K, with a warning, when fewer are kept:
    a run stopped early). A checkpoint that does not read back stops every worker with a
    CheckpointError."""
    held = variables_of([r.model, r.optimizer])
    last = [v.numpy() for v in held]
    values, outcome = _chief_mean(r) if r.backend.is_chief else (None, {})
    shared = json.loads(r.backend.all_gather_bytes(json.dumps(outcome).encode())[0])
    if shared.get("failure"):
        raise CheckpointError(shared["failure"])
    if r.backend.is_chief:
        for variable, value in zip(held, last):  # the reads moved the chief's optimizer
            variable.assign(value)
        assign_weights(r.model, values)
    r.backend.broadcast_from_chief(variables_of([r.model]))
    refresh_derived_state(r.model)
    try:
        yield shared["steps"]
    finally:
        for variable, value in zip(held, last):
            variable.assign(value)
        refresh_derived_state(r.model)


def _chief_mean(r) -> tuple:
    """(the mean weights of the run's last K checkpoints, {"steps": theirs}), or (None,
    {"failure": why}): what the chief reads."""
    k = r.config.train.average_checkpoints
    paths = kept_checkpoints(r.checkpoints.directory)[-k:]
    if len(paths) < k:
        warn(
            f"--average_checkpoints={k}: {r.checkpoints.directory} keeps {len(paths)} "
            "checkpoint(s) (the run stopped early?); averaging those"
        )
    if not paths:
        return None, {"failure": f"{r.checkpoints.directory} holds no checkpoint to average"}
    read = lambda path: read_model_and_optimizer(r.model, r.optimizer, path)  # noqa: E731
    try:
        values = mean_weights(r.model, r.optimizer, paths, read)
    except CheckpointError as err:
        return None, {"failure": str(err)}
    return values, {"steps": [step_of(p) for p in paths]}
