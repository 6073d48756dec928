"""Flags and recipes: every flagfile parses into a valid Config; the demo recipe file says
exactly what a run without --data_dir uses."""

import pathlib

import pytest
from absl import flags

from tfgpu import demo
from tfgpu.cli.flags import COMMAND_SETTINGS, command_settings, define_flags, given_flags
from tfgpu.config import SETTINGS, config_from, validate

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECIPES = sorted(ROOT.glob("flags/*.flags"))


def _recipe(path):
    """A recipe as a test case: one of a KerasHub model requires the [hub] extra to validate."""
    hub = "--model=hub:" in path.read_text(encoding="utf-8")
    return pytest.param(path, id=path.name, marks=[pytest.mark.requires("hub")] if hub else [])


def _parse(*argv):
    values = flags.FlagValues()
    define_flags(values)
    values(["tfgpu", *argv])
    return values


def _config(values, defaults=None):
    """The Config of parsed ``values``; ``defaults`` (by flag name) for the flags not given."""
    given, present = given_flags(values)
    defaults = {k: v for k, v in (defaults or {}).items() if k not in present}
    return config_from(**{**given, **defaults})


def test_demo_recipe_file_equals_the_built_in_demo_recipe():
    values = _parse(f"--flagfile={ROOT / 'flags/demo_digits.flags'}")
    config = _config(values)
    assert {k: SETTINGS[k].get(config) for k in demo.DEMO_RECIPE} == demo.DEMO_RECIPE


def test_demo_defaults_fill_only_the_flags_not_given():
    config = _config(_parse("--train_steps=7"), demo.DEMO_RECIPE)
    assert config.train.train_steps == 7 and config.model.name == "tiny_cnn"
    assert config.data.image_size == 16


@pytest.mark.parametrize("recipe", [_recipe(r) for r in RECIPES])
def test_every_recipe_parses_into_a_valid_config_and_says_how_to_run(recipe):
    config = validate(_config(_parse(f"--flagfile={recipe}")))
    header = recipe.read_text().split("\n--", 1)[0]
    assert "python -m tfgpu.main" in header or "horovodrun" in header, recipe.name
    assert config.model.name


def test_every_config_field_is_a_flag_with_help():
    values = flags.FlagValues()
    define_flags(values)
    assert all(values[name].help for name in values)


def test_the_flag_reference_is_current():
    from tfgpu.cli.flags import reference_markdown

    current = (ROOT / "docs" / "flags.md").read_text(encoding="utf-8")
    assert current == reference_markdown(), "docs/flags.md is stale: python tools/flag_reference.py"
    for name in SETTINGS:
        assert f"| `--{name}` |" in current


def test_helpfull_groups_the_flags_by_section_and_help_names_the_key_ones():
    from tfgpu.cli.flags import KEY_FLAGS, SECTION_TITLES

    values = flags.FlagValues()
    define_flags(values)
    groups = {m: {f.name for f in fs} for m, fs in values.flags_by_module_dict().items()}
    expected = {f"tfgpu: {title}" for title in SECTION_TITLES.values()}
    assert expected <= set(groups)
    assert "strategy" in groups["tfgpu: spreading training"]
    assert set(KEY_FLAGS) <= set(SETTINGS)


@pytest.mark.parametrize("command", sorted(COMMAND_SETTINGS))
def test_every_command_has_its_flags_from_its_settings_in_a_group_and_the_reference(command):
    """A command's flags are its settings' fields, with their defaults and help, under the
    command's name in --helpfull and in docs/flags.md; parsed, they give its settings back."""
    values = flags.FlagValues()
    define_flags(values, command)
    defaults = COMMAND_SETTINGS[command]()
    names = {m: {f.name for f in fs} for m, fs in values.flags_by_module_dict().items()}
    assert set(names) == {command}
    for name in names[command]:
        assert values[name].help and values[name].default == getattr(defaults, name)
    values(["prog"])
    assert command_settings(command, values) == (defaults, frozenset())
    current = (ROOT / "docs" / "flags.md").read_text(encoding="utf-8")
    section = current.split(f"\n## `{command}`\n", 1)[1].split("\n## ", 1)[0]
    assert {f"| `--{name}` |" for name in names[command]} <= set(
        line[: line.index("|", 2) + 1] for line in section.splitlines() if line.startswith("| `")
    )
