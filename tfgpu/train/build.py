"""What a run is made of, built once from the sections and values the conductor
(``loop.run``) hands over:

  make_plan    the numbers a run derives once from its train settings, its data and its
               replicas (``Plan``)
  build_step   the TrainStep: the model, its optimizer, and the step's settings (from the
               model's, the optimizer's and the train sections)
  build_state  what training changes and what saves it (``TrainState``): the step, the
               update counters, the checkpoints, the best evaluation so far

The network itself (the model and its optimizer) is ``checkpoint.network.build``'s, the one
recipe that the uses of a trained run rebuild it by.
"""

from dataclasses import dataclass

import tensorflow as tf

from tfgpu.checkpoint.best import Best
from tfgpu.checkpoint.store import Checkpoints
from tfgpu.errors import ConfigError
from tfgpu.step.train_step import DynamicLossScale, TrainStep
from tfgpu.train.config import split_batch


@dataclass(frozen=True)
class Plan:
    """The numbers a run derives once from its config, its data and its replicas."""

    total_steps: int  # optimizer updates
    eval_every: int  # updates between evaluations (0: only at the end)
    replica_batch: int  # examples per replica per update (all micro-batches)
    grad_accum_steps: int  # micro-batches per update
    eval_global_batch: int


def make_plan(t, num_train: int, num_replicas: int) -> Plan:
    """The ``Plan`` of a run under ``t`` (its train.config.TrainConfig) on ``num_train``
    examples and ``num_replicas`` replicas; a batch that does not split is a ConfigError."""
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
class TrainState:
    """What training changes, and what saves it (as flax's TrainState, with its checkpoint
    manager): the model, the train step (which holds the optimizer and the loss scale), the
    update counters, the checkpoints and the best evaluation so far."""

    model: object  # keras.Model
    step: TrainStep
    global_step: tf.Variable
    skipped_updates: tf.Variable
    checkpoints: Checkpoints
    best: Best | None = None  # --keep_best, --early_stop_patience (not with a side-car)

    @property
    def optimizer(self):
        return self.step.optimizer


def build_step(
    model, optimizer, backend, m, o, t, *, step_fns: tuple, class_weights=None
) -> TrainStep:
    """The TrainStep of ``model`` (as the step runs it: rematerialized with --remat) and
    ``optimizer`` on ``backend`` under ``m`` (the model's settings: precision, XLA, sync
    BatchNorm), ``o`` (the optimizer's: loss, label smoothing, clipping, skipping) and ``t``
    (the train section: the batch and its split), for batches of the layout the train
    pipeline makes (``step_fns``: its (prepare, unpack), ``run_input.step_fns``;
    ``class_weights``: float [K], or None). Made inside the backend's scope: it builds the
    optimizer."""
    prepare, unpack = step_fns
    return TrainStep(
        model,
        optimizer,
        backend,
        global_batch_size=t.global_batch_size,
        grad_accum_steps=split_batch(t, backend.num_replicas)[1],
        label_smoothing=o.label_smoothing,
        clip_norm=o.clip_norm,
        loss_scale=DynamicLossScale() if m.dtype == "mixed_float16" else None,
        skip_non_finite=o.skip_non_finite,
        prepare=prepare,
        unpack=unpack,
        jit_compile=m.jit_compile,
        sync_batchnorm=m.sync_batchnorm,
        class_weights=_in_dtype(class_weights, m.dtype),
        loss=o.loss,
        bce_target_threshold=o.bce_target_threshold,
    )


def _in_dtype(weights, dtype: str):
    """Class weights in the loss' dtype: float64 for --dtype=float64, else float32."""
    if weights is None:
        return None
    return weights.astype("float64" if dtype == "float64" else "float32")


def build_state(model, step: TrainStep, backend, t, model_dir: str) -> TrainState:
    """The ``TrainState`` of ``model`` and ``step`` on ``backend``: its counters, the best
    evaluation (when ``t``, the train section, keeps it in the loop) and the checkpoints of
    all of it in ``model_dir`` (``Checkpoints.restore`` then gives every worker the chief's
    values). The counters and the best are made in the backend's scope."""
    with backend.scope():
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
        skipped_updates = tf.Variable(0, dtype=tf.int64, trainable=False)
        keeps = t.tracks_best_in_loop  # not with a side-car: it keeps the best
        best = Best(t, backend, model_dir) if keeps else None
    tracked = dict(model=model, optimizer=step.optimizer, step=global_step)
    tracked["skipped_updates"] = skipped_updates
    if step.loss_scale is not None:
        tracked.update(loss_scale=step.loss_scale.scale, good_steps=step.loss_scale.good_steps)
    optional = best.tracked() if best else {}  # only then: older checkpoints restore as before
    tracked.update(optional)
    keep = t.keep_checkpoints
    checkpoints = Checkpoints(tracked, backend, model_dir, keep, optional=optional)
    if best:
        best.checkpoint = checkpoints.checkpoint
    return TrainState(model, step, global_step, skipped_updates, checkpoints, best)
