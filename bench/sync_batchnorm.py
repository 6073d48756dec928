"""What --sync_batchnorm costs: train-step images/s with and without it, 2 replicas.

    python bench/sync_batchnorm.py [--models=resnet50,efficientnet_b0] [--batches=2,8,32]
                                   [--image_size=64] [--steps=4] [--rounds=2]

Each setting runs tfgpu's own train step (``TrainStep.update``) under MirroredStrategy on 2
logical CPU devices, on one synthetic uint8 batch held in memory. Per model and per-replica
batch, plain and synchronized steps are built once and then timed in alternating rounds
(A B A B) in one process, so the ratio compares like with like on a shared machine; the
median of the rounds is printed. With --sync_batchnorm every BatchNorm layer makes two small
all-reduces in the forward pass (sums and count; squared distances to the mean) and their
gradients' in the backward pass.

On CPU devices a collective is a memory copy between threads; on GPUs each is an NCCL call of
a few KB, latency-bound (tens of microseconds): see docs/training-loop.md for what follows on a GPU.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tfgpu.distribute import devices  # noqa: E402

devices.configure_devices(2)  # before TensorFlow starts: 2 logical CPU devices

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from calibration import calibration  # noqa: E402

from tfgpu import models  # noqa: E402
from tfgpu.models.layers import batchnorm_layers  # noqa: E402
from tfgpu.distribute import backends  # noqa: E402
from tfgpu.step.train_step import TrainStep  # noqa: E402

NUM_CLASSES = 1000


def make_runner(name: str, per_replica: int, sync: bool, args):
    """``run(n) -> seconds`` for n updates of 2 x ``per_replica`` images, traced and warm."""
    keras.utils.set_random_seed(0)
    backend = backends.build_backend("mirrored")
    global_batch = 2 * per_replica
    with backend.scope():
        model = models.build_model(name, NUM_CLASSES, args.image_size)
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        step = TrainStep(
            model, optimizer, backend, global_batch_size=global_batch, sync_batchnorm=sync
        )
    rng = np.random.default_rng(0)
    size = args.image_size
    data = {
        "image": rng.integers(0, 256, (global_batch, size, size, 3), dtype=np.uint8),
        "label": rng.integers(0, NUM_CLASSES, global_batch).astype(np.int32),
        "flip": np.zeros(global_batch, bool),
        "weight": np.ones(global_batch, np.float32),
    }
    dataset = backend.distribute_dataset(
        lambda _: tf.data.Dataset.from_tensors(data).unbatch().batch(per_replica).repeat()
    )
    iterator = iter(dataset)

    @tf.function
    def loop(n):
        for _ in tf.range(n):
            loss = step.update(next(iterator))[0]["loss"]
        return loss

    float(loop(tf.constant(2)))  # trace and warm up

    def run(n: int) -> float:
        start = time.perf_counter()
        float(loop(tf.constant(n)))
        return time.perf_counter() - start

    return run, len(batchnorm_layers(model))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,efficientnet_b0")
    parser.add_argument("--batches", default="2,8,32", help="per-replica batch sizes")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4, help="timed updates per round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    tf.get_logger().setLevel("ERROR")
    print(calibration())
    print(
        f"2 replicas (MirroredStrategy, logical CPU devices), {args.image_size}x"
        f"{args.image_size}, {args.steps} updates a round, {args.rounds} rounds A B A B; "
        f"TF {tf.__version__}"
    )
    header = f"{'model':<16}{'BN layers':>10}{'per replica':>12}{'plain':>10}{'sync':>10}"
    print(header + f"{'sync/plain':>12}\n" + "-" * (len(header) + 12))
    for name in args.models.split(","):
        for per_replica in map(int, args.batches.split(",")):
            plain, layers = make_runner(name, per_replica, False, args)
            synced, _ = make_runner(name, per_replica, True, args)
            times = {"plain": [], "sync": []}
            for _ in range(args.rounds):
                times["plain"].append(plain(args.steps))
                times["sync"].append(synced(args.steps))
            images = args.steps * 2 * per_replica
            ips = {k: images / statistics.median(v) for k, v in times.items()}
            print(
                f"{name:<16}{layers:>10}{per_replica:>12}{ips['plain']:>10.1f}"
                f"{ips['sync']:>10.1f}{ips['sync'] / ips['plain']:>12.3f}",
                flush=True,
            )
            keras.backend.clear_session()
    print("(images/s of the whole train step; sync/plain < 1 is what synchronizing costs)")


if __name__ == "__main__":
    main()
