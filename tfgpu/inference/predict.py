"""Top-k classes of images, as CSV: what ``tfgpu-predict`` does.

One row per image: ``path,label_1,prob_1,...,label_k,prob_k,error``. Images are preprocessed
by evaluation's own function (``pipeline.decode_eval_image``: center crop, resize) and
predicted in batches, with the run's EMA weights when it kept them and its --eval_tta views
averaged (as its evaluation). A file
that is not an image, or is broken, is named on stderr and in its row's ``error``; the others
are still predicted. Records of a converted split are named by their stored file name.

The CSV is written as ``csv_text`` says: UTF-8, a name's bytes that are not UTF-8 kept as they
are (``surrogateescape``), a text cell that a spreadsheet would run as a formula (first
character ``= + - @``, tab or CR) or that starts with ``'`` given a leading ``'`` (OWASP's
advice); ``--output`` is checked before anything is loaded and written whole (a temporary
file in its folder, then a rename: a symlink there is replaced, its target never written).
"""

import contextlib
import csv
import io
import os
import sys

import numpy as np
import tensorflow as tf

from tfgpu import compat
from tfgpu.data import pipeline
from tfgpu.data.spec import split_spec
from tfgpu.errors import UsageError, warn
from tfgpu.files import check_output, replacing, shown, write_bytes_to_stdout
from tfgpu.inference import opened
from tfgpu.step.loops import tta_probabilities


def image_files(inputs) -> list[str]:
    """The files named, and every (non-hidden) file under the folders named, sorted per folder.
    A name that does not exist is a UsageError."""
    files = []
    for name in inputs:
        path = os.path.expanduser(name)
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                files += [os.path.join(root, n) for n in sorted(names) if not n.startswith(".")]
        elif os.path.exists(path):
            files.append(path)
        else:
            raise UsageError(f"{name}: no such file or folder")
    return files


def check_request(inputs, model_dir, checkpoint, data_dir, split, output, top_k, batch_size):
    """The image files to predict (``inputs``: files and folders; ``image_files``), once the
    request of the command's flags can be done: images or a split, a run or a .keras file,
    positive counts, a writable ``output``. A UsageError names what cannot, before anything
    is loaded."""
    if bool(inputs) == bool(split):
        raise UsageError("give image files or folders, or --split (of --data_dir or the run's)")
    if not model_dir and not checkpoint.endswith(".keras"):
        raise UsageError("give --model_dir, or --checkpoint=FILE.keras")
    if top_k < 1 or batch_size < 1:
        raise UsageError("--top_k and --batch_size must be positive")
    if split and not (model_dir or data_dir):
        raise UsageError("--split needs --data_dir (or a --model_dir whose run names its data)")
    if output:
        check_output(output)  # before any work: a result is never lost
    return image_files(inputs)


def predict(
    trained, files=(), split: str = "", output: str = "", top_k: int = 5, batch_size: int = 32
) -> list[dict]:
    """Predicts as the command does with ``trained`` (an ``opened.Opened``; without its data
    spec, a .keras file alone: classes by number), the image ``files`` or the records of
    ``split``; returns the rows (also written to ``output``, or printed as CSV without
    it)."""
    target = check_output(output) if output else ""  # before any work: a result is never lost
    t = _load(trained)
    names = t["class_names"]
    k = min(top_k, len(names))
    if split:
        rows = _predict_split(t, split, k, batch_size)
    else:
        rows = _predict_files(t, files, k, batch_size)
    data = csv_text(rows, k).encode("utf-8", "surrogateescape")
    if target:
        with replacing(target) as f:
            f.write(data)
    else:
        write_bytes_to_stdout(data)
    errors = sum(1 for r in rows if r["error"])
    print(
        f"predicted {len(rows) - errors} image(s), {errors} error(s)"
        + (f": {shown(output)}" if output else ""),
        file=sys.stderr if not output else sys.stdout,
        flush=True,
    )
    return rows


def _load(trained) -> dict:
    """{"trained", "predict(images uint8) -> probabilities", "class_names"}."""
    if trained.spec is not None:
        names = opened.class_names(trained.spec)  # checked before any image is read
    else:  # a .keras file alone: classes by number
        names = [str(i) for i in range(trained.model.output_shape[-1])]
    return {"trained": trained, "predict": predictor(trained), "class_names": names}


