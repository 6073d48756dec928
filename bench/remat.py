"""What --remat costs and saves: peak memory and train-step time with and without per-block
gradient checkpointing, side by side.

    python bench/remat.py [--models=resnet50,densenet121,efficientnet_b0] [--batch=32]
                          [--image_size=160] [--steps=2] [--rounds=2]

Per model, tfgpu's own train step (``TrainStep.update``, one device) is built twice on the
same model, plain and with ``prepare.rematerialized`` as under --remat, on one synthetic uint8
batch, traced and warmed up; then the two are timed in alternating rounds (A B A B) in one
process and the median of the rounds is printed. Peak memory is TensorFlow's allocator's own
peak (``tf.config.experimental.get_memory_info``: on a GPU the GPU's, here the CPU device's
allocator, which holds every tensor of the step), reset before each timed round: the step's
activations, gradients and workspace above the weights and optimizer state, which stay
allocated between steps and are printed apart ("resident"). Process RSS is not used: it only
grows and counts TensorFlow's own code and caches.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from calibration import calibration  # noqa: E402

from tfgpu import models  # noqa: E402
from tfgpu.models import prepare  # noqa: E402
from tfgpu.distribute import backends  # noqa: E402
from tfgpu.step.train_step import TrainStep  # noqa: E402

NUM_CLASSES = 1000
DEVICE = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"
MB = 1 << 20


def make_runner(model, name: str, remat: bool, args):
    """``run(n) -> seconds`` for n updates of one batch of ``args.batch`` images."""
    backend = backends.build_backend("default")
    with backend.scope():
        stepped = prepare.rematerialized(model, name) if remat else model
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        step = TrainStep(stepped, optimizer, backend, global_batch_size=args.batch)
    rng = np.random.default_rng(0)
    size = args.image_size
    data = {
        "image": rng.integers(0, 256, (args.batch, size, size, 3), dtype=np.uint8),
        "label": rng.integers(0, NUM_CLASSES, args.batch).astype(np.int32),
        "flip": np.zeros(args.batch, bool),
        "weight": np.ones(args.batch, np.float32),
    }
    iterator = iter(
        backend.distribute_dataset(lambda _: tf.data.Dataset.from_tensors(data).repeat())
    )

    @tf.function
    def loop(n):
        for _ in tf.range(n):
            loss = step.update(next(iterator))[0]["loss"]
        return loss

    float(loop(tf.constant(1)))  # trace and warm up

    def run(n: int) -> tuple[float, float]:
        """(seconds, peak MB of the allocator during the n updates)."""
        tf.config.experimental.reset_memory_stats(DEVICE)
        start = time.perf_counter()
        float(loop(tf.constant(n)))
        seconds = time.perf_counter() - start
        return seconds, tf.config.experimental.get_memory_info(DEVICE)["peak"] / MB

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="resnet50,densenet121,efficientnet_b0")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=160)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(calibration())
    print(
        f"{tf.__version__=} {keras.__version__=} device={DEVICE} batch={args.batch} "
        f"image={args.image_size} steps/round={args.steps} rounds={args.rounds}"
    )
    print(
        "model            blocks  resident MB  peak MB plain  peak MB remat  saved  "
        "ms/step plain  ms/step remat  time x"
    )
    for name in args.models.split(","):
        keras.utils.set_random_seed(0)
        model = models.build_model(name, NUM_CLASSES, args.image_size)
        blocks = prepare.rematerialized(model, name).blocks
        runners = {remat: make_runner(model, name, remat, args) for remat in (False, True)}
        resident = tf.config.experimental.get_memory_info(DEVICE)["current"] / MB
        times, peaks = {False: [], True: []}, {False: [], True: []}
        for _ in range(args.rounds):
            for remat, run in runners.items():
                seconds, peak = run(args.steps)
                times[remat].append(seconds / args.steps * 1000)
                peaks[remat].append(peak - resident)
        t = {k: statistics.median(v) for k, v in times.items()}
        p = {k: max(v) for k, v in peaks.items()}
        print(
            f"{name:16s} {blocks:6d} {resident:12.0f} {p[False]:14.0f} {p[True]:14.0f} "
            f"{1 - p[True] / p[False]:6.0%} {t[False]:14.0f} {t[True]:14.0f} "
            f"{t[True] / t[False]:7.2f}"
        )


if __name__ == "__main__":
    main()
