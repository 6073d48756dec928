"""Converter speed against the decode-only ceiling, on the same JPEGs in the same run.

    python bench/convert.py [--num_images=1000] [--workers=N] [--repeats=2]

Generates ImageNet-like JPEGs once (350-500 px sides, quality 90, smooth random content with
fine grain, 10 class folders; cached in $TMPDIR/tfgpu-bench-convert), then measures on them:

  decode ceiling, tf.data   read_file + tf.io.decode_jpeg, parallel map on N threads
  decode ceiling, PIL       Image.open + load in N warm worker processes (what the converter
                            does to verify an image)
  converter                 tfgpu.convert_cli end to end (list the folders, verify-decode,
                            write 4 shards per worker, dataset_info.json) with N workers

With ``--duplicates=DIR`` (an input the converter reads, e.g. Fashion-MNIST's IDX folder
/usr/share/datasets/fashion-mnist; ``jpegs``: the generated JPEGs) it measures instead what
``--check_duplicates`` adds, with and without the check interleaved: the conversion's CPU
time in this one process (``--num_workers=0``: what other users of the machine cannot
change) and its wall time with N workers (what a user waits), and the groups found.

Every measurement runs ``--repeats`` times, interleaved, and the best is kept. On a shared
machine wall-clock rates swing with the others' load, so the CPU time per image of each
contender (one process, 300 images) is printed too: the ratio of those is what the rates'
ratio would be on an idle machine, the workers being independent processes. The ratios are
the converter's over the faster ceiling's; the target is >= 0.8.
"""

import argparse
import io
import multiprocessing
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
from PIL import Image

from tfgpu.cli import convert as cli

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from calibration import calibration  # noqa: E402

CACHE = os.path.join(tempfile.gettempdir(), "tfgpu-bench-convert")
NUM_CLASSES = 10


