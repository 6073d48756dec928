"""A run's folder as the settings see it: its config.json read back (``stored_settings``), a
folder that is not a tfgpu run refused (``read_run``, by ``results.folder.check``), the
settings of a restart (``restart_values``): a run started again with ``--model_dir`` alone
resumes with its own settings; the flags given again may change only ``MAY_CHANGE`` (and
where the work runs); and the Config a use of a finished run reads (``run_config``,
``head_config``: for ``cli.head``, which opens the run for evaluate, predict, export,
average, the side-car and the report), so that a wrong ``--model_dir`` is one line at once.

Plain data in, plain data out: ``tfgpu.main`` passes the flags' values and the names of those
the user set (absl's ``present``); nothing here reads flags. No TensorFlow here.
"""

import math
import os

from tfgpu import models
from tfgpu.config import SETTINGS, Config, config_from, validate
from tfgpu.errors import ConfigError, UsageError
from tfgpu.files import read_json
from tfgpu.results import folder
from tfgpu.results.folder import CONFIG_FILE, WEIGHTS_FILE


# What a restart may change against the run's checkpoints: how long it trains, how often it
# logs, evaluates and saves, what it keeps and exports at the end, and where the input work
# runs. None of these changes what one update does. Besides these: every setting that may
# differ between the machines of one run (paths, threads: ``per_node``), and the spreading
# section (strategy, devices, timeouts), which each start takes from its own command line.
MAY_CHANGE = (
    "train_steps",
    "epochs",
    "steps_per_loop",
    "log_every_steps",
    "log_every_s",
    "eval_every_steps",
    "eval_every_epochs",
    "eval_batch_size",
    "eval_tta",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "average_checkpoints",
    "keep_best",
    "best_metric",
    "early_stop_patience",
    "sidecar_eval",
    "export",
    "export_best",
    "profile_steps",
    "profile_all_workers",
    "max_skipped_updates",
    "preprocess_on",
    "resize_on",
    "cache_eval",
)
# Settings whose "auto" is resolved for the machine once, at a run's start (``config.resolve``):
# given again as auto, they keep the run's choice, on any machine.
KEPT_WHEN_AUTO = ("dtype",)
LAUNCH_SECTION = "dist"  # never read back from config.json: each start says how it spreads

_LEGACY = {"dct_scaled_decode": {True: "on", False: "off"}}  # once a bool
_ONCE_INT = frozenset({"micro_batch_size"})  # a count, until it could be auto too
_INT_BOUND = 2**63


def stored_settings(values: dict, where: str) -> dict:
    """The settings of a config.json's object ``values`` ({flag name: value}), each of its
    setting's type (an int for an int, a finite number for a float, a string without NUL);
    keys that are no setting (``num_replicas``, a newer tfgpu's) are left out. A value of
    another type raises a ConfigError naming ``where`` (the file) and the key."""
    out = {}
    for key, value in values.items():
        s = SETTINGS.get(key)
        if s is None:
            continue
        value = _LEGACY.get(key, {}).get(value, value) if isinstance(value, bool) else value
        if key in _ONCE_INT and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not _fits(value, s.default):
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise ConfigError(f"{where}: {key}={shown} is not {_kind(s.default)}")
        out[key] = float(value) if isinstance(s.default, float) else value
    if "augment_policy" not in out:  # before the policies: RandAugment's old meanings
        out = {k: v for k, v in out.items() if not k.startswith("randaugment_")}
    return out


def _fits(value, default) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if isinstance(default, int):
        return isinstance(value, int) and abs(value) < _INT_BOUND
    if isinstance(default, float):
        if isinstance(value, int):
            return abs(value) < _INT_BOUND
        return isinstance(value, float) and math.isfinite(value)
    return isinstance(value, str) and "\0" not in value


def _kind(default) -> str:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    return "a finite number" if isinstance(default, float) else "a string"


