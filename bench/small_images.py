"""How fast do 32x32 training batches come out of the input pipeline: per example, or cut from
the decoded split in memory?

On the demo's 32x32 digits (1,438 train images, ``tfgpu.demo``) and, with ``--large``, a
CIFAR-sized synthetic set (50,000 32x32 PNGs, written once by the converter's own code into a
cache dir), measured in ONE run, round-robin (the machine is shared: the ratios come from
side-by-side rounds; the table gives medians over rounds and their range), each contender a
fresh pipeline per round, batches of ``--batch``, every element taken as the trainer takes it:

  (a)  tfgpu per example: ``pipeline.make_train_dataset`` (parse, fused decode-and-crop,
       resize on the host; --in_memory=off)
  (b)  the in-memory anchor of the issue: plain tf.data, an in-memory uint8 array sliced per
       example, shuffled, batched, then a vectorized random crop (4 px padding; one window per
       batch, ``tf.image.random_crop``) and flips per image
  (c)  tfgpu in memory: ``memory.make_train_dataset`` (--in_memory=on: stateless per-example
       crop offsets and flip draws by (seed, epoch, position), split-invariant); and, outside
       the ratios, (c) with MixUp/CutMix draws (the per-example draws, one small loop a batch)

It prints a calibration line (CPU model, cores, numpy float32 2048^2 matmul GFLOP/s, best of
5) so the figures can be scaled to another machine.

    python bench/small_images.py [--large] [--rounds=5] [--seconds=3]
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

PADDING = 4
A, B, C = "(a) tfgpu per example", "(b) in-memory anchor, plain tf.data", "(c) tfgpu in memory"
MIXING = "(c) + MixUp/CutMix draws (not in the ratios)"
WARMUP_BATCHES = 3  # excluded from timing, the same for every contender


def large_dataset(num_images: int) -> str:
    """A converted CIFAR-sized dataset of ``num_images`` 32x32 PNGs in 10 classes, written once
    into the cache dir; its directory."""
    from tfgpu.convert import plan
    from tfgpu.convert.manifest import items_from_arrays
    from tfgpu.demo import cache_dir
    from tfgpu.data.recordformat import INFO_FILE

    out = os.path.join(cache_dir(), "bench", f"small-{num_images}")
    if os.path.exists(os.path.join(out, INFO_FILE)):
        return out
    rng = np.random.default_rng(0)
    labels = np.arange(num_images) % 10
    # Smooth fields plus grain: PNG sizes near CIFAR's (~2.5 KB), unlike flat colour or noise.
    coarse = rng.integers(0, 256, (num_images, 8, 8, 3), dtype=np.uint8)
    images = np.repeat(np.repeat(coarse, 4, axis=1), 4, axis=2)
    images = (images + rng.integers(0, 24, images.shape, dtype=np.uint8)).astype(np.uint8)
    items = items_from_arrays(images, labels, prefix="synthetic")
    plan.write_dataset(
        {"train": items, "validation": items[:100]},
        class_names=[str(c) for c in range(10)],
        output_dir=out,
        source="bench/small_images.py: synthetic 32x32",
        num_shards={"train": 16, "validation": 1},
    )
    return out


def anchor_dataset(images: np.ndarray, labels: np.ndarray, batch: int):
    """(b): the issue's plain tf.data anchor, an in-memory uint8 array, per-batch vectorized
    random crop and flip."""
    import tensorflow as tf

    side = images.shape[1]

    def augment(x, y):
        x = tf.pad(x, [[0, 0], [PADDING, PADDING], [PADDING, PADDING], [0, 0]])
        x = tf.image.random_crop(x, [tf.shape(x)[0], side, side, 3])
        return tf.image.random_flip_left_right(x), y

    ds = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(len(labels)).repeat()
    ds = ds.batch(batch, drop_remainder=True).map(augment, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def contenders(data_dir: str, batch: int) -> tuple[dict, str]:
    """({name: function making a fresh endless pipeline}, how the split loaded into memory)."""
    from tfgpu.config import DataConfig
    from tfgpu.data import memory, pipeline
    from tfgpu.data.spec import load_data_spec
    from tfgpu.data.stream import Stream
    from tfgpu.distribute import InputShard

    spec = load_data_spec(data_dir)
    cfg = DataConfig(image_size=32, crop_padding=PADDING, shuffle_buffer=10_000)
    start = time.perf_counter()
    mem = memory.load(spec, DataConfig(image_size=32, in_memory="on"))
    loaded = f"{mem.describe()}, decoded in {time.perf_counter() - start:.1f} s"
    images, labels = mem.images.numpy(), mem.labels.numpy()
    mixing = dataclasses.replace(cfg, mixup_alpha=0.2, cutmix_alpha=1.0)
    args = dict(
        stream=Stream(batch_size=batch, global_batch_size=batch, seed=0, deterministic=False)
    )
    one = InputShard(1, 0)
    return {
        A: lambda: pipeline.make_train_dataset(spec, cfg, one, **args),
        B: lambda: anchor_dataset(images, labels, batch),
        C: lambda: memory.make_train_dataset(mem, cfg, one, **args),
        MIXING: lambda: memory.make_train_dataset(mem, mixing, one, **args),
    }, loaded


def time_pipeline(make, batch: int, seconds: float) -> tuple[float, float]:
    """(images/s, host CPU ms per image) of a fresh pipeline, after the warm-up; every
    component of every element is taken as a numpy array, as the trainer would take it."""
    import tensorflow as tf

    iterator = iter(make())
    for _ in range(WARMUP_BATCHES):
        next(iterator)
    count, cpu, start = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        for tensor in tf.nest.flatten(next(iterator)):
            tensor.numpy()
        count += 1
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return count * batch / wall, cpu / (count * batch) * 1e3


def measure(name: str, data_dir: str, batch: int, rounds: int, seconds: float) -> None:
    """Rounds of every contender in turn; prints the table and the ratios c/b, c/a."""
    sources, loaded = contenders(data_dir, batch)
    rates = {k: [] for k in sources}
    cpu = {k: [] for k in sources}
    for r in range(rounds):
        for key, make in sources.items():
            ips, ms = time_pipeline(make, batch, seconds)
            rates[key].append(ips)
            cpu[key].append(ms)
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{v[-1]:,.0f}" for v in rates.values()))
    print(f"\n{name}: {loaded}; batch {batch}, {rounds} rounds, medians [range]\n")
    print("| contender | images/s | host CPU ms/image |")
    print("|---|---:|---:|")
    for key in sources:
        lo, hi = min(rates[key]), max(rates[key])
        med = statistics.median(rates[key])
        print(f"| {key} | {med:,.0f} [{lo:,.0f}-{hi:,.0f}] | {statistics.median(cpu[key]):.3f} |")
    a, b, c = rates[A], rates[B], rates[C]
    for label, num, den, target in (("c/b", c, b, 1.0), ("c/a", c, a, 2.0)):
        ratios = [x / y for x, y in zip(num, den)]
        print(
            f"| ratio {label} (per round) | {statistics.median(ratios):.2f}x "
            f"[{min(ratios):.2f}-{max(ratios):.2f}] | target >= {target:.1f}x |"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="per contender per round")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--large", action="store_true", help="also a 50,000-image 32x32 set")
    parser.add_argument("--large_images", type=int, default=50_000)
    args = parser.parse_args()
    print("calibration:", calibration())
    from tfgpu.demo import build_demo_dataset

    sets = [("demo digits (32x32)", build_demo_dataset())]
    if args.large:
        sets.append(
            (f"synthetic {args.large_images:,} (32x32 PNG)", large_dataset(args.large_images))
        )
    for name, data_dir in sets:
        measure(name, data_dir, args.batch, args.rounds, args.seconds)
    print("calibration:", calibration())


if __name__ == "__main__":
    main()
