"""``tfgpu-predict`` (``python -m tfgpu.predict``): top-k classes of images, as CSV.

    tfgpu-predict --model_dir=runs/r50 [--checkpoint=latest|best|PATH|FILE.keras]
        photo.jpg more_photos/ --output=predictions.csv [--top_k=5]
    tfgpu-predict --model_dir=runs/r50 --split=validation --output=val.csv

``inference.predict`` says how images are read and what the CSV holds.
"""

from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import command_settings, define_flags
from tfgpu.cli.head import start
from tfgpu.train.op_errors import translate

PROG = "tfgpu-predict"  # its flags: cli/settings.py PredictSettings


def main(argv):
    return run_command(lambda: _command(argv[1:]), prog=PROG, translate=translate)


def _command(inputs) -> None:
    s, _ = command_settings(PROG)
    start(s)
    from tfgpu.inference.predict import predict  # noqa: PLC0415 (TensorFlow: after its quiet start)

    predict(inputs, s.model_dir, s.checkpoint, s.data_dir, s.split, s.output, s.top_k, s.batch_size)


def run():
    """Console-script entry point (``tfgpu-predict``)."""
    define_flags(command=PROG)
    run_app(main, prog=PROG, doc=__doc__)


if __name__ == "__main__":
    run()
