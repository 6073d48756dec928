"""What the augmentation policies cost: images/s of each (host draw + device apply, on this
CPU) against ``keras.layers.RandAugment`` on the same batches.

    python bench/augment.py [--rounds=3] [--seconds=4] [--batch=64] [--image_size=224]

One batch of ``--batch`` real photos (scikit-learn's two samples, random crops resized to
``--image_size``), float32 in [0, 255], held in memory. Per contender, one step is what the
trainer does for a batch: the per-example draws come from a tf.data pipeline exactly as the
train pipeline makes them (a parallel map of ``augment.draw`` on each example's stateless
seed, batched), and the batch is augmented by a ``tf.function`` of ``augment.apply`` (what runs
inside the step, on the accelerator by default; here the same 2 CPU cores). Keras' layer runs
per batch, its own random generator, no draws to carry (``num_ops=2, factor=0.9``: about
timm's n2 m9). Contenders take turns, ``--seconds`` each, ``--rounds`` times, in one process;
the table gives median images/s [range] and the median of per-round ratios to Keras.

Then the host's share alone: host CPU ms per example of the draws (with the flip's, in a
parallel tf.data map of draws only, no images), for each policy and for the flip alone.
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from calibration import calibration  # noqa: E402
from sample_photos import sample_photos  # noqa: E402

KERAS = "keras.layers.RandAugment (n2, factor 0.9)"
WARMUP_STEPS = 2


def photos(batch: int, size: int) -> np.ndarray:
    """float32 [batch, size, size, 3]: random crops (half to all of the shorter side) of
    scikit-learn's two sample photos, resized bilinearly."""
    from PIL import Image

    rng = np.random.default_rng(0)
    images, out = sample_photos(), []
    for i in range(batch):
        image = images[i % 2]
        side = int(rng.integers(min(image.shape[:2]) // 2, min(image.shape[:2]) + 1))
        y = int(rng.integers(0, image.shape[0] - side + 1))
        x = int(rng.integers(0, image.shape[1] - side + 1))
        crop = Image.fromarray(image[y : y + side, x : x + side]).resize((size, size))
        out.append(np.asarray(crop))
    return np.stack(out).astype(np.float32)


def policy_step(data, images, batch: int):
    """``step() -> images`` of one policy: the next batch of draws, then the apply."""
    import tensorflow as tf

    from tfgpu.data import augment, host_ops

    def draw(position):
        seed = host_ops.example_seed(0, tf.constant(0), position)
        return augment.draw(host_ops.stream_keys(seed), [], data)

    ds = tf.data.Dataset.counter().map(draw, num_parallel_calls=tf.data.AUTOTUNE)
    draws = iter(ds.batch(batch).prefetch(tf.data.AUTOTUNE))
    apply = tf.function(lambda x, d: augment.apply(x, d))
    return lambda: apply(images, next(draws))


def keras_step(images):
    """``step() -> images`` of ``keras.layers.RandAugment`` on the batch."""
    import keras
    import tensorflow as tf

    layer = keras.layers.RandAugment(value_range=(0, 255), num_ops=2, factor=0.9, seed=0)
    apply = tf.function(lambda x: layer(x, training=True))
    return lambda: apply(images)


def policies(size: int) -> dict:
    """{name: DataConfig} of the contenders that are tfgpu policies."""
    from tfgpu.data.config import DataConfig

    base = DataConfig(image_size=size)
    return {
        "randaugment (n2, m9, mstd 0.5)": dataclasses.replace(base, augment_policy="randaugment"),
        "trivialaugment (wide)": dataclasses.replace(base, augment_policy="trivialaugment"),
        "autoaugment (original)": dataclasses.replace(base, augment_policy="autoaugment"),
        "randaugment + random_erasing 0.25": dataclasses.replace(
            base, augment_policy="randaugment", random_erasing=0.25
        ),
    }


def contenders(batch: int, size: int) -> dict:
    """{name: step function}, each traced and warm."""
    import tensorflow as tf

    images = tf.constant(photos(batch, size))
    steps = {name: policy_step(data, images, batch) for name, data in policies(size).items()}
    steps[KERAS] = keras_step(images)
    for step in steps.values():
        for _ in range(WARMUP_STEPS):
            step().numpy()
    return steps


def draw_cost(data, batch: int, seconds: float) -> float:
    """Host CPU ms per example of ``data``'s draws and the flip's, in a parallel tf.data map
    as the train pipeline makes them, batched (no images)."""
    import tensorflow as tf

    from tfgpu.data import augment, host_ops

    def draw(position):
        seed = host_ops.example_seed(0, tf.constant(0), position)
        return augment.draw(host_ops.stream_keys(seed), [], data) | {
            "flip": host_ops.draw_flip(seed)
        }

    ds = tf.data.Dataset.counter().map(draw, num_parallel_calls=tf.data.AUTOTUNE)
    batches = iter(ds.batch(batch).prefetch(tf.data.AUTOTUNE))
    next(batches)
    count, cpu, start = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(batches)
        count += batch
    return (time.process_time() - cpu) / count * 1e3


def time_step(step, batch: int, seconds: float) -> float:
    """Images/s of ``step`` run for about ``seconds`` (its result fetched each time)."""
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step().numpy()
        count += 1
    return count * batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="per contender per round")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--image_size", type=int, default=224)
    args = parser.parse_args()
    print("calibration:", calibration())
    steps = contenders(args.batch, args.image_size)
    rates = {name: [] for name in steps}
    for r in range(args.rounds):
        for name, step in steps.items():
            rates[name].append(time_step(step, args.batch, args.seconds))
        print(
            f"  round {r + 1}/{args.rounds}: " + ", ".join(f"{v[-1]:,.0f}" for v in rates.values())
        )
    print(f"\nbatch {args.batch} at {args.image_size}^2, {args.rounds} rounds, medians [range]\n")
    print("| contender | images/s | vs Keras (per round) |")
    print("|---|---:|---:|")
    for name, values in rates.items():
        ratios = [a / b for a, b in zip(values, rates[KERAS])]
        print(
            f"| {name} | {statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"
            f" | {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] |"
        )
    print("\n| host draws (with the flip's) | host CPU ms per example |\n|---|---:|")
    from tfgpu.data.config import DataConfig

    for name, data in {"flip only": DataConfig(), **policies(args.image_size)}.items():
        print(f"| {name} | {draw_cost(data, args.batch, args.seconds):.3f} |")
    print("\ncalibration:", calibration())


if __name__ == "__main__":
    main()
