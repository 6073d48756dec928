"""The outer loop: steps, evaluation, checkpoints, logs, export and the run summary."""

import contextlib
import hashlib
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from tfgpu import demo, distribute, input_pipeline, models, optim, preprocess
from tfgpu.config import Config, ConfigError, per_replica_batch
from tfgpu.faults import CheckpointError, Preempted, PreemptionGuard
from tfgpu.results import RunWriter, export_model, format_progress
from tfgpu.step import DynamicLossScale, NonFiniteLoss, TrainStep


def _set_determinism(config: Config) -> None:
    keras.utils.set_random_seed(config.seed)
    set_op_determinism(config.deterministic)


def set_op_determinism(enabled: bool) -> None:
    """Turns TensorFlow's process-wide op determinism on or off: a later run in the same
    process must not inherit it. TF exports only the 'on' switch; 'off' is internal."""
    from tensorflow.python.framework import config as tf_config

    if enabled:
        tf.config.experimental.enable_op_determinism()
    else:
        tf_config.disable_op_determinism()


def _data(config: Config):
    """The DataSpec of the run: the demo dataset when no --data_dir (built once, cached)."""
    if config.synthetic_data:
        classes = config.num_classes or 1000
        return input_pipeline.DataSpec("", classes, 0, (), (), 1_281_167, 0)
    if config.tfds_name:
        return input_pipeline.load_tfds_spec(
            config.tfds_name, config.tfds_data_dir, config.num_classes
        )
    data_dir = os.path.expanduser(config.data_dir) if config.data_dir else demo.build_demo_dataset()
    return input_pipeline.load_data_spec(
        data_dir, config.num_classes, config.label_offset, config.skip_truncated_shards
    )


def _new_window() -> dict:
    """Sums of one logging window's train metrics."""
    sums = dict.fromkeys(("loss", "correct", "count", "steps", "skipped"), 0.0)
    return dict(sums, updates=0, start=time.time())


def weights_fingerprint(model: keras.Model) -> str:
    """SHA-256 of every weight's bytes, in order: equal on workers that ended identical."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()[:16]


def total_steps(config: Config, num_train: int) -> int:
    """Optimizer updates of the run: --train_steps, or --epochs over the train split."""
    if config.train_steps:
        return config.train_steps
    epochs = config.epochs or 1.0
    return max(1, int(epochs * num_train // config.global_batch_size))


def _pipeline_config(config: Config) -> input_pipeline.PipelineConfig:
    return input_pipeline.PipelineConfig(
        image_size=config.image_size,
        seed=config.seed,
        deterministic=config.deterministic,
        random_flip=config.random_flip,
        crop_min_area=config.crop_min_area,
        dct_scaled_decode=config.dct_scaled_decode,
        eval_crop_fraction=config.eval_crop_fraction,
        shuffle_buffer=config.shuffle_buffer,
        cycle_length=config.cycle_length,
        threadpool_size=config.data_threads,
        cache_eval=config.cache_eval,
        block_length=config.block_length,
        ram_budget_mb=config.ram_budget_mb,
        eval_snapshot_dir=config.eval_snapshot_dir,
        skip_truncated=config.skip_truncated_shards,
        mixup_alpha=config.mixup_alpha,
        cutmix_alpha=config.cutmix_alpha,
        # Synthetic batches are uint8 like real ones: their float work is always on device.
        preprocess_on="device" if config.synthetic_data else config.preprocess_on,
        randaugment_ops=config.randaugment_ops,
        randaugment_magnitude=config.randaugment_magnitude,
        resize_on=resolve_resize_on(
            config.resize_on, bool(tf.config.list_logical_devices("GPU")), config.preprocess_on
        ),
    )


def jit_compiled(replica_step, image_size: int):
    """``replica_step`` with XLA compiling the part with the FLOPs; the loop stays a graph.

    Crops that arrive un-resized (``--resize_on=device``) change length every step, and XLA
    would compile again for each: they are resized first, outside XLA
    (``preprocess.resize_in_batch``), and XLA sees fixed-shape images.
    """
    compiled = tf.function(replica_step, jit_compile=True)
    return lambda batch: compiled(preprocess.resize_in_batch(batch, image_size))


def resolve_resize_on(resize_on: str, has_gpu: bool, preprocess_on: str = "device") -> str:
    """``--resize_on=auto``: on the device when it is a GPU that does the float work. Else
    the resize would run on CPU cores, where the step's gather-based resize costs ~10x the
    host's ResizeBilinear (measured: 2.7 vs 0.25 ms of CPU per image, bench/README.md)."""
    if resize_on != "auto":
        return resize_on
    return "device" if has_gpu and preprocess_on == "device" else "host"


