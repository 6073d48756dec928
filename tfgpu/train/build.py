"""What a run is made of, built once: ``build(config, backend, inputs) -> Training`` (the plan,
the model, the optimizer inside the train step, the counters and their checkpoints; ``inputs``:
what the run takes from data/, ``run_input.RunInput``) and ``train_batches(run, start_step)``,
the distributed train batches from a step on.
"""

from dataclasses import dataclass

import keras
import tensorflow as tf

from tfgpu import models, optim
from tfgpu.optim import finetune
from tfgpu.models import backbone, whitening
from tfgpu.checkpoint.best import Best
from tfgpu.checkpoint.store import Checkpoints
from tfgpu.config import Config, ConfigError
from tfgpu.train.config import split_batch
from tfgpu.data import readers, sample, sampling
from tfgpu.data.run_input import RunInput
from tfgpu.data.stream import Stream
from tfgpu.distribute import Backend
from tfgpu.step.train_step import DynamicLossScale, TrainStep


@dataclass(frozen=True)
class Plan:
    """The numbers a run derives once from its config, its data and its replicas."""

    total_steps: int  # optimizer updates
    eval_every: int  # updates between evaluations (0: only at the end)
    replica_batch: int  # examples per replica per update (all micro-batches)
    grad_accum_steps: int  # micro-batches per update
    eval_global_batch: int