def read_run(model_dir: str) -> dict | None:
    """The settings stored in ``model_dir``'s config.json (``stored_settings``); None when
    there is none: no such folder, an empty one, or one holding only tfgpu's own files. A
    folder that holds something else, a config.json that is not a tfgpu run's, or a
    ``model_dir`` that is not a folder raises a ConfigError in one line (``folder.check``):
    a run must never write into it."""
    values = folder.check(model_dir)
    if values is None:
        return None
    return stored_settings(values, os.path.join(os.path.expanduser(model_dir), CONFIG_FILE))


def has_checkpoint(model_dir: str) -> bool:
    """True when ``model_dir/checkpoints`` holds a checkpoint (its index file)."""
    folder = os.path.join(os.path.expanduser(model_dir), "checkpoints")
    try:
        return any(n.startswith("ckpt-") and n.endswith(".index") for n in os.listdir(folder))
    except OSError:
        return False


def restart_values(stored: dict, given: dict, present, resuming: bool, where: str = "") -> dict:
    """The settings ({flag name: value}) of a run started again in the folder ``where``, whose
    config.json holds ``stored`` (``stored_settings``). ``given``: every flag's value on this
    command line (its default when not set), ``present``: the names the user set.

    The run's own settings, but the spreading section and ``model_dir`` (this command's),
    settings the run predates (``given``), and the flags set (``present``; ``auto`` for one of
    ``KEPT_WHEN_AUTO`` keeps the run's choice). When ``resuming``
    (its checkpoints are read back), a set flag outside ``MAY_CHANGE`` and the per-node
    settings that differs from the stored value raises a ConfigError naming the flag and
    both values."""
    values = {}
    for name, s in SETTINGS.items():
        if s.section == LAUNCH_SECTION or name == "model_dir" or name not in stored:
            values[name] = given[name]
        elif name in KEPT_WHEN_AUTO and given[name] == "auto":
            values[name] = stored[name]  # the run's own choice, made where it started
        elif name in present:
            value = models.own.absolute(given[name]) if name == "model" else given[name]
            if resuming and not may_change(name) and not _same(value, stored[name]):
                raise ConfigError(contradiction(name, given[name], stored[name], where))
            values[name] = value
        else:
            values[name] = stored[name]
    return values


def may_change(name: str) -> bool:
    """True when a restart may set ``name`` to another value than its run's (``MAY_CHANGE``,
    per-node settings, the spreading section)."""
    s = SETTINGS[name]
    return name in MAY_CHANGE or s.per_node or s.section == LAUNCH_SECTION


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return not isinstance(a, bool) and not isinstance(b, bool) and float(a) == float(b)
    return a == b


def contradiction(name: str, given, stored, where: str) -> str:
    """The one line of a flag that contradicts the run's checkpoints."""
    return (
        f"--{name}={_shown(given)} contradicts the run in {where or 'its --model_dir'}, whose "
        f"checkpoints were made with --{name}={_shown(stored)} (its config.json): leave the "
        "flag out to resume with the run's own settings, or start a new run in another "
        "--model_dir"
    )


def _shown(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if value != "" else '""'


# Training-only settings left out of a use's Config: evaluation is unweighted and reads each
# example once, and a run's --class_weights file need not exist where its model is used.
TRAINING_ONLY = ("class_weights", "balanced_sampling", "sampling_power")
# Paths of config.json that the run writes to: a run folder from elsewhere must not make
# evaluate or predict write there; only an override (the user naming it again) sets them.
WRITTEN_PATHS = ("eval_snapshot_dir",)


def run_config(model_dir: str, **overrides) -> Config:
    """The Config of the run in ``model_dir`` (its config.json, read back by
    ``stored_settings``), on one device, without its start weights (the checkpoint replaces
    them) and without the paths it writes to (``WRITTEN_PATHS``), with ``overrides`` (by flag
    name) that are set. Without ``model_dir``: the defaults and ``overrides``."""
    values = {}
    if model_dir:
        path = os.path.join(os.path.expanduser(model_dir), CONFIG_FILE)
        try:
            stored = read_json(path)
        except ValueError as err:
            raise UsageError(str(err)) from None
        if not stored:
            raise UsageError(f"--model_dir={model_dir} holds no config.json (not a tfgpu run)")
        values = stored_settings(stored, path)
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
