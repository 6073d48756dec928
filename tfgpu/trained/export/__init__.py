"""A trained run exported as a SavedModel with serving signatures, a LiteRT model (float32,
float16, int8) or an ONNX model, each checked against predict before it is put in place: what
``tfgpu-export`` does (docs/deploying.md).

One module per format (``saved_model``, ``litert``, ``onnx``: ``write`` and ``runner``),
``source`` for the run's model and images, ``check`` for the comparison and the report. This
module says what can be exported before anything heavy is imported: the formats, their
quantizations and packages, and where an export and its companions go (``companions``).
"""

import importlib
import importlib.util
import os
import shutil

from tfgpu.errors import ExportRefused, UsageError

FORMATS = ("saved_model", "litert", "onnx")
QUANTIZE = ("none", "float16", "int8")
# Per format: the quantizations it writes, and why not the others (one line).
QUANTIZES = {
    "saved_model": (
        ("none",),
        "a SavedModel keeps the trained float weights; quantize for LiteRT (--format=litert)",
    ),
    "litert": (("none", "float16", "int8"), ""),
    "onnx": (
        ("none",),
        "tfgpu-export quantizes for LiteRT only; ONNX Runtime's own tools "
        "(onnxruntime.quantization) quantize the float model this writes",
    ),
}
# The packages each format needs beyond TensorFlow (the [export] extra): import name -> pip's.
NEEDS = {
    "saved_model": {},
    "litert": {"ai_edge_litert": "ai-edge-litert"},
    "onnx": {"tf2onnx": "tf2onnx", "onnxruntime": "onnxruntime"},
}
FAMILIES = (
    "tiny_cnn",
    "resnet",
    "cifar_resnet",
    "wide_resnet",
    "densenet",
    "efficientnet",
    "efficientnetv2",
)
# Combinations of a model family and a format that do not export, with why (one line each).
# Every family exports in every format today (tests/test_export_formats.py builds each one).
FAMILY_LIMITS: dict = {}


def unsupported(fmt: str, quantize: str, full_integer: bool = False, family: str = "") -> str:
    """Why ``fmt`` with ``quantize`` (and ``full_integer`` I/O) does not export ``family``'s
    models, in one line; "" when it does."""
    if fmt not in FORMATS or quantize not in QUANTIZE:
        return (
            f"choose --format from {', '.join(FORMATS)} and --quantize from {', '.join(QUANTIZE)}"
        )
    quantizes, why_not = QUANTIZES[fmt]
    if quantize not in quantizes:
        return f"--format={fmt} --quantize={quantize} is not supported: {why_not}"
    if full_integer and not (fmt == "litert" and quantize == "int8"):
        return "--full_integer (uint8 input and output) is for --format=litert --quantize=int8"
    why = FAMILY_LIMITS.get((family, fmt))
    return f"--format={fmt} does not export the {family} family: {why}" if why else ""


def missing_packages(fmt: str) -> str:
    """ "" when ``fmt``'s packages are installed, else the one line saying how to get them."""
    absent = [pip for name, pip in NEEDS[fmt].items() if importlib.util.find_spec(name) is None]
    if not absent:
        return ""
    return f"--format={fmt} needs {' and '.join(absent)}: pip install 'tfgpu[export]'"


def default_name(fmt: str, quantize: str, full_integer: bool) -> str:
    """The file (or folder) name an export gets in the run's export/."""
    if fmt == "saved_model":
        return "saved_model"
    suffix = (
        "" if quantize == "none" else f"_{quantize}" + ("_full_integer" if full_integer else "")
    )
    return f"model{suffix}.{'tflite' if fmt == 'litert' else 'onnx'}"


def unchecked_path(path: str) -> str:
    """Where an export waits for its check: model.unchecked.tflite, saved_model.unchecked."""
    stem, ext = os.path.splitext(path)
    return f"{stem}.unchecked{ext}"


def companions(output: str, in_run: bool) -> dict:
    """Where what goes with the export at ``output`` is written: {"report", "labels" (for a
    LiteRT or ONNX file), "keras" (for a SavedModel; "": none)}. In a run's export/
    (``in_run``: no --output was given) they are shared by the run's exports, as the end of
    the run leaves them: report.json, labels.txt, model.keras. Beside an --output, only files
    named after it: ``output``.report.json and ``output``.labels.txt, and no model.keras (the
    folder may hold another export's)."""
    directory = os.path.dirname(os.path.abspath(output))
    if in_run:
        names = {"report": "report.json", "labels": "labels.txt", "keras": "model.keras"}
        return {k: os.path.join(directory, v) for k, v in names.items()}
    return {"report": f"{output}.report.json", "labels": f"{output}.labels.txt", "keras": ""}


