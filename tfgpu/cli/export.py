"""``tfgpu-export`` (``python -m tfgpu.export``): a trained run as a SavedModel with serving
signatures, a LiteRT model or an ONNX model, each checked before it is put in place
(``inference.export``; docs/deploying.md).

    tfgpu-export --model_dir=runs/r50 [--checkpoint=latest|best|PATH] \\
        --format=saved_model|litert|onnx [--quantize=none|float16|int8] [--output=PATH]
"""

from absl import app, logging

from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import command_settings, define_flags
from tfgpu.cli.head import start
from tfgpu.train.op_errors import translate
from tfgpu.inference import export

PROG = "tfgpu-export"  # its flags: cli/settings.py ExportSettings


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.WARNING)  # the SavedModel writer logs each step at INFO
    return run_command(_command, prog=PROG, translate=translate)


def _command() -> None:
    s, _ = command_settings(PROG)
    export.check_request(s.model_dir, s.format, s.quantize, s.full_integer, s.output)
    start(s)
    from tfgpu.inference.export.checked import export as checked_export  # noqa: PLC0415 (TensorFlow: after its quiet start)

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
    define_flags(command=PROG)
    run_app(main, prog=PROG, doc=__doc__)


if __name__ == "__main__":
    run()
