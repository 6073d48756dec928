"""A trained run opened for use: the one head of evaluate, predict, export, the side-car
evaluator and checkpoint averaging.

The run's own Config (``head.run_config``: its ``config.json``), its data spec, and its model
built by the registry and restored from a checkpoint (the newest, the best of
``best/best.json``, or a path), from a ``.weights.h5`` file of the run (its
``final.weights.h5``, ``tfgpu-average``'s), or an exported ``.keras`` file. Nothing here
preprocesses: the uses read images with the evaluation's own functions (``data.pipeline``).
"""

import os
from dataclasses import dataclass, replace

import keras
import tensorflow as tf

from tfgpu.config import Config
from tfgpu.data import run_input
from tfgpu.data import spec as data_spec
from tfgpu.distribute import backends
from tfgpu.errors import CheckpointError, DataError, UsageError, first_line
from tfgpu.train.best import BEST_DIR, BEST_FILE, best_checkpoint
from tfgpu.train.build import build
from tfgpu.train.checkpoints import DAMAGED, refresh_derived_state
from tfgpu.trained.head import WEIGHTS_FILE, head_config, run_config


def config_and_checkpoint(model_dir: str, which: str, **overrides) -> tuple:
    """(the run's Config with ``overrides``, the checkpoint ``which`` names). Without
    ``model_dir`` (a .keras file), the defaults with the file's image size."""
    config = head_config(model_dir, which, **overrides)
    path = checkpoint_path(model_dir, which)
    if config is None:
        config = run_config("", image_size=image_size_of(path), **overrides)
    return config, path


def checkpoint_path(model_dir: str, which: str) -> str:
    """The checkpoint ``which`` names: ``latest`` (the newest in checkpoints/), ``best``
    (best/best.json's first), a checkpoint prefix, a ``.weights.h5`` or a ``.keras`` file."""
    model_dir = os.path.expanduser(model_dir)
    if which in ("latest", "best") and not model_dir:
        raise UsageError(f"--checkpoint={which} needs --model_dir")
    if which == "latest":
        path = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
        if not path:
            raise CheckpointError(f"{model_dir}/checkpoints holds no checkpoint")
        return path
    if which == "best":
        path = best_checkpoint(model_dir)
        if not path:
            raise CheckpointError(
                f"{os.path.join(model_dir, BEST_DIR, BEST_FILE)} lists no checkpoint (train "
                "with --keep_best and --eval_every_steps)"
            )
        return path
    path = os.path.expanduser(which)
    is_file = path.endswith((".keras", WEIGHTS_FILE))
    found = os.path.isfile(path) if is_file else os.path.exists(path + ".index")
    if not found:
        raise CheckpointError(
            f"--checkpoint={which}: no such checkpoint, .weights.h5 or .keras file"
        )
    return path


@dataclass
class Trained:
    """A trained model as its run evaluates it."""

    config: Config
    backend: object
    spec: object  # data.spec.DataSpec of the run (or of --data_dir)
    model: object  # keras.Model
    optimizer: object  # its EMA weights are what evaluation uses; None for a file of weights
    step: int | None  # the checkpoint's update; None for a .keras or .weights.h5 file
    eval_global_batch: int
    checkpoint: str = ""  # the checkpoint (or file) read


def load(config: Config, path: str, newest_in: str = "") -> Trained:
    """The model of checkpoint (or .keras file) ``path``, for ``config``'s data. ``newest_in``:
    the run folder whose newest checkpoint ``path`` was when it was looked up: one that a
    training run deletes before it is read (--keep_checkpoints) is followed by the newest
    then (``restore_newest``)."""
    trained = _load(config, path, newest_in)
    return trained if trained.checkpoint else replace(trained, checkpoint=path)


