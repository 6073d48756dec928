"""What the commands that open a trained run share (evaluate, predict, export, average): their
head, which run, which of its checkpoints and which data (``RunHead``), and its check before
TensorFlow starts (``start``): a wrong --model_dir is one line at once.
"""

from dataclasses import dataclass

from tfgpu.cli import quiet
from tfgpu.schema import setting
from tfgpu.trained.head import head_config


@dataclass(frozen=True)
class RunHead:
    """Which trained run, at which checkpoint, on which data."""

    model_dir: str = setting("", "A training run's --model_dir (its config.json names the data).")
    checkpoint: str = setting(
        "latest",
        "latest (newest in checkpoints/), best (best/best.json's first), a checkpoint path "
        "(.../ckpt-N), a .weights.h5 file of the run (final.weights.h5, tfgpu-average's) or "
        "an exported .keras file.",
    )
    data_dir: str = setting(
        "", "Another converted dataset with the same classes (default: the run's)."
    )


def start(head: RunHead) -> None:
    """Reads the run's config.json as the library will (``head.head_config``: one line for a
    wrong --model_dir or checkpoint file), then starts TensorFlow without its notices."""
    head_config(head.model_dir, head.checkpoint, data_dir=head.data_dir)
    quiet.import_tensorflow()
