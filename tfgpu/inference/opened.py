"""A trained run opened for use: the one head of evaluate, predict, export, the side-car
evaluator and the report.

The run's own Config (``config.rundir.run_config``: its ``config.json``), its data spec, a
backend on one device, and its network at one checkpoint (``checkpoint.network.load``: the
newest, the best of ``best/best.json``, a path, a ``.weights.h5`` file of the run or an
exported ``.keras`` file). Nothing here preprocesses: the uses read images with the
evaluation's own functions (``data.pipeline``).
"""

import os
from dataclasses import dataclass

from tfgpu.checkpoint import network as networks
from tfgpu.checkpoint.network import Network
from tfgpu.config import Config
from tfgpu.config.rundir import head_config, run_config
from tfgpu.data import spec as data_spec
from tfgpu.distribute import backends
from tfgpu.errors import DataError


def config_and_checkpoint(model_dir: str, which: str, **overrides) -> tuple:
    """(the run's Config with ``overrides``, the checkpoint ``which`` names). Without
    ``model_dir`` (a .keras file), the defaults with the file's image size."""
    config = head_config(model_dir, which, **overrides)
    path = networks.checkpoint_path(model_dir, which)
    if config is None:
        config = run_config("", image_size=networks.image_size_of(path), **overrides)
    return config, path


@dataclass
class Opened:
    """A trained model as its run evaluates it: the run's settings, where it runs, its data
    and its network."""

    config: Config
    backend: object
    spec: object  # data.spec.DataSpec of the run (or of --data_dir)
    network: Network
    eval_global_batch: int

    @property
    def model(self):
        return self.network.model

    @property
    def optimizer(self):
        """Its EMA weights are what evaluation uses; None without them."""
        return self.network.optimizer

    @property
    def step(self) -> int | None:
        return self.network.step

    @property
    def checkpoint(self) -> str:
        return self.network.checkpoint


def open_run(config: Config, path: str = "", newest_in: str = "", optimizer=False) -> Opened:
    """The run of ``config`` at checkpoint (or .keras, .weights.h5 file) ``path``, for
    ``config``'s data, on one device (``network.load``: ``newest_in`` and ``optimizer``).
    Without ``path``: its network (with its optimizer) built, no checkpoint read yet
    (``network.restore`` reads one)."""
    backend = backends.setup(config.dist)
    spec = data_spec.load_spec(config.data)
    if path:
        network = networks.load(config, path, spec, newest_in, optimizer, scope=backend.scope)
    else:
        with backend.scope():
            network = networks.build(config, spec.num_classes, spec.num_train, optimizer=True)
    batch = config.train.eval_batch_size or config.train.global_batch_size
    return Opened(config, backend, spec, network, batch)


def class_names(spec) -> list[str]:
    """The class names of ``spec`` (its dataset_info.json, else "0", "1", ...) as text, for
    the commands to check before any image is read: a name that is a number stands as its
    digits; anything else (null, a list, true) is a DataError naming the file and the entry."""
    names = []
    for i, name in enumerate(data_spec.class_names(spec)):
        if isinstance(name, (int, float)) and not isinstance(name, bool):
            name = str(name)
        if not isinstance(name, str):
            shown = repr(name)[:40]
            where = os.path.join(spec.data_dir, "dataset_info.json")
            raise DataError(f"{where}: class_names[{i}]={shown} is not a name (a string)")
        names.append(name)
    return names
