"""How fast does the host hand 224x224 uint8 random-resized-crop batches to the accelerator?

Writes >= 1,000 ImageNet-like JPEGs (350-500 px, quality 90, smooth random fields with
texture) once into a cache dir, as TFRecords and as an image folder, then measures in ONE
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

NUM_CLASSES = 10


def fake_photo(rng: np.random.Generator) -> Image.Image:
    """A 350-500 px image of smooth random fields at four scales plus grain: JPEG sizes and
    decode cost close to ImageNet photos (~75 KB at quality 90), unlike flat colour."""
    h, w = (int(v) for v in rng.integers(350, 501, size=2))
    out = np.zeros((h, w, 3), np.float32)
    for cells, amp in ((4, 80), (16, 40), (64, 25), (160, 20)):
        small = (rng.normal(0, 1, (cells, cells, 3)) * 40 + 128).clip(0, 255).astype(np.uint8)
        up = Image.fromarray(small).resize((w, h), Image.BICUBIC)
        out += (np.asarray(up, np.float32) - 128) * amp / 40
    out += rng.normal(0, 6, out.shape)
    return Image.fromarray((out + 128).clip(0, 255).astype(np.uint8))


def build_data(cache_dir: str, num_images: int) -> tuple[str, str]:
    """(tfrecord dir, image-folder dir) holding the same JPEG bytes; built once."""
    import tensorflow as tf

    from tfgpu import recordformat

    tfr, folder = os.path.join(cache_dir, "tfrecords"), os.path.join(cache_dir, "folder")
    done = os.path.join(cache_dir, f"done-{num_images}")
    if os.path.exists(done):
        return tfr, folder
    os.makedirs(tfr, exist_ok=True)
    rng = np.random.default_rng(0)
    num_shards = 16
    writers = [
        tf.io.TFRecordWriter(os.path.join(tfr, f"train-{i:05d}-of-{num_shards:05d}.tfrecord"))
        for i in range(num_shards)
    ]
    for i in range(num_images):
        label = i % NUM_CLASSES
        image = fake_photo(rng)
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=90)
        data = buf.getvalue()
        os.makedirs(os.path.join(folder, f"class{label}"), exist_ok=True)
        with open(os.path.join(folder, f"class{label}", f"{i:05d}.jpg"), "wb") as f:
            f.write(data)
        name = f"class{label}/{i:05d}.jpg"
        writers[i % num_shards].write(
            recordformat.encode_example(data, label, image.height, image.width, "JPEG", name)
        )
    for w in writers:
        w.close()
    open(done, "w").close()
    return tfr, folder


def tf_sources(tfr_dir: str, folder: str, batch: int, shuffle_buffer: int = 1024) -> dict:
    """name -> function making a fresh endless tf.data pipeline of (batched) elements."""
    import keras
    import tensorflow as tf

    from tfgpu.data.config import DataConfig
    from tfgpu import recordformat
    from tfgpu.data import pipeline
    from tfgpu.data.spec import load_data_spec
    from tfgpu.distribute import InputShard

    spec = load_data_spec(tfr_dir, num_classes=NUM_CLASSES)
    cfg = DataConfig(image_size=224, shuffle_buffer=shuffle_buffer)

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
            folder, image_size=(224, 224), batch_size=batch, shuffle=True, seed=0, verbose=False
        )
        ds = ds.map(
            lambda x, y: (tf.image.random_flip_left_right(x), y),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        return ds.prefetch(tf.data.AUTOTUNE).repeat()

    def tfgpu(preprocess_on, resize_on="host"):
        c = dataclasses.replace(cfg, preprocess_on=preprocess_on, resize_on=resize_on)
        return lambda: pipeline.make_train_dataset(
            spec,
            c,
            InputShard(1, 0),
            batch_size=batch,
            global_batch_size=batch,
            seed=0,
            deterministic=False,
        )

    return {
        "(a) decode-only ceiling": decode_only,
        OURS: tfgpu("device", "device"),
        "tfgpu, resize on host (default without GPU)": tfgpu("device", "host"),
        "tfgpu, all on host (--preprocess_on=host)": tfgpu("host", "host"),
        "(b) keras image_dataset_from_directory": keras_folder,
    }


# What tfgpu runs on a GPU machine (--resize_on=auto): resize, flip and cast in the step.
OURS = "tfgpu, resize on device (default with GPU)"
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
    ceiling = results["(a) decode-only ceiling"]
    ours = results[OURS]
    print(f"\n`{command}`\n")
    print(
        "| pipeline | images/s (median) | host CPU ms/img | x (a) [range] | tfgpu x this [range] |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, rates in results.items():
        vs_a = [r / c for r, c in zip(rates, ceiling)]
        ours_vs = [o / r for o, r in zip(ours, rates)]
        cell = lambda v: f"{median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"  # noqa: E731
        ms = f"{median(cpu[name]):.2f}" if cpu.get(name) else "-"
        print(f"| {name} | {median(rates):.0f} | {ms} | {cell(vs_a)} | {cell(ours_vs)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_images", type=int, default=1000)
    parser.add_argument("--cache_dir", default=os.path.expanduser("~/.cache/tfgpu/bench_input"))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=6.0, help="~ per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--torch_python", default="", help="a python with torch+torchvision")
    parser.add_argument("--shuffle_buffer", type=int, default=1024, help="tfgpu's (default 10000)")
    args = parser.parse_args()
    print("calibration:", calibration(), flush=True)
    tfr, folder = build_data(args.cache_dir, args.num_images)
    sources = tf_sources(tfr, folder, args.batch, args.shuffle_buffer)
    use_torch = torch_available(args.torch_python)
    if not use_torch:
        print("(c) skipped: no --torch_python with torch and torchvision")
    results = {name: [] for name in sources}
    cpu = {name: [] for name in sources}
    if use_torch:
        results["(c) torch DataLoader + torchvision"] = []
    for r in range(args.rounds):
        for name, make in sources.items():
            rate, ms = time_tf(make, args.seconds)
            results[name].append(rate)
            cpu[name].append(ms)
        if use_torch:
            name = "(c) torch DataLoader + torchvision"
            results[name].append(time_torch(args.torch_python, folder, args.batch, args.seconds))
        print(f"round {r + 1}: " + json.dumps({k: round(v[-1]) for k, v in results.items()}))
    print_table(results, cpu, "python " + " ".join(sys.argv))
    print_handover_bytes(sources[OURS])


def print_handover_bytes(make, num_batches: int = 8) -> None:
    """Host-to-device bytes per image of --resize_on=device, against uint8 224x224x3."""
    import tensorflow as tf

    # int64 words: 8 bytes each.
    sizes = [8 * int(tf.size(b["pixels"])) / b["weight"].shape[0] for b in make().take(num_batches)]
    print(
        f"\nresize on device: {np.mean(sizes):,.0f} bytes/image handed over "
        f"({np.mean(sizes) / (224 * 224 * 3):.2f}x uint8 224x224x3, "
        f"{np.mean(sizes) / (224 * 224 * 3 * 4):.2f}x float32)"
    )


if __name__ == "__main__":
    sys.exit(main())
