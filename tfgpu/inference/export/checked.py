"""An export made, checked and put in place: what ``tfgpu-export`` does once its request is
checked (``export.check_request``). The format's module writes it as ``*.unchecked*``, it is run
beside predict on the validation images (``check``), and only then moved to its name; the report
says how it went (docs/deploying.md).
"""

import glob
import os
import shutil

import numpy as np

from tfgpu.errors import ExportRefused, UsageError
from tfgpu.files import locked, replacing
from tfgpu.inference.export.serving import keras_file_refusal
from tfgpu.inference.export import (
    ExportOptions,
    check,
    companions,
    default_name,
    family_of,
    litert,
    onnx,
    saved_model,
    unchecked_path,
    unsupported,
)
from tfgpu.inference.export.source import load_source, split_batches
from tfgpu.inference.predict import predictor

FORMAT_MODULES = {"saved_model": saved_model, "litert": litert, "onnx": onnx}


def export(trained, options: ExportOptions, log=print) -> dict:
    """Exports ``trained`` (an ``opened.Opened``: the run at one checkpoint, on the data it is
    checked with) as ``options`` say, as the command does, once ``check_request`` and
    ``check_counts`` passed; returns its report entry. Raises UsageError for what cannot be
    exported (one line), ExportRefused when the check fails (the export is then left at
    ``unchecked_path(output)``)."""
    fmt, quantize, full_integer = options.format, options.quantize, options.full_integer
    batch_size = options.batch_size
    source = load_source(trained)
    family = family_of(trained.model_settings.name)
    why = unsupported(fmt, quantize, full_integer, family)
    if why:
        raise UsageError(why)
    name = default_name(fmt, quantize, full_integer)
    in_run = not options.output
    output = os.path.expanduser(options.output) or os.path.join(trained.model_dir, "export", name)
    beside = companions(output, in_run)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    staged = _staging(output)
    module = FORMAT_MODULES[fmt]
    calibration = (
        _calibration(source, options.calibration_images, batch_size) if quantize == "int8" else None
    )
    log(f"exporting {source.checkpoint} as {name} ...")
    module.write(source, staged, quantize, calibration, full_integer)
    entry = _checked(source, module.runner(staged), options.check_images, batch_size)
    entry.update(format=fmt, quantize=quantize, full_integer=full_integer, bytes=_size(staged))
    refused = check.verdict(entry, quantize, options.max_prob_diff, options.max_top1_change)
    try:
        with locked(os.path.dirname(os.path.abspath(output))):
            entry, line = _settle(entry, staged, output, refused, source, beside)
    finally:
        _remove(staged)  # left only when putting it in place failed
    log(line)
    return entry


def check_counts(options: ExportOptions) -> None:
    """A UsageError in one line unless ``options``' images to check and calibrate on, and its
    batch, are positive counts."""
    if min(options.check_images, options.calibration_images, options.batch_size) < 1:
        raise UsageError("--check_images, --calibration_images and --batch_size must be positive")


def _settle(entry: dict, staged: str, output: str, refused: str, source, beside) -> tuple:
    """Puts a checked export in place (``output``, and its ``companions``: the labels beside
    a file, model.keras beside the run's SavedModel) or, when ``refused``, moves it to
    ``unchecked_path(output)`` and raises ExportRefused; either way the report gets
    ``entry``, with its verdict and file. Returns (entry, the summary line). Called with the
    folder locked: each file here is replaced whole, and the report keeps every export's."""
    key = os.path.basename(output)
    if refused:
        unchecked = unchecked_path(output)
        _remove(unchecked)
        os.replace(staged, unchecked)
        entry.update(verdict=f"refused: {refused}", file=unchecked)
        report = check.add_to_report(beside["report"], key, entry)
        raise ExportRefused(f"{unchecked}: refused: {refused} (see {report})")
    _remove(output)
    os.replace(staged, output)
    if os.path.isdir(output):
        if beside["keras"] and not keras_file_refusal(source.model):
            _save_keras(source, beside["keras"])
    else:
        _write_labels(beside["labels"], source.class_names)
    entry.update(verdict="ok", file=output)
    return entry, summary_line(entry, check.add_to_report(beside["report"], key, entry))


