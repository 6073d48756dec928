"""How fast does ``python -m tfgpu.predict`` (its library function, ``predict.predict``) go,
against the exported SavedModel called directly?

One model (``--model`` at ``--image_size``, random weights: speed does not depend on them) is
exported as tfgpu exports a run (``serving.export_model``: model.keras and a SavedModel whose
``serve`` takes uint8 images); ``--num_images`` generated JPEGs (320x240, quality 90) are
written to a folder and converted by tools/to_tfrecord.py. Then, in ONE run, ``--rounds``
rounds of every contender in turn, the order reversed every other round (the machine is
shared: the ratios come from side-by-side rounds; the table gives medians and their range):

  (a)  tfgpu.predict's loop over the JPEG folder (``predict._predict_files``: each file read
       and preprocessed, batches predicted, top-k rows; then the CSV written), the model loaded
       from the exported model.keras once, as ``predict.predict`` loads it (``predict._load``)
  (b)  its loop over the converted split (``predict._predict_split``: the same images, as
       records), the same way
  (w)  the whole library call, ``predict.predict(files, checkpoint=model.keras, ...)``: what
       a user waits for, start-up (loading the model, tracing) included
  (c)  the SavedModel's ``serve`` signature (``tf.saved_model.load(...).signatures["serve"]``)
       on the same images, preprocessed beforehand by evaluation's own function
       (``pipeline.decode_eval_image``) and batched in memory: the model alone
  (d)  the same signature fed by a plain tf.data pipeline that reads and preprocesses the
       files with that function (parallel map, batch, prefetch): an end-to-end anchor

(a), (b), (c) and (d) are loaded, made and warmed up (each function traced) once, before the
rounds; (w) pays its start-up every time, as a command does.

It prints a calibration line (bench/calibration.py) so the figures can be scaled.

    python bench/predict.py [--model=efficientnet_b0] [--image_size=64] [--num_images=256]
        [--batch=32] [--rounds=3]
"""

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from calibration import calibration  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = ("a", "b", "c", "d")
A, B = "(a) predict's loop, JPEG folder", "(b) predict's loop, converted split"
W = "(w) predict.predict, whole call, JPEG folder"
C, D = "(c) SavedModel serve, preprocessed batches", "(d) SavedModel serve fed by tf.data"


def make_photos(root: str, n: int) -> list[str]:
    """``n`` JPEGs in ``root/validation/<class>/`` (one more per class in ``train/``, which the
    converter wants); the validation files, in the order tfgpu.predict walks the folder."""
    from PIL import Image

    from tfgpu.inference.predict import image_files

    rng = np.random.default_rng(0)
    for split, count in (("train", len(CLASSES)), ("validation", n)):
        for i in range(count):
            folder = os.path.join(root, split, CLASSES[i % len(CLASSES)])
            os.makedirs(folder, exist_ok=True)
            # Smooth fields plus grain: JPEG sizes near photos', unlike flat colour or noise.
            coarse = rng.integers(0, 256, (15, 20, 3), dtype=np.uint8)
            image = np.repeat(np.repeat(coarse, 16, axis=0), 16, axis=1)
            image = (image + rng.integers(0, 24, image.shape, dtype=np.uint8)).astype(np.uint8)
            Image.fromarray(image).save(os.path.join(folder, f"img{i:04d}.jpg"), quality=90)
    return image_files([os.path.join(root, "validation")])


def convert(photos: str, out: str) -> None:
    """tools/to_tfrecord.py on the folder, as a user runs it."""
    tool = os.path.join(ROOT, "tools", "to_tfrecord.py")
    cmd = [sys.executable, tool, f"--input={photos}", f"--output_dir={out}", "--noprogress"]
    subprocess.run(cmd, check=True, capture_output=True)


def export(workdir: str, model_name: str, image_size: int) -> str:
    """The model exported as a run exports it; the export folder."""
    from tfgpu import models
    from tfgpu.inference.export.serving import export_model

    directory = os.path.join(workdir, "export")
    model = models.build_model(model_name, len(CLASSES), image_size)
    export_model(model, directory, image_size)
    return directory


def _data_config(image_size: int):
    """The DataConfig tfgpu.predict uses for a .keras file of that input size."""
    from tfgpu.config import rundir as head

    return head.run_config("", image_size=image_size).data


def preprocessed(files: list[str], image_size: int, batch: int) -> list:
    """The files as predict's model sees them: ``decode_eval_image`` with the settings
    predict uses, in uint8 batches of ``batch``, in memory."""
    import tensorflow as tf

    from tfgpu.data import pipeline

    data = _data_config(image_size)
    prepare = tf.function(lambda encoded: pipeline.decode_eval_image(encoded, data)[0])
    images = [prepare(tf.io.read_file(f)).numpy() for f in files]
    return [tf.constant(np.stack(images[i : i + batch])) for i in range(0, len(images), batch)]


