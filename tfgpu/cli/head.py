"""What the commands that open a trained run share (evaluate, predict, export, average, the
side-car evaluator, the report): their head, which run, which of its checkpoints and which
data (``settings.RunHead``), checked before TensorFlow starts (``start``): a wrong
--model_dir is one line at once; then the run opened for its use (``open_run``): its
config.json read back here, its sections handed to ``inference.opened``, which reads no
config.json itself.
"""

from tfgpu.cli import quiet
from tfgpu.cli.settings import RunHead
from tfgpu.config.rundir import head_config, run_config


def start(head: RunHead) -> None:
    """Reads the run's config.json as ``open_run`` will (``rundir.head_config``: one line for
    a wrong --model_dir or checkpoint file), then starts TensorFlow without its notices."""
    head_config(head.model_dir, head.checkpoint, data_dir=head.data_dir)
    quiet.import_tensorflow()


def open_run(
    model_dir: str, which: str = "", *, newest=False, optimizer=False, with_data=True, **overrides
):
    """The run in ``model_dir`` (its config.json, with ``overrides`` by flag name) at
    checkpoint ``which`` (latest, best, a path, a .weights.h5 file or an exported .keras
    file, which needs no ``model_dir``: the defaults at its image side; "": its network
    built, no checkpoint read) as its uses take it: an ``inference.opened.Opened``.
    ``newest``: ``which`` is the newest checkpoint of a run still training (followed if it
    is replaced as it is read); ``optimizer``: the run's optimizer also when it kept no
    average; ``with_data``: False for a .keras file alone. Call it once TensorFlow has
    started (``start``)."""
    from tfgpu.inference import opened  # noqa: PLC0415 (TensorFlow: after its quiet start)

    config = head_config(model_dir, which, **overrides)
    path = opened.checkpoint_path(model_dir, which) if which else ""
    if config is None:  # a .keras file without its run
        config = run_config("", image_size=opened.image_size_of(path), **overrides)
    return opened.open_run(
        path,
        config.model,
        config.data,
        config.train,
        config.optim,
        config.dist,
        any_size=config.curriculum.progressive_stages > 1,
        model_dir=config.model_dir,
        newest_in=model_dir if newest else "",
        optimizer=optimizer,
        with_data=with_data,
    )
