"""A trained run opened for use: what evaluate, predict, export, the side-car evaluator and the
report take.

Its settings come from the command that read the run's config.json (``cli.head.open_run``:
the model's, the data's, the optimizer's and the train sections, handed here one by one);
here they become a backend on one device, the data spec, and the network at one checkpoint
(``checkpoint.network.load``: the newest, the best of ``best/best.json``, a path, a
``.weights.h5`` file of the run or an exported ``.keras`` file). Nothing here preprocesses:
the uses read images with the evaluation's own functions (``data.pipeline``).
"""

import os
from dataclasses import dataclass

from tfgpu.checkpoint import network as networks
from tfgpu.checkpoint.network import Network, checkpoint_path, image_size_of  # noqa: F401
from tfgpu.data import spec as data_spec
from tfgpu.distribute import backends
from tfgpu.errors import DataError
from tfgpu.optim import finetune


@dataclass
class Opened:
    """A trained model as its run evaluates it: where it runs, its data, its network, and
    the sections of the run's settings its uses read."""

    backend: object
    spec: object  # data.spec.DataSpec of the run (or of --data_dir); None: a .keras file alone
    network: Network
    model_settings: object  # models.config.ModelConfig: which network it is
    data: object  # data.config.DataConfig: how the run reads and preprocesses images
    train: object  # train.config.TrainConfig: its batches, evaluation and best-keeping
    model_dir: str = ""  # the run's ("": a .keras file without its run)

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

    @property
    def eval_global_batch(self) -> int:
        """The run's evaluation batch (--eval_batch_size, else its global batch)."""
        return self.train.eval_batch_size or self.train.global_batch_size


def open_run(
    path: str,
    m,
    data,
    train,
    optim,
    dist,
    *,
    any_size: bool = False,
    model_dir: str = "",
    newest_in: str = "",
    optimizer: bool = False,
    with_data: bool = True,
) -> Opened:
    """The run whose settings are ``m`` (its models.config.ModelConfig), ``data``, ``train``
    and ``optim`` (its other sections; ``any_size``: its progressive stages trained at
    smaller sides) at checkpoint (or .keras, .weights.h5 file) ``path``, for ``data``'s
    dataset, on one device of ``dist`` (``network.load``: ``newest_in`` and ``optimizer``).
    Without ``path``: its network (and optimizer) built, no checkpoint read yet
    (``network.restore`` reads one). ``with_data=False``: a .keras file alone, no dataset
    read (its classes by number)."""
    sections = dict(model_settings=m, data=data, train=train, model_dir=model_dir)
    if not with_data:
        network = networks.keras_file(path, None)
        return Opened(None, None, network, **sections)
    backend = backends.setup(dist)
    spec = data_spec.load_spec(data)
    recipe = (m, data, train, optim, any_size)
    if path:
        fresh = fresh_network(*recipe, spec, optimizer)
        network = networks.load(path, spec, fresh, newest_in, scope=backend.scope)
    else:
        with backend.scope():
            network = networks.with_optimizer_built(fresh_network(*recipe, spec, optimizer)(True))
    return Opened(backend, spec, network, **sections)


def fresh_network(m, data, train, optim, any_size: bool, spec, optimizer: bool):
    """``network.load``'s ``fresh(may)`` for a run of these sections (``open_run``'s) on
    ``spec``'s data: its network, with its optimizer when ``may`` and either ``optimizer`` or
    the run kept a weight average (--ema_decay)."""
    total = train.updates(spec.num_train)
    made = lambda model: finetune.run_optimizer(  # noqa: E731
        optim, m, model, train.global_batch_size, total
    )
    wanted = optimizer or bool(optim.ema_decay)
    return lambda may: networks.build(  # noqa: E731
        m, spec.num_classes, data.image_size, any_size, made if may and wanted else None
    )


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
