"""The commands that open a trained run (tfgpu-evaluate, -predict, -export, -average) share one
head, and read their settings back from their flags (tests/cli/test_cli.py: their module paths,
console scripts and --help)."""

import dataclasses

import pytest
from absl import flags

from tfgpu.cli import export
from tfgpu.cli.flags import command_settings, define_flags
from tfgpu.cli.settings import (
    EvaluateSettings,
    ExportSettings,
    PredictSettings,
    RunHead,
    SidecarSettings,
)
from tfgpu.errors import UsageError

pytestmark = pytest.mark.fast


def test_the_commands_that_open_a_run_share_one_head():
    head = [f.name for f in dataclasses.fields(RunHead)]
    for settings in (EvaluateSettings, PredictSettings, ExportSettings):
        assert issubclass(settings, RunHead)
        assert [f.name for f in dataclasses.fields(settings)][: len(head)] == head


def test_evaluate_reads_its_head_and_the_side_cars_settings_back():
    values = flags.FlagValues()
    define_flags(values, "tfgpu-evaluate")
    values(["tfgpu-evaluate", "--model_dir=runs/a", "--checkpoint=best", "--watch_timeout_s=5"])
    s, present = command_settings("tfgpu-evaluate", values)
    assert (s.model_dir, s.checkpoint, s.split, s.watch) == ("runs/a", "best", "validation", False)
    assert s.watch_timeout_s == 5.0 and s.watch_interval_s == SidecarSettings().watch_interval_s
    assert present == {"model_dir", "checkpoint", "watch_timeout_s"}


def test_an_export_that_cannot_be_made_is_one_line_before_anything_is_loaded():
    with pytest.raises(UsageError, match="choose --format from saved_model, litert, onnx"):
        export.export.check_request("runs/a", export.export.ExportOptions(format="pdf"))
