"""A trained run exported as a SavedModel with serving signatures, a LiteRT model (float32,
float16, int8) or an ONNX model, each checked against predict before it is put in place: what
``tfgpu-export`` does (docs/deploying.md).

``checked.export`` makes one: one module per format (``saved_model``, ``litert``, ``onnx``:
``write`` and ``runner``), ``source`` for the run's model and images, ``check`` for the
comparison and the report, ``serving`` for the serving signatures and the writer of the
SavedModel and .keras file (the end of a training run's export/ uses it too). This module,
without TensorFlow, says what can be exported before anything is loaded: the formats, their
quantizations and packages, and where an export and what goes with it are written
(``companions``), and ``ExportOptions``, what to export and how it is checked.
"""

import importlib.util
import os
from dataclasses import dataclass

from tfgpu.errors import UsageError, install_extra
from tfgpu.models import MODELS
from tfgpu.settings import setting

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
        "only the LiteRT format is quantized here; ONNX Runtime's own tools "
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
# Every family exports in every format today (tests/inference/test_export_formats.py builds
# each one).
FAMILY_LIMITS: dict = {}


@dataclass(frozen=True)
class ExportOptions:
    """What to export and how it is checked: the settings of ``tfgpu-export`` beside the run
    it opens (``cli/settings.ExportSettings`` is these and the run's head), the one argument
    of ``checked.export`` and ``cli.export.export_run``."""

    format: str = setting(  # noqa: A003  (the flag's name)
        "saved_model", "What to export to: saved_model, litert or onnx."
    )
    quantize: str = setting(
        "none",
        "LiteRT only: none, float16 weights, or int8 calibrated on --calibration_images "
        "training images.",
    )
    full_integer: bool = setting(False, "With --quantize=int8: uint8 input and output tensors too.")
    output: str = setting(
        "",
        "Where the export goes (default: the run's export/saved_model, export/model.tflite, "
        "export/model_int8.tflite, export/model.onnx, ..., with report.json, labels.txt and "
        "model.keras beside it); given, its report and labels are named after it "
        "(OUTPUT.report.json, OUTPUT.labels.txt) and nothing else is written beside it.",
    )
    check_images: int = setting(256, "Validation images the export is checked on.")
    calibration_images: int = setting(256, "Training images int8 is calibrated on.")
    max_prob_diff: float = setting(
        0.0,
        "Refuse a float export whose probabilities depart from the Keras model's by more "
        "(0: 1e-4 for float32, 2e-2 for float16).",
    )
    max_top1_change: float = setting(
        -1.0,
        "Refuse an int8 export that changes more than this share of top-1 answers "
        "(-1: report only).",
    )
    batch_size: int = setting(32, "Images per call in the check and the throughput.")


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
    return f"--format={fmt} needs {' and '.join(absent)}: {install_extra('export')}"


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


def check_request(model_dir: str, options: ExportOptions) -> None:
    """Raises UsageError (one line) for an export of run ``model_dir`` as ``options`` say that
    cannot be made before anything is loaded: an unsupported format or quantization, an
    --output without the format's suffix, no place to put it, or the format's packages
    missing."""
    fmt, output = options.format, options.output
    suffix = {"litert": ".tflite", "onnx": ".onnx"}.get(fmt, "")
    why = unsupported(fmt, options.quantize, options.full_integer)
    if not why and output and not output.endswith(suffix):
        why = f"--output={output}: a --format={fmt} file's name ends in {suffix}"
    if not why and not model_dir and not output:
        why = "give --model_dir (the export goes to its export/), or --output"
    why = why or missing_packages(fmt)
    if why:
        raise UsageError(why)


def family_of(name: str) -> str:
    """The family (``FAMILIES``) of registry model ``name``: resnet18 -> resnet,
    efficientnetv2_s -> efficientnetv2."""
    family, args = MODELS.get(name, ("", {}))
    if family != "applications":
        return family
    app = args["app_name"].lower()  # keras.applications' name: DenseNet121, EfficientNetV2B0
    return next(f for f in sorted(FAMILIES, key=len, reverse=True) if app.startswith(f))
