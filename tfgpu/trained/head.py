"""The head every use of a trained run shares: which run (its ``--model_dir``), which of its
checkpoints, and the run's own Config read back from its config.json, with what the command
overrides. Read without TensorFlow, so that a wrong ``--model_dir`` is one line at once;
``run.py`` opens the checkpoint it names.
"""

import os

from tfgpu.config import Config, config_from, rundir, validate
from tfgpu.errors import UsageError
from tfgpu.files import read_json

# Training-only settings left out: evaluation is unweighted and reads each example once, and
# a run's --class_weights file need not exist where its model is used.
TRAINING_ONLY = ("class_weights", "balanced_sampling", "sampling_power")
# Paths of config.json that the run writes to: a run folder from elsewhere must not make
# evaluate or predict write there; only an override (the user naming it again) sets them.
WRITTEN_PATHS = ("eval_snapshot_dir",)
WEIGHTS_FILE = ".weights.h5"  # Keras' weights-only files: final.weights.h5, tfgpu-average's


def run_config(model_dir: str, **overrides) -> Config:
    """The Config of the run in ``model_dir`` (its config.json, read back by
    ``rundir.stored_settings``), on one device, without its start weights (the checkpoint
    replaces them) and without the paths it writes to (``WRITTEN_PATHS``), with ``overrides``
    (by flag name) that are set. Without ``model_dir``: the defaults and ``overrides``."""
    values = {}
    if model_dir:
        path = os.path.join(os.path.expanduser(model_dir), "config.json")
        try:
            stored = read_json(path)
        except ValueError as err:
            raise UsageError(str(err)) from None
        if not stored:
            raise UsageError(f"--model_dir={model_dir} holds no config.json (not a tfgpu run)")
        values = rundir.stored_settings(stored, path)
        for name in TRAINING_ONLY + WRITTEN_PATHS:
            values.pop(name, None)
        values["model_dir"] = os.path.expanduser(model_dir)
    values.update(strategy="default", logical_cpu_devices=0, init_weights="")
    if overrides.get("data_dir"):  # another dataset of the same classes
        values.update(tfds_name="", synthetic_data=False)
    values.update({k: v for k, v in overrides.items() if v})
    return validate(config_from(**values))


def head_config(model_dir: str, which: str, **overrides) -> Config | None:
    """The run's Config with ``overrides`` for checkpoint ``which`` (what ``run_config``
    reads), or None without ``model_dir`` (a .keras file: its image size is read with the
    model). A ``.weights.h5`` file without its run is a UsageError."""
    if which.endswith(WEIGHTS_FILE) and not model_dir:
        raise UsageError(
            f"--checkpoint={which} needs --model_dir: the run whose model the weights are"
        )
    return run_config(model_dir, **overrides) if model_dir else None
