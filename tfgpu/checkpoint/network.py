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
import shutil
import tempfile
from dataclasses import dataclass

import keras
import tensorflow as tf

from tfgpu import models
from tfgpu.checkpoint.best import BEST_DIR, BEST_FILE, best_checkpoint
from tfgpu.checkpoint.store import DAMAGED
from tfgpu.models.layers import refresh_derived_state
from tfgpu.results.folder import WEIGHTS_FILE
from tfgpu.errors import CheckpointError, UsageError, first_line
from tfgpu.models import backbone, prepare, whitening


@dataclass
class Network:
    """A run's model with the weights of one checkpoint."""

    model: object  # keras.Model
    optimizer: object  # holds the EMA weights evaluation uses; None without them
    step: int | None  # the checkpoint's update; None for a .keras or .weights.h5 file
    checkpoint: str = ""  # the checkpoint (or file) read
    frozen: str = ""  # what --freeze=backbone left training, in words ("": no freeze)
    initialized: tuple = ()  # the start lines of what prepare.initialize did (whitening, Dirac)


def build(
    m, num_classes: int, image_size: int, any_size=False, optimizer=None, first_images=None
) -> Network:
    """The network that ``m`` (a run's models.config.ModelConfig) describes for
    ``num_classes`` classes of ``image_size`` images, as the run built it, with fresh
    weights: the model at the run's dtype, its input side open (``any_size``: progressive
    stages train at smaller sides), its backbone frozen as ``m`` says (``frozen``: in
    words). ``optimizer(model)``: the run's optimizer (``optim.finetune.run_optimizer``),
    made before the freeze, since its groups hold every variable that trains at some point;
    made, not built (the train step builds it, or ``load`` before it reads a checkpoint).
    None: no optimizer. ``first_images(count)``: the run's first training images, for the
    initialisations a builder cannot make (``prepare.initialize``: a whitening layer from
    the data, --dirac_init; ``initialized``: their lines), the trainer's; None for a use,
    whose weights are then read (a whitening layer that trained, --whitening=trained, is
    made trainable still: the optimizer's variables follow)."""
    keras.mixed_precision.set_global_policy(m.dtype)
    model = models.build_model(
        m.name,
        num_classes,
        image_size,
        m.small_input,
        drop_path_rate=m.drop_path_rate,
        input_scaling=m.input_scaling,  # a model of one's own: scaled as it trained
    )
    if any_size:
        prepare.any_input_size(model)
    initialized = []
    if first_images is not None:
        sample = lambda: first_images(whitening.SAMPLE)  # noqa: E731 (read only if needed)
        initialized = prepare.initialize(model, m.dirac_init, sample, m.whitening)
    elif m.whitening == "trained":  # a use: the layer trained, the optimizer's variables hold it
        prepare.initialize(model, False, None, "trained")
    made = optimizer(model) if optimizer else None
    frozen = backbone.freeze(model, m) if m.freeze == "backbone" else ""
    return Network(model, made, None, frozen=frozen, initialized=tuple(initialized))


def with_optimizer_built(network: Network) -> Network:
    """``network`` with its optimizer (if any) built as the train step builds it, on the
    variables that train now, so that a checkpoint's slots and average read into it."""
    if network.optimizer is not None:
        network.optimizer.build(network.model.trainable_variables)
    return network


def load(path: str, spec, fresh, newest_in: str = "", scope=None) -> Network:
    """The network of checkpoint (or .keras, .weights.h5 file) ``path`` for the data of
    ``spec`` (a data.spec.DataSpec). ``fresh(optimizer)``: the run's network with fresh weights
    (``build``), with its optimizer when ``optimizer`` is True and the caller wants it (the
    weight average, the learning rate at the checkpoint); a .weights.h5 file holds the
    weights to use, and no optimizer is read with it. Built inside ``scope()`` (a strategy's;
    none: as it is). ``newest_in``: the run folder whose newest checkpoint ``path`` was when
    it was looked up: one that a training run deletes before it is read
    (--keep_checkpoints) is followed by the newest then (``restore_newest``)."""
    if path.endswith(".keras"):
        return keras_file(path, spec)
    weights_only = path.endswith(WEIGHTS_FILE)  # the weights evaluation uses: no EMA to swap in
    with (scope or contextlib.nullcontext)():
        network = with_optimizer_built(fresh(not weights_only))
    if weights_only:
        load_weights(network.model, path)
    elif newest_in:
        network.step, path = restore_newest(network, path, newest_in)
    else:
        network.step = restore(network, path)
    network.checkpoint = path
    return network


def keras_file(path: str, spec=None) -> Network:
    """The exported .keras file ``path`` whole, as a Network; one that predicts another
    number of classes than the data of ``spec`` (None: no data to hold it to) is a
    UsageError."""
    model = keras.saving.load_model(path, compile=False, safe_mode=True)
    classes = model.output_shape[-1]
    if spec is not None and classes != spec.num_classes:
        raise UsageError(
            f"{path} predicts {classes} classes, the data {spec.num_classes} ({spec.data_dir})"
        )
    return Network(model, None, None, path)


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
    up to ``FOLLOW_TRIES`` times. Each is read through hard links (``_pinned``), so that a
    trainer faster than the read (a checkpoint every update) cannot delete it mid-read. A
    newest checkpoint that does not read is a CheckpointError."""
    for _ in range(FOLLOW_TRIES):
        try:
            with _pinned(path) as readable:
                if readable is not None:
                    return restore(network, readable), path
        except CheckpointError:
            pass
        newest = tf.train.latest_checkpoint(
            os.path.join(os.path.expanduser(model_dir), "checkpoints")
        )
        if newest is None or (newest == path and os.path.exists(path + ".index")):
            return restore(network, path), path  # damaged, not replaced: its own error
        path = newest
    return restore(network, path), path


@contextlib.contextmanager
def _pinned(path: str):
    """Yields a prefix whose files are hard links to checkpoint ``path``'s, made in a hidden
    folder beside it and removed after: a trainer deleting ``path`` meanwhile removes its
    names, not the data read. Yields ``path`` itself where links cannot be made (another
    file system, a read-only or remote folder), None when ``path``'s files are already gone
    or incomplete (its .index and every data shard it names)."""
    folder, name = os.path.split(path)
    try:
        pins = tempfile.mkdtemp(prefix=".tfgpu-read-", dir=folder)
    except OSError:
        yield path
        return
    try:
        yield _linked(folder, name, pins)
    finally:
        shutil.rmtree(pins, ignore_errors=True)


def _linked(folder: str, name: str, pins: str) -> str | None:
    """``pins``/``name``: checkpoint ``name`` of ``folder`` hard-linked there; None when a
    file it needs is gone (or there is no data shard); ``folder``/``name`` itself where the
    file system makes no hard links."""
    try:
        files = [f for f in os.listdir(folder) if f.startswith(name + ".")]
        for f in files:
            os.link(os.path.join(folder, f), os.path.join(pins, f))
    except FileNotFoundError:
        return None
    except OSError:
        return os.path.join(folder, name)
    shards = [f for f in files if f.startswith(name + ".data-")]
    total = shards[0].rpartition("-of-")[2] if shards else ""
    if name + ".index" not in files or not total.isdigit() or len(shards) != int(total):
        return None
    return os.path.join(pins, name)


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
