"""Every command-line flag of ``python -m tfgpu.main``: one absl flag per Config setting, with
the setting's own default and help (``config.SETTINGS``).

Only ``main.py`` reads the parsed values (``config_from_flags``); the library takes a Config.
"""

from absl import flags

from tfgpu.config import SETTINGS, Config, config_from


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
        define(s.flag, s.default, s.help, flag_values=flag_values)


def config_from_flags(flag_values=flags.FLAGS, defaults: dict | None = None) -> Config:
    """A Config from parsed flags; ``defaults`` (by flag name) replace the values of flags
    not given on the command line."""
    values = {}
    for name in SETTINGS:
        flag = flag_values[name]
        use_default = defaults and name in defaults and not flag.present
        values[name] = defaults[name] if use_default else flag.value
    return config_from(**values)
