"""A run's folder as tfgpu writes it: the names it puts there (``RUN_ENTRIES``), and the check
that a --model_dir is new, empty or a tfgpu run's (``check``), which the trainer makes before
it writes anything there and the commands before they read a run. No TensorFlow here.
"""

import os

from tfgpu.errors import ConfigError
from tfgpu.files import read_json

CONFIG_FILE = "config.json"
WEIGHTS_FILE = ".weights.h5"  # Keras' weights-only files: final.weights.h5, tfgpu-average's

# What tfgpu itself puts into a --model_dir (``results.writer``, ``results.tracking``,
# ``runlock``, ``checkpoint.best``, ``inference.sidecar``, tfgpu-ray), plus its temporary
# names: a folder holding anything else and no config.json is not a tfgpu run.
RUN_ENTRIES = frozenset(
    {
        CONFIG_FILE,
        ".tfgpu.lock",
        ".tfgpu-sidecar.lock",
        "checkpoints",
        "tensorboard",
        "metrics.jsonl",
        "summary.csv",
        "summary.json",
        "micro_batch.json",
        "sidecar.json",
        "mlflow.json",
        "data.json",  # data/identity.py
        "final.weights.h5",
        "averaged.weights.h5",  # tfgpu-average's default output
        "export",
        "best",
        "ray",
    }
)


def check(model_dir: str) -> dict | None:
    """The object stored in ``model_dir``'s config.json ({flag name: value}, as written);
    None when there is none: no such folder, an empty one, or one holding only tfgpu's own
    files. A folder that holds something else, a config.json that is not a tfgpu run's, or a
    ``model_dir`` that is not a folder raises a ConfigError in one line: a run must never
    write into it."""
    path = os.path.expanduser(model_dir)
    if "://" in path or not os.path.lexists(path):
        return None  # a URI (tfgpu-ray's storage): not looked into here
    if not os.path.isdir(path):
        raise ConfigError(f"--model_dir={model_dir} is not a folder")
    try:
        values = read_json(os.path.join(path, CONFIG_FILE))
    except ValueError as err:
        raise ConfigError(f"--model_dir={model_dir}: {err}") from None
    if not values:
        foreign = sorted(e for e in _entries(path) if not _ours(e))
        if foreign:
            raise ConfigError(
                f"--model_dir={model_dir} holds files that are not a tfgpu run's (e.g. "
                f"{foreign[0]!r}) and no config.json: choose an empty or new folder"
            )
        return None
    if not {"model", "global_batch_size"} <= set(values):
        raise ConfigError(
            f"--model_dir={model_dir}: its config.json is not a tfgpu run's (no model and "
            "global_batch_size): choose an empty or new folder"
        )
    return values


def _entries(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError as err:
        raise ConfigError(f"--model_dir={path} cannot be listed: {err.strerror}") from None


def _ours(name: str) -> bool:
    return name in RUN_ENTRIES or name.startswith(".write-test-") or name.endswith(".tmp")
