"""``tfgpu-predict`` (``python -m tfgpu.predict``): top-k classes of images, as CSV.

    tfgpu-predict --model_dir=runs/r50 [--checkpoint=latest|best|PATH|FILE.keras]
        photo.jpg more_photos/ --output=predictions.csv [--top_k=5]
    tfgpu-predict --model_dir=runs/r50 --split=validation --output=val.csv

``trained.predict`` says how images are read and what the CSV holds.
"""

from dataclasses import dataclass

from absl import flags

from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import define_settings, settings_from
from tfgpu.cli.trained import RunHead, start
from tfgpu.schema import setting
from tfgpu.train.faults import translate

FLAGS = flags.FLAGS
PROG = "tfgpu-predict"


@dataclass(frozen=True)
class PredictSettings(RunHead):
    """What tfgpu-predict classifies, and where the CSV goes."""

    split: str = setting("", "Predict a split of the dataset (--data_dir, or the run's) instead.")
    output: str = setting(
        "",
        "Write the CSV to this file (default: stdout; checked before anything is loaded; "
        "written whole through a temporary file in its folder, then renamed).",
    )
    top_k: int = setting(5, "Classes per image, most probable first.")
    batch_size: int = setting(32, "Images per forward pass.")


def define_flags(flag_values=FLAGS) -> None:
    """The command's flags (shared names with tfgpu-evaluate keep one definition)."""
    define_settings(PredictSettings, PROG, flag_values)


def main(argv):
    return run_command(lambda: _command(argv[1:]), prog=PROG, translate=translate)


def _command(inputs) -> None:
    s = settings_from(PredictSettings)
    start(s)
    from tfgpu.trained.predict import predict  # noqa: PLC0415 (TensorFlow: after its quiet start)

    predict(inputs, s.model_dir, s.checkpoint, s.data_dir, s.split, s.output, s.top_k, s.batch_size)


def run():
    """Console-script entry point (``tfgpu-predict``)."""
    define_flags()
    run_app(main, prog=PROG)


if __name__ == "__main__":
    run()
