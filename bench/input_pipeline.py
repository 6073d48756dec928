"""How fast does the host hand 224x224 uint8 random-resized-crop batches to the accelerator?

Writes >= 1,000 JPEGs once into a cache dir, as TFRecords and as an image folder: with
--image_set=smooth (default) ImageNet-like ones (350-500 px, quality 90, smooth random fields
with texture, ~75 KB), with photo lighter, real-photo ones (cuts of scikit-learn's two sample
photographs, ~480x355, quality 75, ~37 KB), with large 300 photo-sized ones (1200-1600 px,
~0.5 MB, where --dct_scaled_decode pays); "both" (smooth, photo) or a comma list runs the sets
side by side in each round. Each set gets a dataset_info.json with its shorter sides, as the
converter writes it. --image_size changes the crops' side (224). Then it measures in ONE
run, round-robin (the machine is shared: ratios come from side-by-side rounds; the table gives
medians over rounds and their range, and each tf contender's host CPU ms per image):

  (a)  decode-only ceiling: parallel tf.io.decode_jpeg of whole images (default options), same
       records, same reader and map parallelism and tf.data.Options as tfgpu
  tfgpu: data.pipeline.make_train_dataset as on a GPU machine (--resize_on=auto: fused
       decode-and-crop handed over un-resized, packed int64 words + sizes; resize, flip and
       cast left to the accelerator; images/s counted per example); also the host resize
       (the default without GPU) and --preprocess_on=host for comparison
  (b)  keras.utils.image_dataset_from_directory (224, flip, prefetch, repeat)
  (c)  PyTorch DataLoader + torchvision ImageFolder, RandomResizedCrop(224), flip, uint8,
       num_workers = cores; run with --torch_python (a venv with torch); skipped otherwise

    python bench/input_pipeline.py [--torch_python=/tmp/torchenv/bin/python]
    python bench/input_pipeline.py --image_set=both --batch=64 --before=REV   # old vs new
    python bench/input_pipeline.py --image_set=both --batch=64 --breakdown    # CPU by stage
    python bench/input_pipeline.py --image_set=smooth,photo,large --batch=64 --rounds=10 \
        --seconds=2 --contenders=a,device,dct_auto,dct_on,host,host_dct_auto

--before=REV adds tfgpu's device path as it was at git revision REV (imported beside this one
as ``tfgpu_before``), side by side in the same rounds. --breakdown measures instead the CPU
per image of each stage of the device path (``stage_prefixes``) beside the ceiling's.
"""

import argparse
import dataclasses
import io
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from calibration import calibration  # noqa: E402
from PIL import Image  # noqa: E402
from sample_photos import sample_photos  # noqa: E402

NUM_CLASSES = 10
IMAGE_SIZE = 224  # the crops' side (--image_size)


def fake_photo(rng: np.random.Generator, low: int = 350, high: int = 500) -> Image.Image:
    """A ``low``-``high`` px image of smooth random fields at four scales plus grain: JPEG sizes
    and decode cost close to ImageNet photos (~75 KB at quality 90 for 350-500 px), unlike
    flat colour."""
    h, w = (int(v) for v in rng.integers(low, high + 1, size=2))
    out = np.zeros((h, w, 3), np.float32)
    for cells, amp in ((4, 80), (16, 40), (64, 25), (160, 20)):
        small = (rng.normal(0, 1, (cells, cells, 3)) * 40 + 128).clip(0, 255).astype(np.uint8)
        up = Image.fromarray(small).resize((w, h), Image.BICUBIC)
        out += (np.asarray(up, np.float32) - 128) * amp / 40
    out += rng.normal(0, 6, out.shape)
    return Image.fromarray((out + 128).clip(0, 255).astype(np.uint8))


def photo_sources() -> list:
    """The two real photographs scikit-learn ships (china.jpg, flower.jpg, 427x640)."""
    return [Image.fromarray(a) for a in sample_photos()]


