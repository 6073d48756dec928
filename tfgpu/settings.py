"""How a setting is declared (``setting``) and found again by its flag name (``Setting``,
``collect``), and a config changed by settings (``replace_settings``): ``config/`` and each
package's section declare every flag with these; ``cli/flags.py`` turns each into an absl flag.

No TensorFlow here: ``config/`` imports this module before TensorFlow starts.
"""

import dataclasses
from dataclasses import dataclass, field

from tfgpu.errors import ConfigError


def positive(section, *names: str) -> None:
    """Raises a ConfigError for the first of ``names`` (fields of ``section``) not above 0."""
    for name in names:
        if getattr(section, name) <= 0:
            raise ConfigError(f"--{name}={getattr(section, name)} must be positive")


def setting(default, help: str, *, choices=(), flag: str = "", per_node: bool = False):  # noqa: A002
    """A Config field: its default, its ``--help`` text, the values it may take (checked once,
    by ``validate``), its flag name when that is not the field's name, and whether it may
    differ between the machines of one run (paths, thread counts: ``per_node``)."""
    meta = {"help": help, "choices": tuple(choices), "flag": flag, "per_node": per_node}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Setting:
    """Where one flag lives in Config: ``section`` (None: the run itself) and ``field``."""

    flag: str
    section: str | None
    field: str
    default: object
    help: str
    choices: tuple
    per_node: bool

    def get(self, config):
        owner = getattr(config, self.section) if self.section else config
        return getattr(owner, self.field)


def collect(config_class, sections: dict) -> dict:
    """{flag name: Setting} of ``config_class``'s own fields and of its ``sections``
    ({field name: section class})."""
    out = {}
    owners = [(None, config_class), *sections.items()]
    for section, cls in owners:
        for f in dataclasses.fields(cls):
            if "help" not in f.metadata:
                continue  # a section itself
            flag = f.metadata["flag"] or f.name
            meta = f.metadata
            out[flag] = Setting(
                flag, section, f.name, f.default, meta["help"], meta["choices"], meta["per_node"]
            )
    return out


def replace_settings(config, changes):
    """A copy of ``config`` with each (Setting, value) of ``changes`` applied."""
    by_section: dict = {}
    for s, value in changes:
        by_section.setdefault(s.section, {})[s.field] = value
    top = by_section.pop(None, {})
    for section, fields in by_section.items():
        top[section] = dataclasses.replace(getattr(config, section), **fields)
    return dataclasses.replace(config, **top)