def export(
    model_dir: str = "",
    checkpoint: str = "latest",
    fmt: str = "saved_model",
    quantize: str = "none",
    output: str = "",
    data_dir: str = "",
    full_integer: bool = False,
    check_images: int = 256,
    calibration_images: int = 256,
    max_prob_diff: float = 0.0,
    max_top1_change: float = -1.0,
    batch_size: int = 32,
    log=print,
) -> dict:
    """Exports as the command does; returns its report.json entry. Raises UsageError for what
    cannot be exported (one line), ExportRefused when the check fails (the export is then
    left at ``unchecked_path(output)``)."""
    check_request(model_dir, fmt, quantize, full_integer, output)
    if min(check_images, calibration_images, batch_size) < 1:
        raise UsageError("--check_images, --calibration_images and --batch_size must be positive")
    # TensorFlow only once the request is checked: a wrong format is one line at once
    # (tests/test_imports.py: this package imports without TensorFlow).
    from tfgpu.trained.export import check
    from tfgpu.trained.export.source import load_source

    source = load_source(model_dir, checkpoint, data_dir)
    family = family_of(source.trained.config.model.name)
    why = unsupported(fmt, quantize, full_integer, family)
    if why:
        raise UsageError(why)
    name = default_name(fmt, quantize, full_integer)
    in_run = not output
    output = os.path.expanduser(output) or os.path.join(model_dir, "export", name)
    beside = companions(output, in_run)
    staged = unchecked_path(output)
    _remove(staged)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    module = importlib.import_module(f"tfgpu.trained.export.{fmt}")
    calibration = (
        _calibration(source, calibration_images, batch_size) if quantize == "int8" else None
    )
    log(f"exporting {source.checkpoint} as {name} ...")
    module.write(source, staged, quantize, calibration, full_integer)
    entry = _checked(source, module.runner(staged), check_images, batch_size)
    entry.update(format=fmt, quantize=quantize, full_integer=full_integer, bytes=_size(staged))
    refused = check.verdict(entry, quantize, max_prob_diff, max_top1_change)
    return _settle(entry, staged, output, refused, source, beside, log)


def check_request(model_dir: str, fmt: str, quantize: str, full_integer: bool, output: str):
    """Raises UsageError (one line) for an export that cannot be made before anything is
    loaded: an unsupported format or quantization, an --output without the format's suffix,
    no place to put it, or the format's packages missing."""
    suffix = {"litert": ".tflite", "onnx": ".onnx"}.get(fmt, "")
    why = unsupported(fmt, quantize, full_integer)
    if not why and output and not output.endswith(suffix):
        why = f"--output={output}: a --format={fmt} file's name ends in {suffix}"
    if not why and not model_dir and not output:
        why = "give --model_dir (the export goes to its export/), or --output"
    why = why or missing_packages(fmt)
    if why:
        raise UsageError(why)


def _settle(entry: dict, staged: str, output: str, refused: str, source, beside, log) -> dict:
    """Puts a checked export in place (``output``, and its ``companions``: the labels beside
    a file, model.keras beside the run's SavedModel) or, when ``refused``, leaves it at
    ``staged`` and raises ExportRefused; either way the report gets ``entry``, with its
    verdict and file."""
    from tfgpu.trained.export import check

    key = os.path.basename(output)
    if refused:
        entry.update(verdict=f"refused: {refused}", file=staged)
        report = check.add_to_report(beside["report"], key, entry)
        raise ExportRefused(f"{staged}: refused: {refused} (see {report})")
    _remove(output)
    os.replace(staged, output)
    if os.path.isdir(output):
        if beside["keras"]:
            with source.evaluation_weights():
                source.model.save(beside["keras"])
    else:
        _write_labels(beside["labels"], source.class_names)
    entry.update(verdict="ok", file=output)
    log(summary_line(entry, check.add_to_report(beside["report"], key, entry)))
    return entry


def family_of(name: str) -> str:
    """The family (``FAMILIES``) of registry model ``name``: resnet18 -> resnet,
    efficientnetv2_s -> efficientnetv2."""
    from tfgpu.models import MODELS

    family, args = MODELS.get(name, ("", {}))
    if family != "applications":
        return family
    app = args["app_name"].lower()  # keras.applications' name: DenseNet121, EfficientNetV2B0
    return next(f for f in sorted(FAMILIES, key=len, reverse=True) if app.startswith(f))


def _calibration(source, count: int, batch_size: int):
    """Up to ``count`` whole training images, as evaluation preprocesses them, float32."""
    import numpy as np

    from tfgpu.trained.export.source import split_batches

    images = []
    for batch in split_batches(source, "train", count, batch_size).as_numpy_iterator():
        images.append(batch["image"][batch["valid"]])
    return np.concatenate(images).astype(np.float32)


def _checked(source, run, check_images: int, batch_size: int) -> dict:
    """The check's figures (``check.measure``), with the timings of the Keras model
    (``reference``) and of the export."""
    from tfgpu.trained.export import check
    from tfgpu.trained.export.source import split_batches
    from tfgpu.trained.predict import predictor

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
    entry.update(model=trained.config.model.name, image_size=source.image_size)
    entry["class_names"] = source.class_names
    return entry


def summary_line(entry: dict, report: str) -> str:
    """``model.tflite: top-1 agreement 100.0%, max |dp| 2.1e-07 on 24 images; 1.2 ms/image,
    850 img/s (Keras: ...); report.json``."""
    worst = min(entry["outputs"].values(), key=lambda o: o["top1_agreement"])
    diff = max(o["max_prob_diff"] for o in entry["outputs"].values())
    ref = entry["reference"]
    return (
        f"{entry['file']}: top-1 agreement {worst['top1_agreement']:.1%}, max |dp| {diff:.2g} "
        f"on {entry['num_images']} images; {entry['latency_ms']:.2f} ms/image, "
        f"{entry['images_per_sec']:,.0f} img/s (Keras: {ref['latency_ms']:.2f} ms, "
        f"{ref['images_per_sec']:,.0f} img/s); {report}"
    )


def _write_labels(path: str, class_names) -> None:
    """The labels of a LiteRT or ONNX file: class i on line i (LiteRT's convention)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(f"{n}\n" for n in class_names))


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def _size(path: str) -> int:
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