def predictor(trained):
    """The function predictions are made with: uint8 images [N, S, S, 3] (numpy or
    tensor) -> float32 probabilities [N, C] (numpy), with the run's EMA weights when it kept
    them and averaged over its --eval_tta views, as its evaluation (``trained``: an
    ``opened.Opened``)."""
    model = trained.model
    size, tta = trained.data.image_size, trained.train.eval_tta

    # Traced once for any number of images: the last batch is smaller, and tracing a large
    # model again takes seconds (efficientnet_b0 on 2 cores: ~5 s).
    @tf.function(input_signature=[tf.TensorSpec([None, size, size, 3], tf.uint8)])
    def probabilities(images):
        return tta_probabilities(model, tf.cast(images, tf.float32), tta)

    def predict_images(images):
        ema = compat.ema_weights(trained.optimizer) if trained.optimizer else None
        with ema or contextlib.nullcontext():
            return probabilities(images).numpy()

    predict_images.probabilities = probabilities  # the model alone, with the weights it holds now
    return predict_images


def _rows(names, paths, probs, k: int) -> list[dict]:
    rows = []
    for path, p in zip(paths, probs):
        best = np.argsort(-p, kind="stable")[:k]
        rows.append({"path": path, "top": [(names[i], float(p[i])) for i in best], "error": ""})
    return rows


def _predict_files(t: dict, files, k: int, batch_size: int) -> list[dict]:
    """Each file read and preprocessed alone (a broken one is its row's error), the images
    predicted ``batch_size`` at a time; rows in the order of ``files``."""
    data = t["trained"].data
    prepare = tf.function(lambda encoded: pipeline.decode_eval_image(encoded, data))
    rows: dict = {}
    batch, batch_paths = [], []

    def flush():
        if batch:
            probs = t["predict"](np.stack(batch))
            rows.update((r["path"], r) for r in _rows(t["class_names"], batch_paths, probs, k))
            batch.clear()
            batch_paths.clear()

    for path in files:
        error = ""
        try:
            with open(path, "rb") as f:
                encoded = f.read()
            image, valid = prepare(tf.constant(encoded))
            if not bool(valid):
                error = "not a whole image (cut short, or not an image)"
        except OSError as err:
            error = f"cannot read it: {err.strerror}"
        except tf.errors.OpError as err:
            error = "cannot decode it: " + (err.message.strip().splitlines() or ["?"])[0][:200]
        if error:
            warn(f"{shown(path)}: {error}")
            rows[path] = {"path": path, "top": [], "error": error}
            continue
        batch.append(image.numpy())
        batch_paths.append(path)
        if len(batch) == batch_size:
            flush()
    flush()
    return [rows[p] for p in files]


def _predict_split(t: dict, split: str, k: int, batch_size: int) -> list[dict]:
    """Every record of ``split``, in order; a broken one is its row's error."""
    trained = t["trained"]
    spec = split_spec(trained.spec, split)
    rows = []
    for batch in pipeline.make_named_eval_dataset(spec, trained.data, batch_size):
        # A stored name that is not UTF-8 keeps its bytes (as file names from os.walk do).
        paths = [n.decode("utf-8", "surrogateescape") for n in batch["name"].numpy()]
        probs = t["predict"](batch["image"])
        for row, valid in zip(_rows(t["class_names"], paths, probs, k), batch["valid"].numpy()):
            if not valid:
                row = dict(row, top=[], error="not a whole image (cut short, or not an image)")
                warn(f"{shown(row['path'])}: {row['error']}")
            rows.append(row)
    return rows


def header(k: int) -> list[str]:
    return ["path", *[f"{c}_{i}" for i in range(1, k + 1) for c in ("label", "prob")], "error"]


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # OWASP's CSV injection list


def csv_cell(text: str) -> str:
    """``text`` safe in a spreadsheet: a leading ``'`` when it starts as a formula would
    (``FORMULA_STARTS``), or with ``'`` itself, so that removing one leading ``'`` from a
    cell that has it always gives the text back."""
    return "'" + text if text.startswith((*FORMULA_STARTS, "'")) else text


def csv_text(rows, k: int) -> str:
    """The CSV of ``rows`` (header, then one row per image) as text; a path may hold lone
    surrogates (``os.fsdecode`` of bytes that are not UTF-8), which the caller encodes with
    ``surrogateescape``: reading the file with ``encoding="utf-8",
    errors="surrogateescape"`` and ``os.fsencode`` on a path gives its bytes."""
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(header(k))
    for r in rows:
        cells = [c for label, p in r["top"] for c in (csv_cell(label), f"{p:.6f}")]
        tail = [*[""] * (2 * k - len(cells)), csv_cell(r["error"])]
        writer.writerow([csv_cell(r["path"]), *cells, *tail])
    return out.getvalue()
