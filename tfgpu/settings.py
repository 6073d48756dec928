"""How a setting is declared (``setting``) and found again by its flag name (``Setting``).

``config.py`` declares every setting with these; ``flags.py`` turns each into an absl flag.
"""

import dataclasses
from dataclasses import dataclass, field


def setting(default, help: str, *, choices=(), flag: str = ""):  # noqa: A002 - absl's word
    """A Config field: its default, its ``--help`` text, the values it may take (checked once,
    by ``validate``) and its flag name when that is not the field's name."""
    meta = {"help": help, "choices": tuple(choices), "flag": flag}
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
            out[flag] = Setting(
                flag, section, f.name, f.default, f.metadata["help"], f.metadata["choices"]
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
