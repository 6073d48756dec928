"""``tfgpu-predict`` (``python -m tfgpu.predict``): top-k classes of images, as CSV.

    tfgpu-predict --model_dir=runs/r50 [--checkpoint=latest|best|PATH|FILE.keras]
        photo.jpg more_photos/ --output=predictions.csv [--top_k=5]
    tfgpu-predict --model_dir=runs/r50 --split=validation --output=val.csv

``inference.predict`` says how images are read and what the CSV holds.
"""

from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import command_settings, define_flags
from tfgpu.cli import head
from tfgpu.train.op_errors import translate

PROG = "tfgpu-predict"  # its flags: cli/settings.py PredictSettings


def main(argv):
    return run_command(lambda: _command(argv[1:]), prog=PROG, translate=translate)


def _command(inputs) -> None:
    s, _ = command_settings(PROG)
    head.start(s)
    predict(inputs, s.model_dir, s.checkpoint, s.data_dir, s.split, s.output, s.top_k, s.batch_size)


def predict(
    inputs=(),
    model_dir: str = "",
    checkpoint: str = "latest",
    data_dir: str = "",
    split: str = "",
    output: str = "",
    top_k: int = 5,
    batch_size: int = 32,
) -> list[dict]:
    """Predicts as the command does (``inference.predict.predict`` on the run opened by
    ``head.open_run``); returns the rows (also written to ``output``, or printed as CSV
    without it). Call it once TensorFlow has started."""
    from tfgpu.inference import predict as prediction  # noqa: PLC0415 (TensorFlow: after its quiet start)

    request = (data_dir, split, output, top_k, batch_size)
    files = prediction.check_request(inputs, model_dir, checkpoint, *request)
    with_data = bool(split or data_dir or model_dir)  # else a .keras file alone
    trained = head.open_run(model_dir, checkpoint, with_data=with_data, data_dir=data_dir)
    return prediction.predict(trained, files, split, output, top_k, batch_size)


def run():
    """Console-script entry point (``tfgpu-predict``)."""
    define_flags(command=PROG)
    run_app(main, prog=PROG, doc=__doc__)


if __name__ == "__main__":
    run()