def real_photo(rng: np.random.Generator, sources: list) -> Image.Image:
    """A ~480x355 cut of a real photograph (random crop of 60-100% of its width, rescaled,
    maybe mirrored, colour gains and a brightness shift, light grain): at quality 75 these
    weigh ~35-40 KB, like everyday web photos, and their content is a photo's, not noise."""
    source = sources[int(rng.integers(len(sources)))]
    width = int(rng.integers(440, 521))
    height = int(round(width * rng.uniform(0.70, 0.78)))
    cut_h = min(source.height, int(source.width * rng.uniform(0.6, 1.0) * height / width))
    cut_w = int(cut_h * width / height)
    x = int(rng.integers(0, source.width - cut_w + 1))
    y = int(rng.integers(0, source.height - cut_h + 1))
    image = source.crop((x, y, x + cut_w, y + cut_h)).resize((width, height), Image.BICUBIC)
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    pixels = np.asarray(image, np.float32) * rng.uniform(0.8, 1.2, 3) + rng.uniform(-20, 20)
    # Grain (sensor noise, per pixel, all channels alike): without it ~29 KB, with 7 ~37 KB.
    pixels += rng.normal(0, 7, (height, width, 1))
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8))


# name -> (how each image is made, JPEG quality, sub-directory of --cache_dir, most images)
IMAGE_SETS = {
    "smooth": ("smooth random fields, 350-500 px, ~75 KB", 90, "", None),
    "photo": ("cuts of real photos, ~480x355, ~37 KB", 75, "photo", None),
    # Large photos, where --dct_scaled_decode pays; 300 of them (~0.5 MB each) are enough.
    "large": ("smooth random fields, 1200-1600 px, ~0.6 MB", 90, "large", 300),
}


def make_image(image_set: str, rng: np.random.Generator, sources) -> Image.Image:
    """One image of ``image_set`` (``IMAGE_SETS``)."""
    if image_set == "photo":
        return real_photo(rng, sources)
    return fake_photo(rng, 1200, 1600) if image_set == "large" else fake_photo(rng)


def image_sets(value: str) -> list:
    """--image_set: a name of ``IMAGE_SETS``, a comma list of them, or "both" (smooth, photo)."""
    names = ["smooth", "photo"] if value == "both" else value.split(",")
    unknown = [n for n in names if n not in IMAGE_SETS]
    if unknown:
        raise SystemExit(f"--image_set={value}: {unknown[0]} is not one of {', '.join(IMAGE_SETS)}")
    return names


def build_data(cache_dir: str, num_images: int, image_set: str = "smooth") -> tuple[str, str]:
    """(tfrecord dir, image-folder dir) holding the same JPEG bytes of ``image_set``
    (``IMAGE_SETS``); built once. Prints the mean file size when it builds them."""
    import tensorflow as tf

    from tfgpu.data import recordformat

    _, quality, sub, most = IMAGE_SETS[image_set]
    num_images = min(num_images, most or num_images)
    cache_dir = os.path.join(cache_dir, sub)
    tfr, folder = os.path.join(cache_dir, "tfrecords"), os.path.join(cache_dir, "folder")
    # "-info": built with a dataset_info.json (the sizes --dct_scaled_decode=auto reads).
    done = os.path.join(cache_dir, f"done-{num_images}-info")
    if os.path.exists(done):
        return tfr, folder
    os.makedirs(tfr, exist_ok=True)
    rng = np.random.default_rng(0)
    sources = photo_sources() if image_set == "photo" else None
    num_shards = 16
    paths = [
        os.path.join(tfr, f"train-{i:05d}-of-{num_shards:05d}.tfrecord") for i in range(num_shards)
    ]
    writers = [tf.io.TFRecordWriter(p) for p in paths]
    # Each shard's counts as the converter's workers return them (``worker.write_shard``).
    results = [
        dict(file=os.path.basename(p), num_examples=0, per_class={}, short_sides={}, skipped=[])
        for p in paths
    ]
    total = 0
    for i in range(num_images):
        label = i % NUM_CLASSES
        image = make_image(image_set, rng, sources)
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=quality)
        data = buf.getvalue()
        total += len(data)
        os.makedirs(os.path.join(folder, f"class{label}"), exist_ok=True)
        with open(os.path.join(folder, f"class{label}", f"{i:05d}.jpg"), "wb") as f:
            f.write(data)
        name = f"class{label}/{i:05d}.jpg"
        writers[i % num_shards].write(
            recordformat.encode_example(data, label, image.height, image.width, "JPEG", name)
        )
        count(results[i % num_shards], label, image)
    for w in writers:
        w.close()
    write_info(tfr, results)
    print(f"{image_set}: {num_images} JPEGs, mean {total / num_images / 1000:.1f} KB", flush=True)
    open(done, "w").close()
    return tfr, folder


