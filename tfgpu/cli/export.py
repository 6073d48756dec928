"""``tfgpu-export`` (``python -m tfgpu.export``): a trained run as a SavedModel with serving
signatures, a LiteRT model or an ONNX model, each checked before it is put in place
(``trained.export``; docs/deploying.md).

    tfgpu-export --model_dir=runs/r50 [--checkpoint=latest|best|PATH] \\
        --format=saved_model|litert|onnx [--quantize=none|float16|int8] [--output=PATH]
"""

from dataclasses import dataclass

from absl import app, flags, logging

from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import define_settings, settings_from
from tfgpu.cli.trained import RunHead, start
from tfgpu.schema import setting
from tfgpu.train.faults import translate
from tfgpu.trained import export

FLAGS = flags.FLAGS
PROG = "tfgpu-export"


@dataclass(frozen=True)
class ExportSettings(RunHead):
    """What is exported, where, and how the export is checked."""

    format: str = setting(  # noqa: A003 (the flag's name)
        "saved_model", "What to export to.", choices=export.FORMATS
    )
    quantize: str = setting(
        "none",
        "LiteRT only: float16 weights, or int8 calibrated on --calibration_images training images.",
        choices=export.QUANTIZE,
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


def define_flags(flag_values=FLAGS) -> None:
    """The command's flags: what is exported, and how the export is checked."""
    define_settings(ExportSettings, PROG, flag_values)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.WARNING)  # the SavedModel writer logs each step at INFO
    return run_command(_command, prog=PROG, translate=translate)


def _command() -> None:
    s = settings_from(ExportSettings)
    export.check_request(s.model_dir, s.format, s.quantize, s.full_integer, s.output)
    start(s)
    from tfgpu.trained.export.checked import export as checked_export  # noqa: PLC0415 (TensorFlow: after its quiet start)

    checked_export(
        s.model_dir,
        s.checkpoint,
        s.format,
        s.quantize,
        s.output,
        s.data_dir,
        s.full_integer,
        s.check_images,
        s.calibration_images,
        s.max_prob_diff,
        s.max_top1_change,
        s.batch_size,
    )


def run():
    """Console-script entry point (``tfgpu-export``)."""
    define_flags()
    run_app(main, prog=PROG)


if __name__ == "__main__":
    run()
