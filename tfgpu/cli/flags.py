"""Every command-line flag of ``python -m tfgpu.main``: one absl flag per Config setting, with
the setting's own default and help (``config.SETTINGS``), grouped by section in ``--helpfull``;
``reference_markdown`` is the flag reference ``docs/flags.md`` (``tools/flag_reference.py``
writes it, a test keeps it current).

Only ``main.py`` reads the parsed values (``config_from_flags``); the library takes a Config.
"""

from absl import flags

from tfgpu.config import SETTINGS, Config, config_from

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


def define_flags(flag_values=flags.FLAGS) -> None:
    """Defines one absl flag per setting in ``flag_values`` (idempotent). Choices are checked
    by ``config.validate``, which names them in one line."""
    for s in SETTINGS.values():
        if s.flag in flag_values:
            continue
        if isinstance(s.default, bool):
            define = flags.DEFINE_bool
        elif isinstance(s.default, int):
            define = flags.DEFINE_integer
        elif isinstance(s.default, float):
            define = flags.DEFINE_float
        else:
            define = flags.DEFINE_string
        group = f"tfgpu: {SECTION_TITLES[s.section]}"  # --helpfull lists flags by it
        define(s.flag, s.default, s.help, flag_values=flag_values, module_name=group)


def config_from_flags(flag_values=flags.FLAGS, defaults: dict | None = None) -> Config:
    """A Config from parsed flags; ``defaults`` (by flag name) replace the values of flags
    not given on the command line."""
    given, present = given_flags(flag_values)
    values = {
        name: defaults[name] if defaults and name in defaults and name not in present else value
        for name, value in given.items()
    }
    return config_from(**values)


def given_flags(flag_values=flags.FLAGS) -> tuple[dict, frozenset]:
    """({flag name: value} of every setting's flag, the names of those set on the command
    line or in a flagfile): what the config layer takes as plain data."""
    given = {name: flag_values[name].value for name in SETTINGS}
    return given, frozenset(name for name in SETTINGS if flag_values[name].present)


def reference_markdown() -> str:
    """The flag reference (docs/flags.md) as Markdown: one table per section, each flag with
    its default, its choices and its help, in declaration order."""
    lines = [
        "# Flags of `python -m tfgpu.main`",
        "",
        "Generated from the settings table (`tfgpu/config/`) by",
        "`python tools/flag_reference.py`; `tests/test_flags.py` fails when it is stale. Every",
        "flag can also be set in a `--flagfile` (the recipes in `flags/`). `--help` prints the",
        "most used ones, `--helpfull` all of them by section.",
    ]
    for section, title in SECTION_TITLES.items():
        lines += ["", f"## {title[0].upper()}{title[1:]}", "", "| flag | default | meaning |"]
        lines.append("|---|---|---|")
        for s in SETTINGS.values():
            if s.section == section:
                lines.append(f"| `--{s.flag}` | {_default(s.default)} | {_cell(s.help)} |")
    return "\n".join(lines) + "\n"


def _default(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"`{value}`" if value != "" else '`""`'


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell (pipes escaped)."""
    return text.replace("|", "\\|")