def count(result: dict, label: int, image) -> None:
    """Adds one written ``image`` of ``label`` to its shard's counts (``result``)."""
    from tfgpu.data import recordformat

    result["num_examples"] += 1
    result["per_class"][label] = result["per_class"].get(label, 0) + 1
    side = str(recordformat.short_side_bucket(image.height, image.width))
    result["short_sides"][side] = result["short_sides"].get(side, 0) + 1


def write_info(tfr: str, results: list) -> None:
    """The dataset_info.json the converter writes, from the shards' counts: its own
    ``_split_entry`` and ``write_info``."""
    from tfgpu.convert import plan

    names = [f"class{c}" for c in range(NUM_CLASSES)]
    entry = plan._split_entry(results, names)
    plan.write_info(tfr, names, {"train": entry}, source="bench/input_pipeline.py")


def mean_file_kb(folder: str) -> float:
    """Mean size of the JPEGs under ``folder``, in KB (1,000 bytes)."""
    sizes = [e.stat().st_size for d in os.scandir(folder) for e in os.scandir(d.path)]
    return sum(sizes) / max(len(sizes), 1) / 1000


def import_before(revision: str):
    """tfgpu as it was at git ``revision``, importable beside this one as ``tfgpu_before``
    (its files taken with ``git archive``, their imports renamed): old and new pipelines then
    run side by side in one process, rounds alternating."""
    import importlib
    import re
    import tarfile
    import tempfile

    if "tfgpu_before" in sys.modules:
        return sys.modules["tfgpu_before"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    where = tempfile.mkdtemp(prefix="tfgpu-before-")
    archive = subprocess.run(
        ["git", "-C", root, "archive", revision, "tfgpu"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    os.rename(os.path.join(where, "tfgpu"), os.path.join(where, "tfgpu_before"))
    for folder, _, files in os.walk(os.path.join(where, "tfgpu_before")):
        for name in (f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                text = re.sub(r"\b(from|import) tfgpu\b", r"\1 tfgpu_before", f.read())
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    sys.path.insert(0, where)
    return importlib.import_module("tfgpu_before")


def tf_sources(
    tfr_dir: str, folder: str, batch: int, shuffle_buffer: int = 1024, before: str = ""
) -> dict:
    """name -> function making a fresh endless tf.data pipeline of (batched) elements."""
    import keras
    import tensorflow as tf

    from tfgpu.data.config import DataConfig
    from tfgpu.data import recordformat
    from tfgpu.data import pipeline
    from tfgpu.data.spec import load_data_spec
    from tfgpu.data.stream import Stream
    from tfgpu.distribute import InputShard

    spec = load_data_spec(tfr_dir, num_classes=NUM_CLASSES)
    cfg = DataConfig(image_size=IMAGE_SIZE, shuffle_buffer=shuffle_buffer)

    def decode_only():
        ds = tf.data.TFRecordDataset(
            list(spec.train_files), num_parallel_reads=cfg.cycle_length
        ).repeat()
        # Whole-image decodes; only their shapes are batched (a ceiling: no copy, no resize).
        decode = lambda r: tf.io.decode_jpeg(recordformat.parse_example(r)["encoded"], channels=3)  # noqa: E731
        ds = ds.map(
            lambda r: (tf.shape(decode(r)),),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=False,
        )
        ds = ds.batch(batch).prefetch(tf.data.AUTOTUNE)
        return ds.with_options(pipeline.dataset_options(False, cfg))

    def keras_folder():
        ds = keras.utils.image_dataset_from_directory(
            folder,
            image_size=(IMAGE_SIZE, IMAGE_SIZE),
            batch_size=batch,
            shuffle=True,
            seed=0,
            verbose=False,
        )
        ds = ds.map(
            lambda x, y: (tf.image.random_flip_left_right(x), y),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        return ds.prefetch(tf.data.AUTOTUNE).repeat()

    def tfgpu(preprocess_on, resize_on="host", dct="off"):
        c = dataclasses.replace(
            cfg, preprocess_on=preprocess_on, resize_on=resize_on, dct_scaled_decode=dct
        )
        stream = Stream(batch_size=batch, global_batch_size=batch, seed=0, deterministic=False)
        return lambda: pipeline.make_train_dataset(spec, c, InputShard(1, 0), stream)

    def tfgpu_before():
        import_before(before)
        from tfgpu_before.data import pipeline as old
        from tfgpu_before.data.config import DataConfig as OldConfig
        from tfgpu_before.data.spec import load_data_spec as old_spec
        from tfgpu_before.data.stream import Stream as OldStream
        from tfgpu_before.distribute import InputShard as OldShard

        c = OldConfig(image_size=IMAGE_SIZE, shuffle_buffer=shuffle_buffer, resize_on="device")
        s = old_spec(tfr_dir, num_classes=NUM_CLASSES)
        stream = OldStream(batch_size=batch, global_batch_size=batch, seed=0, deterministic=False)
        return lambda: old.make_train_dataset(s, c, OldShard(1, 0), stream)

    return {
        CEILING: decode_only,
        **({f"tfgpu at {before}, resize on device": tfgpu_before()} if before else {}),
        OURS: tfgpu("device", "device"),
        "tfgpu, resize on host (default without GPU)": tfgpu("device", "host"),
        "tfgpu, all on host (--preprocess_on=host)": tfgpu("host", "host"),
        DCT_AUTO: tfgpu("device", "device", "auto"),
        "tfgpu, resize on device, --dct_scaled_decode=on": tfgpu("device", "device", "on"),
        "tfgpu, resize on host, --dct_scaled_decode=auto": tfgpu("device", "host", "auto"),
        "(b) keras image_dataset_from_directory": keras_folder,
    }


# What tfgpu runs on a GPU machine (--resize_on=auto): resize, flip and cast in the step.
OURS = "tfgpu, resize on device (default with GPU)"
CEILING = "(a) decode-only ceiling"
# --contenders: short name -> the table's name
CONTENDERS = {
    "a": CEILING,
    "device": OURS,
    "host": "tfgpu, resize on host (default without GPU)",
    "all_host": "tfgpu, all on host (--preprocess_on=host)",
    "b": "(b) keras image_dataset_from_directory",
    "dct_auto": "tfgpu, resize on device, --dct_scaled_decode=auto",
    "dct_on": "tfgpu, resize on device, --dct_scaled_decode=on",
    "host_dct_auto": "tfgpu, resize on host, --dct_scaled_decode=auto",
}
DCT_AUTO = CONTENDERS["dct_auto"]
DEFAULT_CONTENDERS = "a,device,host,all_host,b"
WARMUP_BATCHES = 3  # excluded from timing, the same for every contender (torch too)


def time_tf(make, seconds: float) -> tuple[float, float]:
    """(images/s, host CPU ms per image) of a fresh pipeline of batches, after the warm-up.

    CPU time (all threads of this process) is the steadier number on a shared machine: other
    tenants slow the wall clock, not the work each image costs.
    """
    iterator = iter(make())
    first = next(iterator)
    per_batch = int(first[0].shape[0] if isinstance(first, tuple) else first["weight"].shape[0])
    for _ in range(WARMUP_BATCHES - 1):
        next(iterator)
    count = max(1, int(seconds * 1000 / per_batch))
    cpu, start = time.process_time(), time.perf_counter()
    for _ in range(count):
        next(iterator)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return count * per_batch / wall, cpu / (count * per_batch) * 1e3


# --- where the CPU goes: the device path cut after each stage (--breakdown) ------------------


def stage_prefixes(spec, cfg, batch: int, seed: int = 0) -> dict:
    """stage name -> function making tfgpu's device path (``--resize_on=device``) cut after
    that stage: each prefix is the one before plus one stage, so differences of CPU per image
    are what each stage costs. The last one is ``make_train_dataset`` itself."""
    import tensorflow as tf

    from tfgpu.data import broken, host_ops, packing, pipeline, records
    from tfgpu.data.stream import Stream
    from tfgpu.distribute import InputShard

    options = pipeline.dataset_options(False, cfg)
    report = broken.reporter(spec.train_files)

    def examples():
        return records.train_examples(spec.train_files, cfg, spec, 0, seed, False)

    def upto(stage: int):
        """The per-example map of ``decode_train_example``, cut after ``stage`` (1: window)."""

        def fn(example):
            example_seed = host_ops.example_seed(seed, example["epoch"], example["position"])
            encoded = example["encoded"]
            window = host_ops.random_crop_window(
                tf.image.extract_jpeg_shape(encoded), example_seed, cfg.crop_min_area
            )
            out = {"window": window, "label": example["label"]}
            if stage >= 2:
                out["image"] = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
            if stage >= 3:
                image = out.pop("image")
                out["pixels"] = packing.to_variant(tf.reshape(image, [-1]))
                out["sizes"] = tf.shape(image)[:2]
            if stage >= 4:
                out["flip"] = host_ops.draw_flip(example_seed)
                out["weight"] = broken.weight(example["valid"], example["origin"], report)
            return out

        return lambda: examples().map(fn, num_parallel_calls=AUTOTUNE, deterministic=False)

    def batched():
        return packing.flat_batches(upto(4)(), batch, False)

    def whole():
        stream = Stream(batch_size=batch, global_batch_size=batch, seed=seed, deterministic=False)
        return pipeline.make_train_dataset(spec, cfg, InputShard(1, 0), stream)

    prefixes = {
        "read, parse, check, shuffle (records)": records,
        "+ crop-window draw (jpeg shape, sample box)": upto(1),
        "+ fused decode-and-crop": upto(2),
        "+ crop into a variant (flat uint8)": upto(3),
        "+ flip draw, weight/broken bookkeeping": upto(4),
        "+ batch, pad and join the crops into int64 words": batched,
        "= make_train_dataset (conds, prefetch, options)": whole,
    }
    batched_ones = (batched, whole)
    return {
        name: (lambda m=make: m().with_options(options), make in batched_ones)
        for name, make in prefixes.items()
    }


AUTOTUNE = -1  # tf.data.AUTOTUNE, without importing TensorFlow at module level


def cpu_per_image(make, num_images: int, per_element: int, warmup: int = 2048) -> float:
    """Process CPU µs per image to pull ``num_images`` through a fresh ``make()``, after
    ``warmup`` images (start-up, the first blocks read ahead), inside a ``tf.function`` loop:
    no Python per element, so stages as cheap as tens of µs show."""
    import tensorflow as tf

    iterator = iter(make())

    @tf.function
    def drain(count):
        for _ in tf.range(count):
            next(iterator)

    drain(tf.constant(max(1, warmup // per_element)))
    count = max(1, num_images // per_element)
    start = time.process_time()
    drain(tf.constant(count))
    return (time.process_time() - start) / (count * per_element) * 1e6


def breakdown(runs: dict, batch: int, rounds: int, num_images: int) -> None:
    """Prints, per image set, each stage's CPU µs per image (differences of cumulative
    prefixes, ``stage_prefixes``) beside the decode-only ceiling's, medians of rounds."""
    measured = {s: {name: [] for name in stages} for s, stages in runs.items()}
    for r in range(rounds):
        for image_set, stages in runs.items() if r % 2 == 0 else list(runs.items())[::-1]:
            names = list(stages) if r % 2 == 0 else list(stages)[::-1]
            for name in names:
                per_element = batch if stages[name][1] else 1
                measured[image_set][name].append(
                    cpu_per_image(stages[name][0], num_images, per_element)
                )
        print(f"breakdown round {r + 1} done", flush=True)
    median = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    for image_set, stages in measured.items():
        print(f"\n{image_set}: CPU µs per image, median of {rounds} rounds [range]\n")
        print("| stage | cumulative µs/img | this stage µs/img |\n|---|---:|---:|")
        before = None
        for name, values in stages.items():
            m = median(values)
            aside = name in (CEILING, PULL)  # not a stage of the pipeline
            step = "" if before is None or aside else f"{m - before:+.0f}"
            print(f"| {name} | {m:.0f} [{min(values):.0f}-{max(values):.0f}] | {step} |")
            before = before if aside else m


TORCH_SCRIPT = r"""
import json, os, sys, time, torch
from torchvision import datasets, transforms
folder, batch, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                         transforms.PILToTensor()])
loader = torch.utils.data.DataLoader(datasets.ImageFolder(folder, tf), batch_size=batch,
    shuffle=True, num_workers=os.cpu_count(), drop_last=True, persistent_workers=True)
def batches():
    while True:
        yield from loader
it = batches()
for _ in range(int(sys.argv[4])): next(it)
count = max(1, int(seconds * 1000 / batch))
start = time.perf_counter()
for _ in range(count): x, y = next(it); assert x.dtype == torch.uint8
print(json.dumps(count * batch / (time.perf_counter() - start)))
"""


def time_torch(python: str, folder: str, batch: int, seconds: float) -> float:
    out = subprocess.run(
        [python, "-c", TORCH_SCRIPT, folder, str(batch), str(seconds), str(WARMUP_BATCHES)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def torch_available(python: str) -> bool:
    if not python:
        return False
    probe = subprocess.run([python, "-c", "import torch, torchvision"], capture_output=True)
    return probe.returncode == 0


def print_table(results: dict, cpu: dict, command: str) -> None:
    """Median images/s per contender; ratios are medians of per-round ratios (each round runs
    the contenders side by side), with their range over rounds."""
    median = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    ceiling = results[CEILING]
    ours = results[OURS]
    print(f"\n`{command}`\n")
    print(
        "| pipeline | images/s (median) | host CPU ms/img | x (a) [range] "
        "| x (a) by CPU/img [range] | tfgpu x this [range] |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, rates in results.items():
        vs_a = [r / c for r, c in zip(rates, ceiling)]
        ours_vs = [o / r for o, r in zip(ours, rates)]
        cell = lambda v: f"{median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"  # noqa: E731
        ms, by_cpu = "-", "-"
        if cpu.get(name):
            ms = f"{median(cpu[name]):.2f}"
            # images per CPU-second against the ceiling's: what a host with N free cores gets
            by_cpu = cell([c / m for c, m in zip(cpu[CEILING], cpu[name])])
        print(
            f"| {name} | {median(rates):.0f} | {ms} | {cell(vs_a)} | {by_cpu} | {cell(ours_vs)} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_images", type=int, default=1000)
    parser.add_argument("--cache_dir", default=os.path.expanduser("~/.cache/tfgpu/bench_input"))
    parser.add_argument(
        "--image_set", default="smooth", help=f"{', '.join(IMAGE_SETS)}, a comma list, or both"
    )
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--image_size", type=int, default=224, help="the crops' side")
    parser.add_argument("--seconds", type=float, default=6.0, help="~ per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--breakdown_images", type=int, default=4000, help="per measurement")
    parser.add_argument("--torch_python", default="", help="a python with torch+torchvision")
    parser.add_argument("--shuffle_buffer", type=int, default=1024, help="tfgpu's (default 10000)")
    parser.add_argument(
        "--before", default="", help="git revision: its device path runs beside this one"
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="instead: CPU per image of each stage of the device path, and of the ceiling",
    )
    parser.add_argument(
        "--contenders", default=DEFAULT_CONTENDERS, help="comma list of " + ",".join(CONTENDERS)
    )
    args = parser.parse_args()
    global IMAGE_SIZE
    IMAGE_SIZE = args.image_size
    print("calibration:", calibration(), flush=True)
    sets = image_sets(args.image_set)
    # The ceiling and tfgpu's device path are what every ratio is against: always measured.
    keep = {CEILING, OURS} | {CONTENDERS[k] for k in args.contenders.split(",")}
    runs = {}  # image set -> (sources, folder)
    for image_set in sets:
        tfr, folder = build_data(args.cache_dir, args.num_images, image_set)
        print(f"{image_set}: {IMAGE_SETS[image_set][0]}; mean file {mean_file_kb(folder):.1f} KB")
        sources = tf_sources(tfr, folder, args.batch, args.shuffle_buffer, args.before)
        keep_set = keep | {k for k in sources if k.startswith("tfgpu at ")}
        runs[image_set] = ({k: v for k, v in sources.items() if k in keep_set}, folder)
    if args.breakdown:
        return run_breakdown(args, sets)
    use_torch = torch_available(args.torch_python)
    if not use_torch:
        print("(c) skipped: no --torch_python with torch and torchvision")
    results = {s: {name: [] for name in runs[s][0]} for s in sets}
    cpu = {s: {name: [] for name in runs[s][0]} for s in sets}
    for r in range(args.rounds):
        # Each round: every set, every contender, side by side; the order flips every round.
        for image_set in sets if r % 2 == 0 else sets[::-1]:
            sources, folder = runs[image_set]
            for name in list(sources) if r % 2 == 0 else list(sources)[::-1]:
                rate, ms = time_tf(sources[name], args.seconds)
                results[image_set][name].append(rate)
                cpu[image_set][name].append(ms)
            if use_torch:
                name = "(c) torch DataLoader + torchvision"
                rate = time_torch(args.torch_python, folder, args.batch, args.seconds)
                results[image_set].setdefault(name, []).append(rate)
            rounded = {k: round(v[-1]) for k, v in results[image_set].items()}
            print(f"round {r + 1} {image_set}: " + json.dumps(rounded), flush=True)
    for image_set in sets:
        print(f"\n{image_set}: {IMAGE_SETS[image_set][0]}")
        print_table(results[image_set], cpu[image_set], "python " + " ".join(sys.argv))
        for name in (OURS, DCT_AUTO):
            if name in runs[image_set][0]:
                print_handover_bytes(runs[image_set][0][name], name)


# What pulling one element costs the measuring loop itself: in every unbatched row, not in the
# batched ones (there it is per batch), so "+ batch" gains it back.
PULL = "(the measuring loop's own pull, per element)"


def pull_alone():
    import tensorflow as tf

    return tf.data.Dataset.from_tensors(tf.constant(0)).repeat()


def run_breakdown(args, sets: list) -> None:
    """--breakdown: the ceiling and ``stage_prefixes`` on each image set, ``breakdown``."""
    from tfgpu.data.config import DataConfig
    from tfgpu.data.spec import load_data_spec

    cfg = DataConfig(image_size=IMAGE_SIZE, shuffle_buffer=args.shuffle_buffer, resize_on="device")
    runs = {}
    for image_set in sets:
        tfr, folder = build_data(args.cache_dir, args.num_images, image_set)
        spec = load_data_spec(tfr, num_classes=NUM_CLASSES)
        ceiling = tf_sources(tfr, folder, args.batch, args.shuffle_buffer)[CEILING]
        runs[image_set] = {
            CEILING: (ceiling, True),
            PULL: (pull_alone, False),
            **stage_prefixes(spec, cfg, args.batch),
        }
    breakdown(runs, args.batch, args.rounds, args.breakdown_images)


def print_handover_bytes(make, name: str, num_batches: int = 8) -> None:
    """Host-to-device bytes per image of --resize_on=device, against uint8 S x S x 3."""
    import tensorflow as tf

    # int64 words: 8 bytes each.
    sizes = [8 * int(tf.size(b["pixels"])) / b["weight"].shape[0] for b in make().take(num_batches)]
    print(
        f"\n{name}: {np.mean(sizes):,.0f} bytes/image handed over "
        f"({np.mean(sizes) / (IMAGE_SIZE**2 * 3):.2f}x uint8 {IMAGE_SIZE}^2x3, "
        f"{np.mean(sizes) / (IMAGE_SIZE**2 * 3 * 4):.2f}x float32)"
    )


if __name__ == "__main__":
    sys.exit(main())