def make_plan(config: Config, num_train: int, num_replicas: int) -> Plan:
    t = config.train
    steps_per_epoch = max(1, num_train // t.global_batch_size)
    total = t.updates(num_train)
    replica_batch, accum = split_batch(t, num_replicas)
    eval_global = t.eval_batch_size or t.global_batch_size
    if eval_global % num_replicas:
        raise ConfigError(
            f"--eval_batch_size={eval_global} does not divide by {num_replicas} replicas"
        )
    return Plan(
        total_steps=total,
        eval_every=t.eval_every_steps or round(t.eval_every_epochs * steps_per_epoch),
        replica_batch=replica_batch,
        grad_accum_steps=accum,
        eval_global_batch=eval_global,
    )


@dataclass
class Training:
    """What one run is made of: its settings and plan, the backend, and what training
    changes (model, optimizer inside the step, counters) with what saves it."""

    config: Config
    backend: Backend
    inputs: RunInput
    plan: Plan
    model: keras.Model
    step: TrainStep  # holds the optimizer and the loss scale
    global_step: tf.Variable
    skipped_updates: tf.Variable
    checkpoints: Checkpoints
    best: Best | None = None  # the best evaluation so far (--keep_best, --early_stop_patience)
    init_line: str = ""  # where --init_weights came from, how it fine-tunes: start-up lines

    @property
    def optimizer(self):
        return self.step.optimizer

    @property
    def spec(self):
        return self.inputs.spec

    @property
    def eval_global_batch(self) -> int:
        return self.plan.eval_global_batch


def _setup_lines(config: Config, spec, step, plan, balance_line: str, init_line: str) -> str:
    """What the run says of its set-up before training (class balance, repeated
    augmentation, the initial weights, fine-tuning groups, the learning rate in use): the
    lines that apply, joined."""
    tuning = finetune.describe(config, step.optimizer, plan.total_steps)
    batch = config.train.global_batch_size
    repeated = sampling.describe(config.curriculum.repeated_augment, spec.num_train, batch)
    rate = optim.describe_learning_rate(config.optim, batch)
    lines = (balance_line, repeated, init_line, tuning, rate)
    return "\n".join(line for line in lines if line)


def build(config: Config, backend, inputs: RunInput) -> Training:
    """Plans the run, then builds model, optimizer, train step, counters and checkpoints
    under the backend's scope (``Checkpoints.restore`` then gives every worker the chief's
    values). ``inputs``: what the run takes from data/ (``run_input.prepare``: the spec, the
    class weights the loss uses, the step's input functions)."""
    spec = inputs.spec
    plan = make_plan(config, spec.num_train, backend.num_replicas)
    keras.mixed_precision.set_global_policy(config.model.dtype)
    with backend.scope():
        model = models.build_model(
            config.model.name,
            spec.num_classes,
            config.data.image_size,
            config.model.small_input,
            drop_path_rate=config.model.drop_path_rate,
            input_scaling=config.model.input_scaling,
        )
        if config.curriculum.progressive_stages > 1:  # its stages train at smaller sides
            models.any_input_size(model)  # a model of one's own is probed: progressive.py
        made = models.initialize(
            model, config.model.dirac_init, _sample(config, spec), config.model.whitening
        )
        # Its groups (fine-tuning flags) hold every variable that trains at some point: made
        # before the freeze, which hides the backbone's from the step until it unfreezes.
        optimizer = finetune.run_optimizer(config, model, plan.total_steps)
        frozen = backbone.freeze(model, config.model) if config.model.freeze == "backbone" else ""
        loss_scale = DynamicLossScale() if config.model.dtype == "mixed_float16" else None
        step = build_step(
            config, model, optimizer, backend, inputs.step_fns, loss_scale, inputs.class_weights
        )
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
        skipped_updates = tf.Variable(0, dtype=tf.int64, trainable=False)
        keeps = config.train.tracks_best_in_loop  # not with a side-car: it keeps the best
        best = Best(config.train, backend, config.model_dir) if keeps else None
    init_line = getattr(model, "tfgpu_line", "")  # a model of one's own says what it is
    if config.model.init_weights:  # outside the scope: a .keras source needs no mirrored copies
        fresh = models.load_initial_weights(model, config.model.init_weights)
        init_line = "\n".join(filter(None, (init_line, _init_line(config, model, fresh, frozen))))
    elif init_line and frozen:  # its own weights (a .keras file, a preset) are fine-tuned
        init_line += f"\nfine-tune: {frozen}"
    init_line = "\n".join(filter(None, (*made, init_line)))
    init_line = _setup_lines(config, spec, step, plan, inputs.balance_line, init_line)
    tracked = dict(model=model, optimizer=step.optimizer, step=global_step)
    tracked["skipped_updates"] = skipped_updates
    if loss_scale:
        tracked.update(loss_scale=loss_scale.scale, good_steps=loss_scale.good_steps)
    optional = best.tracked() if best else {}  # only then: older checkpoints restore as before
    tracked.update(optional)
    keep = config.train.keep_checkpoints
    checkpoints = Checkpoints(tracked, backend, config.model_dir, keep, optional=optional)
    if best:
        best.checkpoint = checkpoints.checkpoint
    parts = (model, step, global_step, skipped_updates, checkpoints, best, init_line)
    return Training(config, backend, inputs, plan, *parts)


def _sample(config: Config, spec):
    """``sample_images()`` for ``models.initialize``: the first training images, read when
    called (``data.sample``; what a whitening layer is initialised from)."""
    return lambda: sample.first_train_images(spec, config.data, whitening.SAMPLE)


def _init_line(config: Config, model, fresh: list, frozen: str) -> str:
    """The start-up line that says where the weights came from, what is new, and what the
    freeze (``frozen``: its words, "" for none) leaves training."""
    m = config.model
    line = f"init: weights from --init_weights={m.init_weights}"
    if fresh:
        line += f"; new (not in the file): {', '.join(fresh)} ({model.output_shape[-1]} classes)"
    if frozen:
        line += f"; {frozen}"
        if m.unfreeze_after_steps:
            line += f" for {m.unfreeze_after_steps} updates"
    return line + " (a checkpoint in --model_dir, if any, replaces them)"


def build_step(
    config: Config, model, optimizer, backend, step_fns: tuple, loss_scale=None, class_weights=None
):
    """The TrainStep for batches of the layout the train pipeline makes (``step_fns``: its
    (prepare, unpack), ``run_input.step_fns``; ``class_weights``: float [K], or None)."""
    prepare, unpack = step_fns
    if config.model.remat:  # only the step runs the blocks so; checkpoints hold ``model``
        staged = config.curriculum.progressive_stages > 1
        model = models.rematerialized(model, config.model.name, any_size=staged)
    return TrainStep(
        model,
        optimizer,
        backend,
        global_batch_size=config.train.global_batch_size,
        grad_accum_steps=split_batch(config.train, backend.num_replicas)[1],
        label_smoothing=config.optim.label_smoothing,
        clip_norm=config.optim.clip_norm,
        loss_scale=loss_scale,
        skip_non_finite=config.optim.skip_non_finite,
        prepare=prepare,
        unpack=unpack,
        jit_compile=config.model.jit_compile,
        sync_batchnorm=config.model.sync_batchnorm,
        class_weights=_in_dtype(class_weights, config.model.dtype),
        loss=config.optim.loss,
        bce_target_threshold=config.optim.bce_target_threshold,
    )


def _in_dtype(weights, dtype: str):
    """Class weights in the loss' dtype: float64 for --dtype=float64, else float32."""
    if weights is None:
        return None
    return weights.astype("float64" if dtype == "float64" else "float32")


def train_maker(training: Training, start_step: int, data=None):
    """``readers.train_maker`` for the run of ``training``, from update ``start_step`` on
    (``data``: the DataConfig to read by, a progressive stage's; None: the run's)."""
    config = training.config
    gbs = config.train.global_batch_size
    stream = Stream(
        batch_size=training.plan.replica_batch,
        global_batch_size=gbs,
        seed=config.seed,
        deterministic=config.deterministic,
        start_index=start_step * gbs,
        repeats=config.curriculum.repeated_augment,
    )
    model_dir, is_chief = config.model_dir, training.backend.is_chief
    data = data or config.data
    return readers.train_maker(training.spec, data, stream, model_dir=model_dir, is_chief=is_chief)


def train_batches(training: Training, start_step: int, make=None):
    """An iterator of distributed train batches from update ``start_step`` on (``make``: a
    ``train_maker`` already built for it)."""
    make = make or train_maker(training, start_step)
    return iter(training.backend.distribute_dataset(make))
