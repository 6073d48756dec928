"""The outer loop: steps, evaluation, checkpoints, logs, export and the run summary."""

import hashlib
import os
import time

import keras
import numpy as np
import tensorflow as tf

from tfgpu import demo, distribute, input_pipeline, models, optim
from tfgpu.config import Config, ConfigError, per_replica_batch
from tfgpu.results import RunWriter, export_model, format_progress
from tfgpu.step import DynamicLossScale, NonFiniteLoss, TrainStep


def _set_determinism(config: Config) -> None:
    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()


def _data(config: Config):
    """The DataSpec of the run: the demo dataset when no --data_dir (built once, cached)."""
    if config.synthetic_data:
        classes = config.num_classes or 1000
        return input_pipeline.DataSpec("", classes, 0, (), (), 1_281_167, 0)
    data_dir = os.path.expanduser(config.data_dir) if config.data_dir else demo.build_demo_dataset()
    return input_pipeline.load_data_spec(data_dir, config.num_classes, config.label_offset)


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
        eval_crop_fraction=config.eval_crop_fraction,
        shuffle_buffer=config.shuffle_buffer,
        cycle_length=config.cycle_length,
        threadpool_size=config.data_threads,
        cache_eval=config.cache_eval,
    )


class Trainer:
    """Holds what one run builds (backend, model, step, checkpoints) and runs the loop."""

    def __init__(self, config: Config, backend, writer: RunWriter):
        self.config, self.backend, self.writer = config, backend, writer
        self.spec = _data(config)
        self.steps = total_steps(config, self.spec.num_train)
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
            self.model = models.build_model(c.model, self.spec.num_classes, c.image_size, c.small_input)
            lr = optim.scaled_learning_rate(c.learning_rate, c.global_batch_size, c.scale_lr_with_batch)
            schedule = optim.WarmupDecay(lr, self.steps, c.warmup_steps, c.lr_schedule)
            optimizer = optim.build_optimizer(c.optimizer, schedule, c.momentum, c.weight_decay, c.ema_decay)
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
            )
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.skipped_updates = tf.Variable(0, dtype=tf.int64, trainable=False)
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

    def save(self) -> None:
        self.manager.save(checkpoint_number=self.global_step)

    # --- datasets ---------------------------------------------------------------------
    def _train_iterator(self, start_step: int):
        c = self.config
        if c.synthetic_data:
            make = lambda shard: input_pipeline.make_synthetic_dataset(  # noqa: E731
                self.replica_batch, c.image_size, self.spec.num_classes
            )
        else:
            pcfg = _pipeline_config(c)
            make = lambda shard: input_pipeline.make_train_dataset(  # noqa: E731
                self.spec, pcfg, shard, self.replica_batch, c.global_batch_size,
                start_index=start_step * c.global_batch_size,
            )
        return iter(self.backend.distribute_dataset(make))

    def _eval_dataset(self):
        pcfg = _pipeline_config(self.config)
        eval_replica = self.eval_global // self.backend.num_replicas
        return self.backend.distribute_dataset(
            lambda shard: input_pipeline.make_eval_dataset(
                self.spec, pcfg, shard, eval_replica, self.eval_global
            )
        )

    # --- compiled functions -----------------------------------------------------------
    def _compile(self):
        step = self.step

        @tf.function(jit_compile=None)
        def train_loop(iterator, num_steps):
            totals = {"loss": 0.0, "correct": 0.0, "count": 0.0}
            totals = {k: tf.constant(v) for k, v in totals.items()}
            all_finite, skipped = tf.constant(True), tf.constant(0, tf.int64)
            for _ in tf.range(num_steps):
                m = step.update(next(iterator))
                totals = {k: totals[k] + m[k] for k in totals}
                all_finite = tf.logical_and(all_finite, tf.math.is_finite(m["loss"]))
                skipped += tf.cast(tf.logical_not(m["finite"]), tf.int64)
                self.global_step.assign_add(1)
            self.skipped_updates.assign_add(skipped)
            return totals, all_finite

        if self.config.jit_compile:
            # XLA compiles the per-replica step (where the FLOPs are); the loop stays a graph.
            step.replica_step = tf.function(step.replica_step, jit_compile=True)

        @tf.function
        def eval_step(batch):
            def replica(batch):
                logits = tf.cast(self.model(tf.cast(batch["image"], tf.float32), training=False), tf.float32)
                labels, weight = batch["label"], batch["weight"]
                loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
                top5 = tf.cast(tf.math.in_top_k(labels, logits, min(5, logits.shape[-1])), tf.float32)
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
    def evaluate(self) -> dict:
        """Top-1, top-5 and loss over the whole validation split (each example once)."""
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
        return {"loss": sums["loss"] / n, "top1": sums["top1"] / n, "top5": sums["top5"] / n,
                "num_examples": int(sums["count"])}

    def _next_stop(self, step: int) -> int:
        """The next step at which something other than training happens."""
        c = self.config
        stops = [self.steps, step + c.steps_per_loop]
        for every in (c.log_every_steps, c.eval_every_steps, c.checkpoint_every_steps):
            if every:
                stops.append((step // every + 1) * every)
        return min(stops)

    def fit(self) -> dict:
        """Trains from the restored step to the end; returns the throughput numbers."""
        c = self.config
        self._compile()
        step = self.restore()
        iterator = self._train_iterator(step)
        window = {"loss": 0.0, "correct": 0.0, "count": 0.0, "steps": 0, "start": time.time()}
        timed_images, timed_seconds, first_window = 0, 0.0, True
        while step < self.steps:
            n = self._next_stop(step) - step
            totals, finite = self.train_loop(iterator, tf.constant(n))
            if not bool(finite):
                raise NonFiniteLoss(f"non-finite loss between step {step + 1} and {step + n}")
            step += n
            for k in ("loss", "correct", "count"):
                window[k] += float(totals[k])
            window["steps"] += n
            if step % c.log_every_steps == 0 or step == self.steps:
                seconds = time.time() - window["start"]
                images = window["steps"] * c.global_batch_size
                if not first_window:  # the first window includes tracing and warm-up
                    timed_images, timed_seconds = timed_images + images, timed_seconds + seconds
                first_window = False
                self._log_train(step, window, images / max(seconds, 1e-9))
                window = {"loss": 0.0, "correct": 0.0, "count": 0.0, "steps": 0, "start": time.time()}
            if c.eval_every_steps and step % c.eval_every_steps == 0 and step < self.steps:
                self.writer.log_eval(step, self.evaluate())
            if step % c.checkpoint_every_steps == 0 and step < self.steps:
                self.save()
        return {"images_per_sec": timed_images / timed_seconds if timed_seconds else None}

    def _log_train(self, step: int, window: dict, images_per_sec: float) -> None:
        lr = float(self.optimizer.learning_rate)  # the schedule at the current update
        record = {
            "step": step,
            "split": "train",
            "loss": window["loss"] / window["steps"],
            "accuracy": window["correct"] / max(window["count"], 1.0),
            "learning_rate": lr,
            "images_per_sec": images_per_sec,
        }
        self.writer.log_train(record, format_progress(record, self.steps, self.config.global_batch_size))


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
        f"data {trainer.spec.data_dir or 'synthetic'}"
    )
    throughput = trainer.fit()
    trainer.save()
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
        "skipped_records": 0,
        "skipped_updates": int(trainer.skipped_updates.numpy()),
        "gradient_all_reduces": int(backend.all_reduce_calls.numpy()),
        "weights_sha256": weights_fingerprint(trainer.model),
        "wall_time_s": time.time() - started,
    }
    writer.write_summary(summary)
    # Every worker says what it ended with: replicas that disagree are a bug, and visible.
    print(f"worker {backend.worker_index}/{backend.num_workers} weights_sha256 {summary['weights_sha256']}", flush=True)
    return summary
