"""Every command lives in tfgpu/cli/: the console scripts point there, the documented module
paths (``python -m tfgpu.main`` ...) are thin aliases of it, and ``--help`` exits 0."""

import ast
import configparser
import importlib
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The module paths the docs, the README and the tests give -> the command they run.
ALIASES = {
    "tfgpu.main": "tfgpu.cli.train",
    "tfgpu.launch": "tfgpu.cli.launch",
    "tfgpu.ray": "tfgpu.cli.ray",
    "tfgpu.evaluate": "tfgpu.cli.evaluate",
    "tfgpu.predict": "tfgpu.cli.predict",
    "tfgpu.export.__main__": "tfgpu.cli.export",
    "tfgpu.average": "tfgpu.cli.average",
}
# The same below cli/: run as __main__ (runpy), so that their packages import nothing from above.
RUN_ALIASES = {
    "tfgpu.distribute.hvdrun": "tfgpu.cli.horovodrun",
    "tfgpu.data.service_server": "tfgpu.cli.data_service",
    "tfgpu.report.__main__": "tfgpu.cli.report",
}


def _console_scripts() -> dict:
    """{script: "module:function"} of setup.cfg."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    lines = setup["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict(tuple(part.strip() for part in line.split("=")) for line in lines)


@pytest.mark.fast
@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_each_documented_module_path_is_a_thin_alias_of_its_command(alias):
    """It runs the command's own ``run`` and holds nothing else: one import, one call."""
    module = importlib.import_module(alias)
    assert module.run is importlib.import_module(ALIASES[alias]).run
    tree = ast.parse(pathlib.Path(module.__file__).read_text(encoding="utf-8"))
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [(n.module, [a.name for a in n.names]) for n in imports] == [(ALIASES[alias], ["run"])]
    assert len(tree.body) == 3  # docstring, import, `if __name__ == "__main__": run()`


@pytest.mark.fast
@pytest.mark.parametrize("alias", sorted(RUN_ALIASES))
def test_an_alias_below_cli_runs_its_command_as_main_and_imports_nothing_of_tfgpu(alias):
    """One ``runpy.run_module`` of the command under ``__main__``, and no tfgpu import."""
    path = pathlib.Path(importlib.util.find_spec(alias).origin)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [a.name for n in imports for a in n.names] == ["runpy"]
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert [ast.literal_eval(c.args[0]) for c in calls] == [RUN_ALIASES[alias]]
    assert all(
        k.value.value == "__main__" for c in calls for k in c.keywords if k.arg == "run_name"
    )


@pytest.mark.fast
def test_every_console_script_runs_a_command_in_cli():
    scripts = _console_scripts()
    for name in (
        "tfgpu-train",
        "tfgpu-to-tfrecord",
        "tfgpu-launch",
        "tfgpu-ray",
        "tfgpu-horovodrun",
        "tfgpu-data-service",
        "tfgpu-evaluate",
        "tfgpu-predict",
        "tfgpu-export",
        "tfgpu-average",
        "tfgpu-report",
    ):
        module, function = scripts[name].split(":")
        assert module.startswith("tfgpu.cli."), f"{name} = {scripts[name]}"
        assert callable(getattr(importlib.import_module(module), function))


# Each command's --help, as a user types it (a fresh interpreter each: none imports
# TensorFlow for it, so this stays quick). tfgpu-horovodrun is horovodrun's own help.
HELP = [
    ["-m", "tfgpu.main", "--help"],
    ["-m", "tfgpu.main", "--helpfull"],
    ["-m", "tfgpu.launch", "--help"],
    ["-m", "tfgpu.ray", "--help"],
    ["-m", "tfgpu.data.service_server", "--help"],
    ["-m", "tfgpu.distribute.hvdrun", "--help"],
    ["-m", "tfgpu.evaluate", "--help"],
    ["-m", "tfgpu.predict", "--help"],
    ["-m", "tfgpu.export", "--help"],
    ["-m", "tfgpu.average", "--help"],
    ["-m", "tfgpu.report", "--help"],
    [str(ROOT / "tools" / "to_tfrecord.py"), "--help"],
]


@pytest.mark.parametrize("argv", HELP, ids=[" ".join(a[-2:]) for a in HELP])
def test_help_exits_0_and_shows_the_commands_flags(argv):
    out = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    shown = out.stdout + out.stderr
    if argv[1] == "tfgpu.distribute.hvdrun":  # horovodrun's own help (or how to install it)
        assert "NUM_PROC" in shown, shown[-2000:]
        return
    # The command's own flags are listed (absl lists those of the program as started: a
    # python -m alias or a console script listed none), each with its help.
    listed = set(re.findall(r"^ +--(?:\[no\])?(\w+): ", shown, re.M))
    assert len(listed) >= 3, shown[-2000:]
    if argv[1] == "tfgpu.main":
        assert {"data_dir", "model_dir", "global_batch_size", "strategy"} <= listed, listed