def _load(config: Config, path: str, newest_in: str) -> Trained:
    batch = config.train.eval_batch_size or config.train.global_batch_size
    if path.endswith(".keras"):
        backend, spec = backends.setup(config.dist), data_spec.load_spec(config.data)
        model = keras.saving.load_model(path, compile=False, safe_mode=True)
        classes = model.output_shape[-1]
        if classes != spec.num_classes:
            raise UsageError(
                f"{path} predicts {classes} classes, the data {spec.num_classes} ({spec.data_dir})"
            )
        return Trained(config, backend, spec, model, None, None, batch)
    r = build_run(config)
    if path.endswith(WEIGHTS_FILE):
        load_weights(r.model, path)  # the weights evaluation uses already: no EMA to swap in
        return Trained(config, r.backend, r.spec, r.model, None, None, r.plan.eval_global_batch)
    step, path = restore_newest(r, path, newest_in) if newest_in else (restore(r, path), path)
    batch = r.plan.eval_global_batch
    return Trained(config, r.backend, r.spec, r.model, r.optimizer, step, batch, path)


FOLLOW_TRIES = 5  # newer checkpoints followed before a read that keeps failing is an error


def restore_newest(r, path: str, model_dir: str) -> tuple[int, str]:
    """(step, path) of the checkpoint read into ``r``: ``path``, ``model_dir``'s newest when it
    was looked up, or, when a training run writing there replaced it meanwhile (deleted past
    --keep_checkpoints, or half gone as it is read), the newest at that moment, up to
    ``FOLLOW_TRIES`` times. A newest checkpoint that does not read is a CheckpointError."""
    for _ in range(FOLLOW_TRIES):
        try:
            return restore(r, path), path
        except CheckpointError:
            newest = tf.train.latest_checkpoint(
                os.path.join(os.path.expanduser(model_dir), "checkpoints")
            )
            if newest is None or (newest == path and os.path.exists(path + ".index")):
                raise  # damaged, not replaced
            path = newest
    return restore(r, path), path


def load_weights(model, path: str) -> None:
    """Loads the Keras ``.weights.h5`` file ``path`` into ``model``; a file of another model
    (or not one) is a CheckpointError naming it."""
    try:
        model.load_weights(path)
    except (ValueError, OSError, KeyError, TypeError) as err:
        reason = first_line(err, 200)
        raise CheckpointError(f"{path} does not load into the run's model: {reason}") from None
    refresh_derived_state(model)  # EfficientNet's Normalization: the loaded statistics


def build_run(config: Config):
    """The run of ``config`` built as it trained (``build.build``: model, optimizer, counters,
    checkpoints) on ``config``'s backend, with weights to be read by ``restore``."""
    backend = backends.setup(config.dist)
    spec = data_spec.load_spec(config.data)
    return build(config, backend, run_input.prepare(config.data, config.optim.class_weights, spec))


def restore(r, path: str) -> int:
    """Reads checkpoint ``path`` into ``r`` (a ``build_run`` Training): all it holds, so that
    evaluation sees the run as it was at that step. Returns the checkpoint's step. A
    checkpoint that does not read back, or of another model, is a CheckpointError."""
    # Everything the run's checkpoints hold, all of it matched: a checkpoint of another model
    # is an error, not a half-restored model.
    try:
        r.checkpoints.read(path)
    except DAMAGED as err:
        reason = first_line(err, 200)
        raise CheckpointError(f"{path} does not read back into the run's model: {reason}") from None
    refresh_derived_state(r.model)  # EfficientNet's Normalization: the restored statistics
    return int(r.global_step.numpy())


def image_size_of(path: str) -> int:
    """The input side of the model in a .keras file (without a run's config.json)."""
    model = keras.saving.load_model(path, compile=False, safe_mode=True)
    return int(model.input_shape[1])


def class_names(spec) -> list[str]:
    """The class names of ``spec`` (its dataset_info.json, else "0", "1", ...) as text, for
    the commands to check before any image is read: a name that is a number stands as its
    digits; anything else (null, a list, true) is a DataError naming the file and the entry."""
    names = []
    for i, name in enumerate(data_spec.class_names(spec)):
        if isinstance(name, (int, float)) and not isinstance(name, bool):
            name = str(name)
        if not isinstance(name, str):
            shown = repr(name)[:40]
            where = os.path.join(spec.data_dir, "dataset_info.json")
            raise DataError(f"{where}: class_names[{i}]={shown} is not a name (a string)")
        names.append(name)
    return names