def contenders(files, data_dir: str, export_dir: str, image_size: int, batch: int, csv: str):
    """{name: function that predicts every image once}."""
    return {
        **library(files, data_dir, os.path.join(export_dir, "model.keras"), batch, csv),
        **saved_model(files, export_dir, image_size, batch),
    }


def library(files, data_dir: str, keras_file: str, batch: int, csv: str) -> dict:
    """(a), (b) and (w): tfgpu.predict's own functions, the model loaded as it loads it."""
    from tfgpu.cli import head
    from tfgpu.cli.predict import predict as predict_command
    from tfgpu.inference import predict

    trained = predict._load(head.open_run("", keras_file, data_dir=data_dir))
    k = min(5, len(trained["class_names"]))  # predict's --top_k default

    def write(rows):  # as predict.predict writes --output
        with open(csv, "wb") as f:
            f.write(predict.csv_text(rows, k).encode("utf-8", "surrogateescape"))

    def folder():
        write(predict._predict_files(trained, files, k, batch))

    def split():
        write(predict._predict_split(trained, "validation", k, batch))

    def whole():
        with contextlib.redirect_stdout(io.StringIO()):  # its "predicted N image(s)" line
            predict_command(files, checkpoint=keras_file, data_dir=data_dir, output=csv)

    folder()  # warm-up: traces the model's function, as a call's first batch does
    return {A: folder, B: split, W: whole}


def saved_model(files, export_dir: str, image_size: int, batch: int) -> dict:
    """(c) and (d): the SavedModel loaded and its signature warmed up, (d)'s pipeline made,
    once (as predict's start-up is left out of its figures "after start-up")."""
    import tensorflow as tf

    from tfgpu.data import pipeline

    serve = tf.saved_model.load(os.path.join(export_dir, "saved_model")).signatures["serve"]
    batches = preprocessed(files, image_size, batch)
    serve(images=batches[0])
    data = _data_config(image_size)
    fed = tf.data.Dataset.from_tensor_slices(files).map(
        lambda path: pipeline.decode_eval_image(tf.io.read_file(path), data)[0],
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    fed = fed.batch(batch).prefetch(tf.data.AUTOTUNE)

    def run(images_batches):
        for images in images_batches:
            next(iter(serve(images=images).values())).numpy()  # the logits, as numpy

    return {C: lambda: run(batches), D: lambda: run(fed)}


def timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(fns: dict, rounds: int) -> dict:
    """{name: [(wall, cpu) per round]}, every contender once a round, the order reversed
    every other round (slow drifts of a shared machine weigh on all alike)."""
    times = {name: [] for name in fns}
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else list(reversed(fns)):
            times[name].append(timed(fns[name]))
        walls = ", ".join(f"{name[:3]} {times[name][-1][0]:.2f} s" for name in fns)
        print(f"  round {r + 1}/{rounds}: {walls}", flush=True)
    return times


def report(times: dict, n: int) -> None:
    """The table of images/s and CPU ms per image, then the ratios (per round; median)."""
    ips = {name: [n / wall for wall, _ in rounds] for name, rounds in times.items()}
    print("\n| contender | images/s, median [range] | CPU ms/image |\n|---|---:|---:|")
    for name, rounds in times.items():
        cpu = statistics.median(c for _, c in rounds) / n * 1e3
        print(f"| {name} | {_spread(ips[name], '{:,.0f}')} | {cpu:.2f} |")
    startup = [w - n / f for (w, _), f in zip(times[W], ips[A])]
    print(f"| (w) less (a): start-up | {_spread(startup, '{:.1f} s')} | |")
    print("\n| ratio (per round) | median [range] |\n|---|---:|")
    for num, den in ((A, C), (B, C), (A, D), (B, D), (W, C)):
        ratios = [x / y for x, y in zip(ips[num], ips[den])]
        print(f"| {num[:3]} / {den[:3]} | {_spread(ratios, '{:.2f}x')} |")


def _spread(values: list, fmt: str) -> str:
    med, lo, hi = statistics.median(values), min(values), max(values)
    return f"{fmt.format(med)} [{fmt.format(lo)}-{fmt.format(hi)}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="efficientnet_b0")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--num_images", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # each predict call makes (and traces) its function anew
    print("calibration:", calibration(), flush=True)
    with tempfile.TemporaryDirectory(prefix="tfgpu-bench-predict-") as work:
        files = make_photos(os.path.join(work, "photos"), args.num_images)
        convert(os.path.join(work, "photos"), os.path.join(work, "data"))
        export_dir = export(work, args.model, args.image_size)
        csv = os.path.join(work, "predictions.csv")
        data = os.path.join(work, "data")
        fns = contenders(files, data, export_dir, args.image_size, args.batch, csv)
        n = len(files)
        print(
            f"{args.model} at {args.image_size}x{args.image_size}, {n} JPEGs of 320x240, "
            f"batches of {args.batch}, {args.rounds} rounds",
            flush=True,
        )
        times = measure(fns, args.rounds)
    report(times, n)
    print("\ncalibration:", calibration())


if __name__ == "__main__":
    main()
