"""Every export checked, not hoped for: the exported model and tfgpu.predict on the same
images, compared, timed, written to report.json, and refused beyond tolerance.

The figures per output of the export (a SavedModel has three: pixels, bytes, tf.Examples):
``top1_agreement`` with predict, ``max_prob_diff`` (the largest |probability difference| over
every image and class), ``top1`` against the labels (predict's beside it). Latency (one image
a call, median) and throughput (a batch a call) are measured on the machine the command runs
on: a report, not a promise.
"""

import os
import platform
import time

import numpy as np

from tfgpu.errors import ExportRefused
from tfgpu.files import read_json, write_json

# The largest |probability difference| a float export may show beside the Keras model: float32
# graphs differ by rounding only (kernel order, fused ops); float16 weights by ~1e-3 relative.
FLOAT_TOLERANCE = {"none": 1e-4, "float16": 2e-2}
REPORT = "report.json"


def measure(reference, run, batches) -> dict:
    """Runs ``reference`` (uint8 images -> probabilities) and ``run`` (batch -> {output:
    probabilities}) on ``batches`` (numpy dicts of ``source.split_batches``); images that do
    not look whole are left out, as evaluation leaves them out. Returns {"num_images",
    "reference": {"top1"}, "outputs": {name: {"top1_agreement", "max_prob_diff", "top1"}}}."""
    expected, got, labels = [], {}, []
    for batch in batches:
        keep = np.asarray(batch["valid"], bool)
        if not keep.any():
            continue
        batch = {k: np.asarray(v)[keep] for k, v in batch.items()}
        expected.append(np.asarray(reference(batch["image"]), np.float32))
        for name, probabilities in run(batch).items():
            got.setdefault(name, []).append(np.asarray(probabilities, np.float32))
        labels.append(batch["label"])
    if not expected:
        raise ExportRefused("no image to check the export on (the split holds none whole)")
    expected, labels = np.concatenate(expected), np.concatenate(labels)
    best = expected.argmax(-1)
    outputs = {}
    for name, parts in got.items():
        probabilities = np.concatenate(parts)
        outputs[name] = {
            "top1_agreement": float(np.mean(probabilities.argmax(-1) == best)),
            "max_prob_diff": float(np.max(np.abs(probabilities - expected))),
            "top1": float(np.mean(probabilities.argmax(-1) == labels)),
        }
    return {
        "num_images": int(len(labels)),
        "reference": {"top1": float(np.mean(best == labels))},
        "outputs": outputs,
    }


def timing(call, images: np.ndarray, single_calls: int = 10, batch_calls: int = 3) -> dict:
    """{"latency_ms": median over ``single_calls`` one-image calls, "images_per_sec": over
    ``batch_calls`` calls on all of ``images``}, after one warm-up call of each shape."""
    call(images[:1])
    seconds = []
    for i in range(min(single_calls, len(images))):
        start = time.perf_counter()
        call(images[i : i + 1])
        seconds.append(time.perf_counter() - start)
    call(images)
    start = time.perf_counter()
    for _ in range(batch_calls):
        call(images)
    elapsed = time.perf_counter() - start
    return {
        "latency_ms": 1000 * float(np.median(seconds)),
        "images_per_sec": batch_calls * len(images) / max(elapsed, 1e-9),
        "batch": int(len(images)),
    }


def machine() -> dict:
    """Where the latency and throughput were measured."""
    return {"cpu_count": os.cpu_count(), "machine": platform.machine(), "system": platform.system()}


def verdict(entry: dict, quantize: str, max_prob_diff: float, max_top1_change: float) -> str:
    """ "" when ``entry`` (a measured export) passes, else why not (one line). Float exports
    (none, float16) must stay within ``max_prob_diff`` (default ``FLOAT_TOLERANCE``) on every
    output; int8 ones may change at most ``max_top1_change`` of the top-1 answers (default:
    reported only)."""
    for name, out in entry["outputs"].items():
        if quantize == "int8":
            change = 1.0 - out["top1_agreement"]
            if max_top1_change >= 0 and change > max_top1_change:
                return (
                    f"{name}: the int8 model changes {change:.1%} of the top-1 answers, more "
                    f"than --max_top1_change={max_top1_change:g}"
                )
            continue
        bound = max_prob_diff if max_prob_diff > 0 else FLOAT_TOLERANCE[quantize]
        if out["max_prob_diff"] > bound:
            return (
                f"{name}: a probability departs from the Keras model's by "
                f"{out['max_prob_diff']:.3g}, beyond the float tolerance {bound:g}"
            )
    return ""


def add_to_report(path: str, key: str, entry: dict) -> str:
    """Writes ``entry`` as ``key`` of the report at ``path`` (other exports' kept); returns
    ``path``."""
    try:
        report = read_json(path) if os.path.exists(path) else {}
    except ValueError:
        report = {}  # a damaged report is replaced, not trusted
    report.setdefault("exports", {})[key] = entry
    write_json(path, report)
    return path
