"""``tfgpu-export`` (``python -m tfgpu.export``): a trained run as a SavedModel with serving
signatures, a LiteRT model or an ONNX model, each checked before it is put in place
(``inference.export``; docs/deploying.md).

    tfgpu-export --model_dir=runs/r50 [--checkpoint=latest|best|PATH] \\
        --format=saved_model|litert|onnx [--quantize=none|float16|int8] [--output=PATH]
"""

from absl import app, logging

from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import command_settings, define_flags
from tfgpu.cli import head
from tfgpu.train.op_errors import translate
from tfgpu.inference import export

PROG = "tfgpu-export"  # its flags: cli/settings.py ExportSettings (ExportOptions + RunHead)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.WARNING)  # the SavedModel writer logs each step at INFO
    return run_command(_command, prog=PROG, translate=translate)


def _command() -> None:
    s, _ = command_settings(PROG)
    export.check_request(s.model_dir, s)
    head.start(s)
    export_run(s.model_dir, s, s.checkpoint, s.data_dir)  # s: the ExportOptions and the run


def export_run(
    model_dir: str,
    options: export.ExportOptions,
    checkpoint: str = "latest",
    data_dir: str = "",
    log=print,
) -> dict:
    """Exports run ``model_dir`` at ``checkpoint`` (on ``data_dir``: "" the run's data) as
    ``options`` say, as the command does (``inference.export.checked.export`` of the run
    opened by ``head.open_run``); returns its report entry. Raises UsageError for what cannot
    be exported (one line, before the run is opened), ExportRefused when the check fails.
    Call it once TensorFlow has started."""
    export.check_request(model_dir, options)
    from tfgpu.inference.export import checked  # noqa: PLC0415 (TensorFlow: after its quiet start)

    checked.check_counts(options)
    # --checkpoint=latest of a run still training: the newest when it is read.
    newest = checkpoint == "latest"
    trained = head.open_run(model_dir, checkpoint, newest=newest, data_dir=data_dir)
    return checked.export(trained, options, log=log)


def run():
    """Console-script entry point (``tfgpu-export``)."""
    define_flags(command=PROG)
    run_app(main, prog=PROG, doc=__doc__)


if __name__ == "__main__":
    run()