class Trainer:
    """Holds what one run builds (backend, model, step, checkpoints) and runs the loop."""

    def __init__(self, config: Config, backend, writer: RunWriter):
        self.config, self.backend, self.writer = config, backend, writer
        self.skipped_records = 0
        self.spec = _data(config)
        # Derived once: the train dataset and the step must agree on it (where crops resize).
        self.pipeline = _pipeline_config(config)
        self.steps = total_steps(config, self.spec.num_train)
        steps_per_epoch = max(1, self.spec.num_train // config.global_batch_size)
        epochs_between_evals = config.eval_every_epochs * steps_per_epoch
        self.eval_every = config.eval_every_steps or round(epochs_between_evals)
        self.replica_batch = per_replica_batch(config, backend.num_replicas)
        self.eval_global = config.eval_batch_size or config.global_batch_size
        if self.eval_global % backend.num_replicas:
            raise ConfigError(
                f"--eval_batch_size={self.eval_global} does not divide by "
                f"{backend.num_replicas} replicas"
            )
        self._build()

    def _build(self) -> None:
        c = self.config
        keras.mixed_precision.set_global_policy(c.dtype)
        with self.backend.scope():
            self.model = models.build_model(
                c.model, self.spec.num_classes, c.image_size, c.small_input
            )
            lr = optim.scaled_learning_rate(
                c.learning_rate, c.global_batch_size, c.scale_lr_with_batch
            )
            schedule = optim.WarmupDecay(lr, self.steps, c.warmup_steps, c.lr_schedule)
            optimizer = optim.build_optimizer(
                c.optimizer, schedule, c.momentum, c.weight_decay, c.ema_decay
            )
            loss_scale = DynamicLossScale() if c.dtype == "mixed_float16" else None
            self.step = TrainStep(
                self.model,
                optimizer,
                self.backend,
                c.global_batch_size,
                c.grad_accum_steps,
                c.label_smoothing,
                c.clip_norm,
                loss_scale,
                skip_non_finite=c.skip_non_finite,
                preprocess_fn=preprocess.device_fn(self.spec.num_classes, self.pipeline),
            )
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.skipped_updates = tf.Variable(0, dtype=tf.int64, trainable=False)
        if c.init_weights:  # outside the scope: a .keras source model needs no mirrored copies
            models.load_initial_weights(self.model, c.init_weights)
        self.optimizer = self.step.optimizer
        self.backend.broadcast_initial_state(self.model.variables + self.optimizer.variables)
        tracked = {"model": self.model, "optimizer": self.optimizer, "step": self.global_step}
        tracked["skipped_updates"] = self.skipped_updates
        if loss_scale:
            tracked.update(loss_scale=loss_scale.scale, good_steps=loss_scale.good_steps)
        self.checkpoint = tf.train.Checkpoint(**tracked)
        directory = self.backend.checkpoint_dir(os.path.join(c.model_dir, "checkpoints"))
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, c.keep_checkpoints)

    def restore(self) -> int:
        """Restores the newest checkpoint of --model_dir, if any; returns the step reached."""
        real_dir = os.path.join(self.config.model_dir, "checkpoints")
        latest = tf.train.latest_checkpoint(real_dir)
        if latest:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
            self.writer.info(f"resumed from {latest} at step {int(self.global_step.numpy())}")
        return int(self.global_step.numpy())

    def save(self, final: bool = False) -> None:
        """Writes a checkpoint. A failed write (disk full, ...) is reported loudly; training
        goes on with the previous checkpoint kept, except at the end, where it is an error."""
        try:
            self.manager.save(checkpoint_number=self.global_step)
        except (tf.errors.OpError, OSError) as err:
            message = f"checkpoint at step {int(self.global_step.numpy())} failed: {err}"
            if final:
                raise CheckpointError(message) from None
            print(
                f"tfgpu: WARNING: {message}; the previous checkpoint is kept",
                file=sys.stderr,
                flush=True,
            )

    # --- datasets ---------------------------------------------------------------------
    def _train_iterator(self, start_step: int):
        c = self.config
        if c.synthetic_data:
            make = lambda shard: input_pipeline.make_synthetic_dataset(
                self.replica_batch, c.image_size, self.spec.num_classes
            )
        else:
            make = lambda shard: input_pipeline.make_train_dataset(
                self.spec,
                self.pipeline,
                shard,
                self.replica_batch,
                c.global_batch_size,
                start_index=start_step * c.global_batch_size,
            )
        return iter(self.backend.distribute_dataset(make))

    def _eval_dataset(self):
        eval_replica = self.eval_global // self.backend.num_replicas
        return self.backend.distribute_dataset(
            lambda shard: input_pipeline.make_eval_dataset(
                self.spec, self.pipeline, shard, eval_replica, self.eval_global
            )
        )

    # --- compiled functions -----------------------------------------------------------
    def _compile(self):
        step = self.step

        skip_bad = self.step.skips_non_finite

        @tf.function
        def train_loop(iterator, num_steps):
            """``num_steps`` updates; returns summed metrics of the finite ones and the first
            non-finite step (-1 if none). Without skipping, it stops at that step."""
            totals = {k: tf.constant(0.0) for k in ("loss", "correct", "count", "steps", "skipped")}
            first_bad = tf.constant(-1, tf.int64)
            for _ in tf.range(num_steps):
                m = step.update(next(iterator))
                self.global_step.assign_add(1)
                ok = tf.logical_and(m["finite"], tf.math.is_finite(m["loss"]))
                m["steps"] = tf.constant(1.0)
                totals = {k: totals[k] + tf.where(ok, m[k], 0.0) for k in totals}
                self.skipped_updates.assign_add(tf.cast(tf.logical_not(ok), tf.int64))
                if first_bad < 0 and not ok:
                    first_bad = self.global_step.read_value()
                if not skip_bad and not ok:
                    break
            return totals, first_bad

        if self.config.jit_compile:
            step.replica_step = jit_compiled(step.replica_step, self.config.image_size)

        @tf.function
        def eval_step(batch):
            def replica(batch):
                logits = tf.cast(
                    self.model(tf.cast(batch["image"], tf.float32), training=False), tf.float32
                )
                labels, weight = batch["label"], batch["weight"]
                loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
                top5 = tf.cast(
                    tf.math.in_top_k(labels, logits, min(5, logits.shape[-1])), tf.float32
                )
                top1 = tf.cast(tf.equal(tf.argmax(logits, -1, tf.int32), labels), tf.float32)
                return {
                    "loss": tf.reduce_sum(loss * weight),
                    "top1": tf.reduce_sum(top1 * weight),
                    "top5": tf.reduce_sum(top5 * weight),
                    "count": tf.reduce_sum(weight),
                }

            return self.backend.reduce_sum(self.backend.run(replica, args=(batch,)))

        self.train_loop, self.eval_step = train_loop, eval_step

    # --- the loop ---------------------------------------------------------------------
    @contextlib.contextmanager
    def ema_weights(self):
        """Inside, the model holds the EMA of its weights (when --ema_decay is set)."""
        if not self.optimizer.use_ema:
            yield
            return
        trained = [v.numpy() for v in self.optimizer._trainable_variables]
        for var, average in zip(
            self.optimizer._trainable_variables, self.optimizer._model_variables_moving_average
        ):
            var.assign(average)
        try:
            yield
        finally:
            for var, value in zip(self.optimizer._trainable_variables, trained):
                var.assign(value)

    def evaluate(self) -> dict:
        """Top-1, top-5 and loss over the whole validation split (each example once), with
        the EMA weights when there are any."""
        with self.ema_weights():
            return self._evaluate()

    def _evaluate(self) -> dict:
        if not self.spec.num_eval:
            return {}
        if not hasattr(self, "_eval_ds"):
            self._eval_ds = self._eval_dataset()
        sums = {"loss": 0.0, "top1": 0.0, "top5": 0.0, "count": 0.0}
        iterator = iter(self._eval_ds)
        for _ in range(input_pipeline.eval_steps(self.spec.num_eval, self.eval_global)):
            out = self.eval_step(next(iterator))
            sums = {k: sums[k] + float(out[k]) for k in sums}
        n = max(sums["count"], 1.0)
        return {
            "loss": sums["loss"] / n,
            "top1": sums["top1"] / n,
            "top5": sums["top5"] / n,
            "num_examples": int(sums["count"]),
        }

    def _next_stop(self, step: int) -> int:
        """The next step at which something other than training happens."""
        c = self.config
        stops = [self.steps, step + c.steps_per_loop]
        for every in (c.log_every_steps, self.eval_every, c.checkpoint_every_steps):
            if every:
                stops.append((step // every + 1) * every)
        return min(stops)

    def fit(self, guard=None) -> dict:
        """Trains from the restored step to the end; returns the throughput numbers.

        ``guard`` (a PreemptionGuard) is polled between loops: when it was signalled, a
        checkpoint is written and Preempted raised.
        """
        c = self.config
        self._compile()
        step = self.restore()
        iterator = self._train_iterator(step)
        window, timed = _new_window(), {"images": 0, "seconds": 0.0, "windows": 0}
        while step < self.steps:
            n = self._next_stop(step) - step
            totals, first_bad = self.train_loop(iterator, tf.constant(n))
            if int(first_bad) >= 0 and not self.step.skips_non_finite:
                raise NonFiniteLoss(f"non-finite loss or gradients at step {int(first_bad)}")
            step = int(self.global_step.numpy())
            window.update({k: window[k] + float(totals[k]) for k in totals})
            window["updates"] += n
            self.skipped_records += int(float(totals["skipped"]))  # broken images, weight 0
            if step % c.log_every_steps == 0 or step == self.steps:
                self._log_window(step, window, timed)
                window = _new_window()
            if self.eval_every and step % self.eval_every == 0 and step < self.steps:
                self.writer.log_eval(step, self.evaluate())
            if step % c.checkpoint_every_steps == 0 and step < self.steps:
                self.save()
            if guard is not None and guard.should_stop(self.backend):
                self.save()
                raise Preempted(
                    f"stopped by {guard.signal_name} at step {step}; checkpoint written"
                )
        return {"images_per_sec": timed["images"] / timed["seconds"] if timed["seconds"] else None}

    def _log_window(self, step: int, window: dict, timed: dict) -> None:
        seconds = time.time() - window["start"]
        images = window["updates"] * self.config.global_batch_size
        if timed["windows"]:  # the first window includes tracing and warm-up
            timed["images"] += images
            timed["seconds"] += seconds
        timed["windows"] += 1
        self._log_train(step, window, images / max(seconds, 1e-9))

    def _log_train(self, step: int, window: dict, images_per_sec: float) -> None:
        lr = float(self.optimizer.learning_rate)  # the schedule at the current update
        record = {
            "step": step,
            "split": "train",
            "loss": window["loss"] / max(window["steps"], 1.0),
            "accuracy": window["correct"] / max(window["count"], 1.0),
            "learning_rate": lr,
            "images_per_sec": images_per_sec,
            "skipped_records": int(window["skipped"]),
        }
        self.writer.log_train(
            record, format_progress(record, self.steps, self.config.global_batch_size)
        )


def run(config: Config) -> dict:
    """Trains, evaluates and exports as ``config`` says; returns the summary (also written)."""
    distribute.configure_devices(config.logical_cpu_devices)
    backend = distribute.build_backend(
        distribute.resolve_strategy(config.strategy),
        config.all_reduce_alg,
        config.communication,
        config.collective_timeout_s,
        config.hvd_compression,
    )
    _set_determinism(config)
    writer = RunWriter(config.model_dir, backend.is_chief)
    writer.write_config(config, backend)
    started = time.time()
    trainer = Trainer(config, backend, writer)
    writer.info(
        f"{backend.name}: {backend.num_replicas} replica(s), {trainer.steps} updates of "
        f"{config.global_batch_size} ({config.grad_accum_steps} micro-batch(es) of "
        f"{trainer.replica_batch // config.grad_accum_steps} per replica), model {config.model}, "
        f"data {trainer.spec.data_dir or 'synthetic'}, crops resized on the "
        f"{trainer.pipeline.resize_on}"
    )
    with PreemptionGuard() as guard:
        throughput = trainer.fit(guard)
    trainer.save(final=True)
    final_eval = trainer.evaluate()
    writer.log_eval(trainer.steps, final_eval)
    if backend.is_chief:
        trainer.model.save_weights(os.path.join(config.model_dir, "final.weights.h5"))
        if config.export:
            export_model(trainer.model, os.path.join(config.model_dir, "export"), config.image_size)
    summary = {
        "strategy": backend.name,
        "num_replicas": backend.num_replicas,
        "global_batch_size": config.global_batch_size,
        "grad_accum_steps": config.grad_accum_steps,
        "steps": int(trainer.global_step.numpy()),
        "final_eval": {k: final_eval.get(k) for k in ("top1", "top5", "loss")},
        "train_images_per_sec": throughput["images_per_sec"],
        "skipped_records": trainer.skipped_records,
        "skipped_updates": int(trainer.skipped_updates.numpy()),
        "gradient_all_reduces": int(backend.all_reduce_calls.numpy()),
        "weights_sha256": weights_fingerprint(trainer.model),
        "wall_time_s": time.time() - started,
    }
    writer.write_summary(summary)
    # Every worker says what it ended with: replicas that disagree are a bug, and visible.
    worker = f"{backend.worker_index}/{backend.num_workers}"
    print(f"worker {worker} weights_sha256 {summary['weights_sha256']}", flush=True)
    return summary
