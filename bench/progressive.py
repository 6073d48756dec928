"""What --progressive_stages saves: the train step's time at each stage's image size against
the final size, side by side, and the run's predicted train time with stages against without.

    python bench/progressive.py [--models=resnet50,efficientnet_b0] [--image_size=224]
                                [--min_image_size=128] [--stages=4] [--batch=8] [--steps=2]
                                [--rounds=3]

Per model, one model is built at --image_size and widened as a progressive run widens it
(``prepare.any_input_size``); tfgpu's own train step (``TrainStep.update``, one device) is
traced once per stage size of ``train.progressive.plan`` on a synthetic uint8 batch, then the
sizes are timed in alternating rounds in one process (the median of the rounds is printed).
Stages cover equal shares of the updates, so the predicted time of a progressive run is the
mean of the stages' step times; "x" is that against every update at the final size. What it
leaves out: the one retrace per stage (seconds, once per stage) and input decoding, which
shrinks with the images too on the per-example path.
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
from tfgpu.config import config_from  # noqa: E402
from tfgpu.train import progressive  # noqa: E402
from tfgpu.distribute import backends  # noqa: E402
from tfgpu.step.train_step import TrainStep  # noqa: E402

NUM_CLASSES = 1000


def make_runner(model, size: int, batch: int):
    """``run(n) -> seconds`` for n updates of one batch of ``batch`` images of side ``size``."""
    backend = backends.build_backend("default")
    with backend.scope():
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        step = TrainStep(model, optimizer, backend, global_batch_size=batch)
    rng = np.random.default_rng(0)
    data = {
        "image": rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8),
        "label": rng.integers(0, NUM_CLASSES, batch).astype(np.int32),
        "flip": np.zeros(batch, bool),
        "weight": np.ones(batch, np.float32),
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

    def run(n: int) -> float:
        start = time.perf_counter()
        float(loop(tf.constant(n)))
        return time.perf_counter() - start

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="resnet50,efficientnet_b0")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--min_image_size", type=int, default=128)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    config = config_from(
        image_size=args.image_size,
        progressive_stages=args.stages,
        progressive_min_image_size=args.min_image_size,
    )
    stages = progressive.plan(config.curriculum, config.data, total_steps=args.stages * 100)
    sizes = [stage.image_size for stage in stages]
    print(calibration())
    print(
        f"{tf.__version__=} {keras.__version__=} batch={args.batch} stages={sizes} "
        f"steps/round={args.steps} rounds={args.rounds}"
    )
    print("model            " + "".join(f"ms@{s:<7d}" for s in sizes) + "  progressive x")
    for name in args.models.split(","):
        keras.utils.set_random_seed(0)
        model = models.build_model(name, NUM_CLASSES, args.image_size)
        prepare.any_input_size(model)
        runners = {size: make_runner(model, size, args.batch) for size in sizes}
        times = {size: [] for size in sizes}
        for _ in range(args.rounds):
            for size, run in runners.items():
                times[size].append(run(args.steps) / args.steps * 1000)
        ms = [statistics.median(times[size]) for size in sizes]
        ratio = statistics.mean(ms) / ms[-1]
        print(f"{name:16s} " + "".join(f"{t:<10.0f}" for t in ms) + f"  {ratio:.2f}")


if __name__ == "__main__":
    main()
