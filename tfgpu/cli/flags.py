"""Every command-line flag of every tfgpu command, made from settings: for ``tfgpu-train``
(``python -m tfgpu.main``) one absl flag per Config setting (``config.SETTINGS``), grouped by
section in ``--helpfull``; for each other command one per field of its settings
(``COMMAND_SETTINGS``), grouped under the command's name. Each flag has its setting's default
and help. ``reference_markdown`` is the flag reference ``docs/flags.md``
(``tools/flag_reference.py`` writes it, a test keeps it current).

Only the commands read the parsed values (``given_flags``, ``command_settings``); the library
takes a Config or plain arguments.
"""

import dataclasses
import types

from absl import flags

from tfgpu.cli.settings import (
    AverageSettings,
    ConvertSettings,
    DataServiceSettings,
    EvaluateSettings,
    ExportSettings,
    LaunchSettings,
    PredictSettings,
    RaySettings,
    ReportSettings,
    SidecarSettings,
)
from tfgpu.config import SETTINGS
from tfgpu.settings import collect

TRAIN = "tfgpu-train"  # the trainer: its settings are config.SETTINGS
# Every other command with flags of its own -> its settings (a frozen dataclass of setting()
# fields); add a command's here and its flags, its --helpfull group and its section of
# docs/flags.md follow.
COMMAND_SETTINGS = {
    "tfgpu-launch": LaunchSettings,
    "tfgpu-ray": RaySettings,
    "tfgpu-to-tfrecord": ConvertSettings,
    "tfgpu-data-service": DataServiceSettings,
    "tfgpu-evaluate": EvaluateSettings,
    "tfgpu-predict": PredictSettings,
    "tfgpu-export": ExportSettings,
    "tfgpu-average": AverageSettings,
    "tfgpu-report": ReportSettings,
}

# The trainer's flags that only its TF_CONFIG evaluator task reads (cli/sidecar.py).
SIDECAR_ABOUT = (
    "`tfgpu-train` started as a TF_CONFIG `evaluator` task runs the side-car evaluator, as "
    "`tfgpu-evaluate --watch` does (docs/evaluator.md), following the run by these flags."
)

# Section (None: the run's own settings) -> its title in --helpfull and docs/flags.md.
SECTION_TITLES = {
    None: "the run",
    "data": "data and input pipeline",
    "model": "model and precision",
    "optim": "optimizer, loss and schedule",
    "train": "length, evaluation, checkpoints and logging",
    "dist": "spreading training",
    "curriculum": "repeated augmentation, progressive resizing",
}
# What `--help` shows: the flags most runs set (the rest: --helpfull, docs/flags.md).
KEY_FLAGS = (
    "strategy",
    "model",
    "data_dir",
    "model_dir",
    "global_batch_size",
    "grad_accum_steps",
    "train_steps",
    "epochs",
    "learning_rate",
    "optimizer",
    "dtype",
    "deterministic",
)


def define_flags(flag_values=flags.FLAGS, command: str = TRAIN) -> None:
    """Defines one absl flag per setting of ``command`` (the trainer's: one per Config setting)
    in ``flag_values`` (idempotent), each in its --helpfull group. The trainer's choices are
    checked by ``config.validate``, which names them in one line; the other commands check
    their own."""
    if command == TRAIN:
        for s in SETTINGS.values():
            group = f"tfgpu: {SECTION_TITLES[s.section]}"  # --helpfull lists flags by it
            _define(s, type(s.default), group, flag_values)
        return
    define_settings(COMMAND_SETTINGS[command], command, flag_values)


def define_settings(settings_class, group: str, flag_values=flags.FLAGS) -> None:
    """Defines one absl flag per field of ``settings_class`` (a frozen dataclass of setting()
    fields) in ``flag_values`` (idempotent), in --helpfull's ``group``."""
    kinds = _field_types(settings_class)
    for s in collect(settings_class, {}).values():
        _define(s, kinds[s.field], group, flag_values)


