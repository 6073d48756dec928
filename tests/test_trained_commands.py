"""The commands of a trained run (tfgpu-evaluate, -predict, -export, -average): their console
scripts and documented module paths run ``tfgpu.cli``'s commands, their flags are declared as
settings, and ``--help`` exits 0 without TensorFlow."""

import configparser
import dataclasses
import importlib
import os
import subprocess
import sys

import pytest
from absl import flags

import tfgpu
from tfgpu.cli import average, evaluate, export, predict, sidecar
from tfgpu.cli.flags import settings_from
from tfgpu.cli.trained import RunHead

COMMANDS = {
    "tfgpu-evaluate": ("tfgpu.evaluate", evaluate),
    "tfgpu-predict": ("tfgpu.predict", predict),
    "tfgpu-export": ("tfgpu.export.__main__", export),
    "tfgpu-average": ("tfgpu.average", average),
}


@pytest.mark.fast
@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_console_script_and_module_path_run_the_cli_command(script):
    setup = configparser.ConfigParser()
    setup.read(os.path.join(os.path.dirname(os.path.dirname(tfgpu.__file__)), "setup.cfg"))
    scripts = dict(
        line.split(" = ")
        for line in setup["options.entry_points"]["console_scripts"].strip().splitlines()
    )
    alias, command = COMMANDS[script]
    assert scripts[script] == f"{command.__name__}:run"
    assert importlib.import_module(alias).run is command.run


@pytest.mark.fast
def test_the_commands_that_open_a_run_share_one_head():
    head = {f.name for f in dataclasses.fields(RunHead)}
    for settings in (evaluate.EvaluateSettings, predict.PredictSettings, export.ExportSettings):
        assert issubclass(settings, RunHead)
        assert head <= {f.name for f in dataclasses.fields(settings)}


@pytest.mark.fast
def test_a_commands_flags_are_its_settings():
    values = flags.FlagValues()
    evaluate.define_flags(values)
    values(["tfgpu-evaluate", "--model_dir=runs/a", "--checkpoint=best", "--watch_timeout_s=5"])
    s = settings_from(evaluate.EvaluateSettings, values)
    assert (s.model_dir, s.checkpoint, s.split, s.watch) == ("runs/a", "best", "validation", False)
    assert settings_from(sidecar.SidecarSettings, values).watch_timeout_s == 5.0
    values = flags.FlagValues()
    export.define_flags(values)
    with pytest.raises(flags.IllegalFlagValueError):  # a choice, checked by absl
        values(["tfgpu-export", "--format=pdf"])


@pytest.mark.parametrize(
    "module", ["tfgpu.evaluate", "tfgpu.predict", "tfgpu.export", "tfgpu.average"]
)
def test_help_exits_0_without_tensorflow(module):
    probe = (
        f"import runpy, sys\nsys.argv = ['{module}', '--help']\n"
        "try:\n"
        f"    runpy.run_module('{module}', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, 'tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "exit 0 False", (
        out.stdout[-2000:] + out.stderr[-2000:]
    )
