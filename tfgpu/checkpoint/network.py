"""The network of a run at one of its checkpoints: the one way every use of a trained run
(evaluate, predict, export, tfgpu-average, the side-car evaluator, the report) gets it, as
timm's ``create_model`` and ``load_checkpoint``.

``build`` makes the run's model from its stored settings through the registry (the model
registry's ``build_model``, a model of the user's own included, the run's dtype, its frozen
backbone) and, when the run kept a
weight average (--ema_decay) or the caller asks, the run's optimizer, which holds that
average. ``load`` restores it from a checkpoint (the newest, the best of ``best/best.json``,
or a path: the model, the optimizer and the step are read, nothing else), from a
``.weights.h5`` file of the run (its ``final.weights.h5``, ``tfgpu-average``'s), or takes an
exported ``.keras`` file whole. No plan, train step, data pipeline, best-so-far or checkpoint
manager of a training run is built. Keras 3 tracks the average among its optimizer's
variables by position alone (``optimizer/_variables/K`` in a checkpoint, after the update count
and before or after the slots, by optimizer class and options), so the optimizer is built as
the run built it, the one way to find those positions, and its slots are read with it.
"""

import contextlib
import os
from dataclasses import dataclass

import keras
import tensorflow as tf

from tfgpu import models
from tfgpu.checkpoint.best import BEST_DIR, BEST_FILE, best_checkpoint
from tfgpu.checkpoint.store import DAMAGED, refresh_derived_state
from tfgpu.config.rundir import WEIGHTS_FILE
from tfgpu.errors import CheckpointError, UsageError, first_line
from tfgpu.models import backbone
from tfgpu.optim import finetune


@dataclass
class Network:
    """A run's model with the weights of one checkpoint."""

    model: object  # keras.Model
    optimizer: object  # holds the EMA weights evaluation uses; None without them
    step: int | None  # the checkpoint's update; None for a .keras or .weights.h5 file
    checkpoint: str = ""  # the checkpoint (or file) read


def build(config, num_classes: int, num_train: int, optimizer: bool) -> Network:
    """The model of the run of ``config`` (its ``model`` settings, ``num_classes`` of its
    data), as its training built it, with fresh weights; with ``optimizer``, the run's
    optimizer too (its schedule over the run's updates: ``num_train`` examples), built on the
    variables the run trained."""
    keras.mixed_precision.set_global_policy(config.model.dtype)
    m = config.model
    model = models.build_model(
        m.name,
        num_classes,
        config.data.image_size,
        m.small_input,
        drop_path_rate=m.drop_path_rate,
        input_scaling=m.input_scaling,  # a model of one's own: scaled as it trained
    )
    if config.curriculum.progressive_stages > 1:  # its stages trained at smaller sides
        models.any_input_size(model)
    made = None
    if optimizer:  # before the freeze: its groups hold every variable that trains at some point
        made = finetune.run_optimizer(config, model, config.train.updates(num_train))
    if m.freeze == "backbone":
        backbone.freeze(model, m)
    if made is not None:
        made.build(model.trainable_variables)  # as the train step builds it
    return Network(model, made, None)


def load(config, path: str, spec, newest_in: str = "", optimizer=False, scope=None) -> Network:
    """The network of checkpoint (or .keras, .weights.h5 file) ``path`` for ``config`` and its
    data ``spec``, built inside ``scope()`` (a strategy's; none: as it is). ``optimizer``: the
    run's optimizer also when it kept no average (its learning rate at the checkpoint).
    ``newest_in``: the run folder whose newest checkpoint ``path`` was when it was looked up:
    one that a training run deletes before it is read (--keep_checkpoints) is followed by the
    newest then (``restore_newest``)."""
    if path.endswith(".keras"):
        model = keras.saving.load_model(path, compile=False, safe_mode=True)
        classes = model.output_shape[-1]
        if classes != spec.num_classes:
            raise UsageError(
                f"{path} predicts {classes} classes, the data {spec.num_classes} ({spec.data_dir})"
            )
        return Network(model, None, None, path)
    weights_only = path.endswith(WEIGHTS_FILE)  # the weights evaluation uses: no EMA to swap in
    with_optimizer = not weights_only and (optimizer or bool(config.optim.ema_decay))
    with (scope or contextlib.nullcontext)():
        network = build(config, spec.num_classes, spec.num_train, with_optimizer)
    if weights_only:
        load_weights(network.model, path)
    elif newest_in:
        network.step, path = restore_newest(network, path, newest_in)
    else:
        network.step = restore(network, path)
    network.checkpoint = path
    return network


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


def restore(network: Network, path: str) -> int:
    """Reads checkpoint ``path`` (a run's, or one of its best/) into ``network``: the model
    and, when it has one, the optimizer, every object of theirs matched, so that evaluation
    sees the run as it was at that step. Returns the checkpoint's step. A checkpoint that
    does not read back, or of another model, is a CheckpointError."""
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
    parts = dict(model=network.model, step=step)
    if network.optimizer is not None:
        parts["optimizer"] = network.optimizer
    try:
        read = tf.train.Checkpoint(**parts).read(path)
        read.assert_existing_objects_matched().expect_partial()  # not the trainer's counters
    except DAMAGED as err:
        reason = first_line(err, 200)
        raise CheckpointError(f"{path} does not read back into the run's model: {reason}") from None
    refresh_derived_state(network.model)  # EfficientNet's Normalization: the restored statistics
    return int(step.numpy())


FOLLOW_TRIES = 5  # newer checkpoints followed before a read that keeps failing is an error


def restore_newest(network: Network, path: str, model_dir: str) -> tuple[int, str]:
    """(step, path) of the checkpoint read into ``network``: ``path``, ``model_dir``'s newest
    when it was looked up, or, when a training run writing there replaced it meanwhile
    (deleted past --keep_checkpoints, or half gone as it is read), the newest at that moment,
    up to ``FOLLOW_TRIES`` times. A newest checkpoint that does not read is a
    CheckpointError."""
    for _ in range(FOLLOW_TRIES):
        try:
            return restore(network, path), path
        except CheckpointError:
            newest = tf.train.latest_checkpoint(
                os.path.join(os.path.expanduser(model_dir), "checkpoints")
            )
            if newest is None or (newest == path and os.path.exists(path + ".index")):
                raise  # damaged, not replaced
            path = newest
    return restore(network, path), path


def load_weights(model, path: str) -> None:
    """Loads the Keras ``.weights.h5`` file ``path`` into ``model``; a file of another model
    (or not one) is a CheckpointError naming it."""
    try:
        model.load_weights(path)
    except (ValueError, OSError, KeyError, TypeError) as err:
        reason = first_line(err, 200)
        raise CheckpointError(f"{path} does not load into the run's model: {reason}") from None
    refresh_derived_state(model)  # EfficientNet's Normalization: the loaded statistics


def image_size_of(path: str) -> int:
    """The input side of the model in a .keras file (without a run's config.json)."""
    model = keras.saving.load_model(path, compile=False, safe_mode=True)
    return int(model.input_shape[1])