def _make_jpeg(seed: int) -> bytes:
    """A 350-500 px JPEG (quality 90) of upscaled noise plus grain: smooth like a photo, not
    flat, so it costs the decoder what a real image does."""
    rng = np.random.default_rng(seed)
    height, width = rng.integers(350, 501, size=2)
    coarse = rng.integers(0, 256, (height // 16 + 2, width // 16 + 2, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC))
    grain = rng.normal(0, 10, smooth.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def _write_one(args) -> None:
    path, seed = args
    with open(path + ".part", "wb") as f:
        f.write(_make_jpeg(seed))
    os.replace(path + ".part", path)


def make_images(num_images: int, workers: int) -> tuple[str, list]:
    """The cached image folder for ``num_images`` and its file list."""
    root = os.path.join(CACHE, f"jpegs-v1-{num_images}")
    paths = [
        os.path.join(root, f"c{i % NUM_CLASSES}", f"img_{i:06d}.JPEG") for i in range(num_images)
    ]
    missing = [(p, i) for i, p in enumerate(paths) if not os.path.exists(p)]
    if missing:
        print(f"generating {len(missing)} JPEGs into {root} ...", flush=True)
        for c in range(NUM_CLASSES):
            os.makedirs(os.path.join(root, f"c{c}"), exist_ok=True)
        with multiprocessing.get_context("forkserver").Pool(workers) as pool:
            pool.map(_write_one, missing, chunksize=16)
    return root, paths


def _decode_files(paths: list) -> int:
    for path in paths:
        with open(path, "rb") as f:
            image = Image.open(io.BytesIO(f.read()))
            image.load()
    return len(paths)


def pil_ceiling(paths: list, workers: int) -> float:
    """Images/s of PIL decoding in ``workers`` warm processes."""
    with multiprocessing.get_context("forkserver").Pool(workers) as pool:
        pool.map(_decode_files, [paths[:2]] * workers)  # start and warm the workers
        chunks = [paths[i : i + 16] for i in range(0, len(paths), 16)]
        start = time.perf_counter()
        done = sum(pool.map(_decode_files, chunks, chunksize=1))
        return done / (time.perf_counter() - start)


def tf_ceiling(paths: list, workers: int) -> float:
    """Images/s of read_file + decode_jpeg in a parallel tf.data map on ``workers`` threads
    (as many as the converter has processes: on a shared machine, more threads would take
    a larger share of the cores rather than measure a faster decoder)."""
    import tensorflow as tf

    def decode(path):
        return tf.shape(tf.io.decode_jpeg(tf.io.read_file(path), channels=3))[0]

    options = tf.data.Options()
    options.threading.private_threadpool_size = workers
    options.threading.max_intra_op_parallelism = 1
    data = tf.data.Dataset.from_tensor_slices(paths).with_options(options)
    data = data.map(decode, num_parallel_calls=workers).batch(64)
    start = time.perf_counter()
    done = sum(int(tf.size(batch)) for batch in data)
    return done / (time.perf_counter() - start)


def converter(root: str, output_dir: str, workers: int) -> float:
    """Images/s of the converter CLI's work, end to end, on the folder ``root``."""
    argv = [
        "bench",
        f"--input={root}",
        f"--output_dir={output_dir}",
        "--validation_fraction=0",
        f"--num_workers={workers}",
        f"--num_shards={4 * workers}",
        "--overwrite",
        "--noprogress",
    ]
    cli.FLAGS.unparse_flags()
    cli.FLAGS(argv)
    start = time.perf_counter()
    info = cli.convert_from_flags(cli.FLAGS)
    seconds = time.perf_counter() - start
    assert info["num_skipped"] == 0, info["skipped"]
    return info["num_examples"]["train"] / seconds


def cpu_costs(paths: list, workers: int) -> dict:
    """CPU ms per image of each contender run in this one process, one image at a time: a
    cost the other users of a shared machine cannot change, unlike wall-clock rates."""
    import tensorflow as tf

    from tfgpu.convert import plan
    from tfgpu.convert.manifest import Item

    def tf_decode():
        for path in paths:
            tf.io.decode_jpeg(tf.io.read_file(path), channels=3)

    def converter_in_process():
        items = [Item(p, 0, p) for p in paths]
        out = tempfile.mkdtemp(prefix="tfgpu-bench-convert-out-")
        plan.write_dataset({"train": items}, ["c"], out, "bench", {"train": workers})
        shutil.rmtree(out)

    costs = {}
    for name, work in (
        ("decode ceiling, tf.data", tf_decode),
        ("decode ceiling, PIL", lambda: _decode_files(paths)),
        ("converter", converter_in_process),
    ):
        start = time.process_time()
        work()
        costs[name] = 1e3 * (time.process_time() - start) / len(paths)
    return costs


def duplicates_cost(input_dir: str, repeats: int, workers: int) -> None:
    """Prints what the duplicate check adds to converting ``input_dir``, side by side,
    interleaved, best of ``repeats``: the CPU seconds of the conversion in this one process
    (what other users of the machine cannot change) and the wall seconds with ``workers``
    worker processes (what a user waits: the workers fingerprint in parallel, the grouping
    runs once at the end); then the check's summary."""
    import json

    flags = ("--nocheck_duplicates", "--check_duplicates")
    cpu, wall = ({f: [] for f in flags} for _ in range(2))
    output_dir = tempfile.mkdtemp(prefix="tfgpu-bench-dup-")
    try:
        for _ in range(repeats):
            for flag in flags:
                cpu[flag].append(_convert_timed(input_dir, output_dir, flag, 0)[0])
                wall[flag].append(_convert_timed(input_dir, output_dir, flag, workers)[1])
        with open(os.path.join(output_dir, "quality.json"), encoding="utf-8") as f:
            quality = json.load(f)
        with open(os.path.join(output_dir, "dataset_info.json"), encoding="utf-8") as f:
            images = sum(json.load(f)["num_examples"].values())
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
    print(f"\n{images} images of {input_dir}; best of {repeats}, interleaved")
    print("calibration:", calibration())
    for name, runs in (("CPU s, 1 process", cpu), (f"wall s, {workers} workers", wall)):
        plain, checked = min(runs[flags[0]]), min(runs[flags[1]])
        print(
            f"{name:22s} {plain:7.2f} without, {checked:7.2f} with the check: "
            f"+{100 * (checked / plain - 1):.1f}% (target <= 15%)"
        )
        for flag in flags:
            print(f"    {flag:22s} " + ", ".join(f"{r:.2f}" for r in runs[flag]))
    print(f"{cli.quality_line(dict(quality, file='quality.json', summary=_summary(quality)))}")
    print(f"search: {quality['method']['search']}; {quality['search']}")


def _convert_timed(input_dir: str, output_dir: str, flag: str, workers: int) -> tuple:
    """(CPU s of this process, wall s) of one conversion with ``flag`` and ``workers``."""
    argv = ["bench", f"--input={input_dir}", f"--output_dir={output_dir}", flag]
    cli.FLAGS.unparse_flags()
    cli.FLAGS(argv + [f"--num_workers={workers}", "--overwrite", "--noprogress"])
    cpu, wall = time.process_time(), time.perf_counter()
    cli.convert_from_flags(cli.FLAGS)
    return time.process_time() - cpu, time.perf_counter() - wall


def _summary(quality: dict) -> str:
    from tfgpu.convert import duplicates

    return duplicates.summary(quality)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_images", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--duplicates",
        default="",
        help="measure --check_duplicates on this input (jpegs: the generated JPEGs)",
    )
    args = parser.parse_args()
    if args.duplicates:
        jpegs = args.duplicates == "jpegs"
        source = make_images(args.num_images, args.workers)[0] if jpegs else args.duplicates
        duplicates_cost(source, args.repeats, args.workers)
        return
    root, paths = make_images(args.num_images, args.workers)
    megabytes = sum(os.path.getsize(p) for p in paths) / 2**20
    for path in paths:  # page cache: every measurement reads from memory, like the others
        with open(path, "rb") as f:
            f.read()
    output_dir = tempfile.mkdtemp(prefix="tfgpu-bench-convert-out-")
    try:
        rows = {"decode ceiling, tf.data": [], "decode ceiling, PIL": [], "converter": []}
        for _ in range(args.repeats):  # interleaved, so load from others hits all alike
            rows["decode ceiling, tf.data"].append(tf_ceiling(paths, args.workers))
            rows["decode ceiling, PIL"].append(pil_ceiling(paths, args.workers))
            rows["converter"].append(converter(root, output_dir, args.workers))
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
    costs = cpu_costs(paths[:300], args.workers)
    print(
        f"\n{len(paths)} JPEGs, {megabytes / len(paths) * 1024:.0f} KB average, "
        f"{args.workers} workers on {os.cpu_count()} cores"
    )
    print(f"{'':26s} {'img/s best':>10s} {'CPU ms/img':>11s}   img/s of each run")
    for name, values in rows.items():
        runs = ", ".join(f"{v:.0f}" for v in values)
        print(f"{name:26s} {max(values):10.0f} {costs[name]:11.2f}   {runs}")
    best = max(rows, key=lambda k: max(rows[k]) if k != "converter" else 0)
    wall = max(rows["converter"]) / max(rows[best])
    cpu = min(costs["decode ceiling, tf.data"], costs["decode ceiling, PIL"]) / costs["converter"]
    print(
        f"converter / ceiling: {wall:.2f} by wall clock (vs {best}), "
        f"{cpu:.2f} by CPU cost; target >= 0.8"
    )


if __name__ == "__main__":
    main()