def _save_keras(source, path: str) -> None:
    """The model with its evaluation weights as a .keras file at ``path``, written whole
    (another name first: Keras writes the zip in place)."""
    temp = f"{path[: -len('.keras')]}.{os.getpid()}.tmp.keras"
    try:
        with source.evaluation_weights():
            source.model.save(temp)
        os.replace(temp, path)
    finally:
        _remove(temp)


def _staging(output: str) -> str:
    """This process's own name for the export to ``output`` while it is written and checked
    (``model.unchecked.PID.tflite``): two exports to one --output at once each write their
    own, and take turns putting them in place (``_settle``). Those of exports killed before
    (their process gone) are removed first."""
    stem, ext = os.path.splitext(output)
    for path in glob.glob(f"{glob.escape(stem)}.unchecked.*{ext}"):
        pid = path[len(stem) + len(".unchecked.") : len(path) - len(ext)]
        if pid.isdigit() and not _alive(int(pid)):
            _remove(path)
    return f"{stem}.unchecked.{os.getpid()}{ext}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's
    return True


def _calibration(source, count: int, batch_size: int):
    """Up to ``count`` whole training images, as evaluation preprocesses them, float32."""
    images = []
    for batch in split_batches(source, "train", count, batch_size).as_numpy_iterator():
        images.append(batch["image"][batch["valid"]])
    return np.concatenate(images).astype(np.float32)


def _checked(source, run, check_images: int, batch_size: int) -> dict:
    """The check's figures (``check.measure``), with the timings of the Keras model
    (``reference``) and of the export."""
    reference = predictor(source.trained)
    batches = split_batches(source, "validation", check_images, batch_size)
    entry = check.measure(reference, run, batches.as_numpy_iterator())
    images = next(batches.as_numpy_iterator())["image"]
    # The Keras model timed with its evaluation weights held, not swapped in per call as
    # predict does (a cost of predict's, not of the model).
    with source.evaluation_weights():
        keras_model = lambda x: reference.probabilities(x).numpy()
        entry["reference"].update(check.timing(keras_model, images))
    entry.update(check.timing(lambda x: run({"image": x}), images), machine=check.machine())
    trained = source.trained
    entry.update(split="validation", checkpoint=source.checkpoint, step=trained.step)
    entry.update(model=trained.model_settings.name, image_size=source.image_size, tta=source.tta)
    entry["class_names"] = source.class_names
    return entry


def summary_line(entry: dict, report: str) -> str:
    """``model.tflite: top-1 agreement 100.0%, max |dp| 2.1e-07 on 24 images; 1.2 ms/image,
    850 img/s (Keras: ...); report.json``."""
    worst = min(entry["outputs"].values(), key=lambda o: o["top1_agreement"])
    diff = max(o["max_prob_diff"] for o in entry["outputs"].values())
    ref = entry["reference"]
    views = f" (TTA {entry['tta']})" if entry.get("tta", "none") != "none" else ""
    return (
        f"{entry['file']}{views}: top-1 agreement {worst['top1_agreement']:.1%}, max |dp| "
        f"{diff:.2g} "
        f"on {entry['num_images']} images; {entry['latency_ms']:.2f} ms/image, "
        f"{entry['images_per_sec']:,.0f} img/s (Keras: {ref['latency_ms']:.2f} ms, "
        f"{ref['images_per_sec']:,.0f} img/s); {report}"
    )


def _write_labels(path: str, class_names) -> None:
    """The labels of a LiteRT or ONNX file: class i on line i (LiteRT's convention), whole."""
    with replacing(path) as f:
        f.write("".join(f"{n}\n" for n in class_names).encode("utf-8"))


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def _size(path: str) -> int:
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