def _define(s, kind: type, group: str, flag_values) -> None:
    """The absl flag of setting ``s`` (a ``kind`` value) in ``flag_values``, in ``group``."""
    if s.flag in flag_values:
        return
    if kind is bool:
        define = flags.DEFINE_bool
    elif kind is int:
        define = flags.DEFINE_integer
    elif kind is float:
        define = flags.DEFINE_float
    else:
        define = flags.DEFINE_string
    define(s.flag, s.default, s.help, flag_values=flag_values, module_name=group)


def _field_types(cls) -> dict:
    """{field name: its type} of settings class ``cls``; ``int | None`` is int."""
    out = {}
    for f in dataclasses.fields(cls):
        kind = f.type
        if isinstance(kind, types.UnionType):
            kind = next(k for k in kind.__args__ if k is not type(None))
        out[f.name] = kind
    return out


def settings_of(command: str) -> dict:
    """{flag name: Setting} of ``command`` (one of COMMAND_SETTINGS)."""
    return collect(COMMAND_SETTINGS[command], {})


def command_settings(command: str, flag_values=flags.FLAGS):
    """(``command``'s settings instance from parsed ``flag_values``, the names of the flags set
    on the command line or in a flagfile)."""
    found = settings_of(command)
    values = {s.field: flag_values[s.flag].value for s in found.values()}
    present = frozenset(name for name in found if flag_values[name].present)
    return COMMAND_SETTINGS[command](**values), present


def given_flags(flag_values=flags.FLAGS) -> tuple[dict, frozenset]:
    """({flag name: value} of every setting's flag, the names of those set on the command
    line or in a flagfile): what the config layer takes as plain data."""
    given = {name: flag_values[name].value for name in SETTINGS}
    return given, frozenset(name for name in SETTINGS if flag_values[name].present)


def reference_markdown() -> str:
    """The flag reference (docs/flags.md) as Markdown: the trainer's flags, one table per
    section, then one table per other command; each flag with its default and its help, in
    declaration order."""
    lines = [
        "# Flags of tfgpu's commands",
        "",
        "Generated from the settings (the trainer's: `tfgpu/config/`; the other commands':",
        "`tfgpu/cli/settings.py`) by `python tools/flag_reference.py`; `tests/cli/test_flags.py`",
        "fails when it is stale. Every flag can also be set in a `--flagfile` (the recipes in",
        "`flags/`). `--help` prints the most used ones, `--helpfull` all of them by section.",
        "",
        "The trainer, `tfgpu-train` (`python -m tfgpu.main`), first; the other commands'",
        "own flags follow it.",
    ]
    for section, title in SECTION_TITLES.items():
        rows = [s for s in SETTINGS.values() if s.section == section]
        lines += ["", f"## {title[0].upper()}{title[1:]}", "", *_table(rows, {})]
    lines += ["", "## The side-car evaluator (a TF_CONFIG evaluator task)", "", SIDECAR_ABOUT]
    lines += ["", *_table(list(collect(SidecarSettings, {}).values()), {})]
    for command, cls in COMMAND_SETTINGS.items():
        about = " ".join(cls.__doc__.split()).replace("``", "`")  # rST -> Markdown
        shown = getattr(cls, "DOC_DEFAULTS", {})
        rows = list(settings_of(command).values())
        lines += ["", f"## `{command}`", "", about, "", *_table(rows, shown)]
    return "\n".join(lines) + "\n"


def _table(rows, shown: dict) -> list:
    """The Markdown table of Settings ``rows``; ``shown``: {field: the default's words}."""
    lines = ["| flag | default | meaning |", "|---|---|---|"]
    for s in rows:
        default = shown.get(s.field) or _default(s.default)
        lines.append(f"| `--{s.flag}` | {default} | {_cell(s.help)} |")
    return lines


def _default(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"`{value}`" if value != "" else '`""`'


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell (pipes escaped)."""
    return text.replace("|", "\\|")
