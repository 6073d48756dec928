"""What the commands that open a trained run share (evaluate, predict, export, average): their
head, which run, which of its checkpoints and which data (``settings.RunHead``), checked before
TensorFlow starts (``start``): a wrong --model_dir is one line at once.
"""

from tfgpu.cli import quiet
from tfgpu.cli.settings import RunHead
from tfgpu.config.rundir import head_config


def start(head: RunHead) -> None:
    """Reads the run's config.json as the library will (``rundir.head_config``: one line for a
    wrong --model_dir or checkpoint file), then starts TensorFlow without its notices."""
    head_config(head.model_dir, head.checkpoint, data_dir=head.data_dir)
    quiet.import_tensorflow()
