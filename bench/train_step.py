"""tfgpu's train step against Keras `fit`, and gradient accumulation's cost, side by side.

    python bench/train_step.py [--model=resnet18] [--image_size=32] [--batch=64] [--rounds=5]
                               [--only=metrics|large_batch]

(1) images/s of tfgpu's loop (loops.make_train_loop, `--steps_per_loop` updates per call) and of
    `model.fit` with `steps_per_execution` equal, same model, batch, optimizer and data (one
    uint8 batch repeated, cast on the device by both), single device;
(2) images/s of k=4 micro-batches of b against k=1 at micro-batch b;
(3) images/s of the step with its per-window diagnostics (grad_norm, clipped, weight_norm:
    docs/training-loop.md) against the same step without them (``--only=metrics``: this
    row alone);
(4) with ``--only=large_batch``: images/s of LARS against SGD with momentum (both with the
    cross-entropy), and of the BCE loss with the EMA warmed up and averaging BatchNorm's
    statistics against the cross-entropy with the plain EMA (both with SGD): what
    docs/large-batch.md's settings cost per update.
Rounds alternate between the contenders and ratios are medians of per-round ratios, so the
machine's noise hits both sides alike.
"""

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import tensorflow as tf
from absl import app, flags

from calibration import calibration

from tfgpu import models
from tfgpu.train import loop as conductor
from tfgpu.step import loops
from tfgpu.config import config_from
from tfgpu.data import pipeline
from tfgpu.data import run_input
from tfgpu.distribute.backends import build_backend

flags.DEFINE_string("model", "resnet18", "Registry model.")
flags.DEFINE_integer("image_size", 32, "Image side.")
flags.DEFINE_integer("batch", 64, "Micro-batch b (and the fit batch).")
flags.DEFINE_integer("steps", 20, "Updates timed per round.")
flags.DEFINE_integer("rounds", 5, "Alternating rounds.")
flags.DEFINE_enum(
    "only", "", ["", "metrics", "large_batch"], "Run one comparison only (metrics: row 3)."
)
FLAGS = flags.FLAGS


def make_trainer(backend, global_batch: int, accum: int, extra_metrics: bool = True, **settings):
    """tfgpu's train loop (``loops.make_train_loop``, ``--steps_per_loop`` updates a call) on
    synthetic batches, with or without the step's diagnostics, ``settings`` (by flag name)
    replacing the defaults here; returns ``run(steps)``."""
    values = dict(
        strategy="default",
        model=FLAGS.model,
        image_size=FLAGS.image_size,
        small_input=True,
        synthetic_data=True,
        num_classes=10,
        global_batch_size=global_batch,
        grad_accum_steps=accum,
        train_steps=10**6,
        steps_per_loop=FLAGS.steps,
        optimizer="sgd",
        learning_rate=0.01,
        weight_decay=0.0,
        model_dir=tempfile.mkdtemp(),
    )
    config = config_from(**dict(values, **settings))
    inputs, _, run, _ = conductor.assemble(config, backend)
    run.step.extra_metrics = extra_metrics  # read when the loop is traced (its first call)
    loop = loops.make_train_loop(run.step, run.global_step, run.skipped_updates)
    batches, _, _ = run_input.train_batches(inputs, backend, 0)

    def steps(n):
        loop(batches, tf.constant(n))[0]["loss"].numpy()

    return steps


def make_fit(global_batch: int):
    keras.utils.set_random_seed(0)
    model = models.build_model(FLAGS.model, 10, FLAGS.image_size, small_input=True)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=FLAGS.steps,
    )
    data = config_from(image_size=FLAGS.image_size).data
    batch = pipeline.make_synthetic_dataset(global_batch, 10, data)
    data = batch.map(lambda b: (tf.cast(b["image"], tf.float32), b["label"]))

    def run(steps):
        model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)

    return run


def images_per_sec(run, images_per_step: int) -> float:
    start = time.perf_counter()
    run(FLAGS.steps)
    return FLAGS.steps * images_per_step / (time.perf_counter() - start)


def compare(name_a, run_a, name_b, run_b, images_a, images_b):
    """Median ratio a/b over alternating rounds (after one warm-up call each)."""
    run_a(FLAGS.steps)
    run_b(FLAGS.steps)
    rates = {name_a: [], name_b: []}
    for _ in range(FLAGS.rounds):
        rates[name_a].append(images_per_sec(run_a, images_a))
        rates[name_b].append(images_per_sec(run_b, images_b))
    ratio = statistics.median(a / b for a, b in zip(rates[name_a], rates[name_b]))
    print(
        f"| {name_a} vs {name_b} | {statistics.median(rates[name_a]):,.0f} | "
        f"{statistics.median(rates[name_b]):,.0f} | {ratio:.3f} |",
        flush=True,
    )
    return ratio


def main(argv):
    del argv
    backend = build_backend("default")
    b = FLAGS.batch
    print(
        f"{FLAGS.model} {FLAGS.image_size}x{FLAGS.image_size}, b={b}, {FLAGS.steps} updates x "
        f"{FLAGS.rounds} rounds, {os.cpu_count()} CPU cores, TF {tf.__version__}"
    )
    print(calibration())
    print("| comparison | images/s (first) | images/s (second) | ratio |")
    print("|---|---|---|---|")
    if FLAGS.only == "large_batch":
        lars = make_trainer(backend, b, 1, optimizer="lars", learning_rate=5.0)
        compare("lars", lars, "sgd", make_trainer(backend, b, 1), b, b)
        ema = dict(ema_decay=0.9999)
        bce = make_trainer(backend, b, 1, loss="bce", ema_warmup=True, ema_batchnorm=True, **ema)
        compare(
            "bce + ema warm-up + bn",
            bce,
            "cross-entropy + ema",
            make_trainer(backend, b, 1, **ema),
            b,
            b,
        )
        return 0
    if FLAGS.only == "metrics":
        with_, without = make_trainer(backend, b, 1), make_trainer(backend, b, 1, False)
        compare("with diagnostics", with_, "without", without, b, b)
        return 0
    compare("tfgpu step", make_trainer(backend, b, 1), "keras fit", make_fit(b), b, b)
    compare(
        "tfgpu k=4",
        make_trainer(backend, 4 * b, 4),
        "tfgpu k=1",
        make_trainer(backend, b, 1),
        4 * b,
        b,
    )
    with_, without = make_trainer(backend, b, 1), make_trainer(backend, b, 1, False)
    compare("with diagnostics", with_, "without", without, b, b)
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))
