"""Every command works without the optional parts it does not need: its --help always, and a
use that needs a missing one stops with one line saying what to install (exit 2), never a
traceback. The missing part is hidden here (``None`` in sys.modules: its import fails, as in
a virtualenv that never had it); CI also runs the fast tier in such a virtualenv
(``make test-fast-bare``)."""

import importlib
import sys

import pytest

from tfgpu.errors import INSTALL_HOROVOD, ConfigError, UsageError, install_extra

pytestmark = pytest.mark.fast


@pytest.fixture
def without(monkeypatch):
    """``without(*names)``: those top-level packages cannot be imported from now on."""

    def hide(*names: str) -> None:
        for name in names:
            for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                monkeypatch.delitem(sys.modules, loaded)
            monkeypatch.setitem(sys.modules, name, None)

    return hide


def test_tfgpu_horovodrun_without_horovod_helps_and_says_what_to_install(without, capsys):
    without("horovod")
    horovodrun = importlib.reload(importlib.import_module("tfgpu.cli.horovodrun"))
    assert not horovodrun.horovod_installed()
    assert horovodrun.main(["tfgpu-horovodrun", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: tfgpu-horovodrun" in out and f"not installed here: {INSTALL_HOROVOD}" in out
    assert horovodrun.main(["tfgpu-horovodrun", "-np", "2", "python", "-m", "tfgpu.main"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "tfgpu-horovodrun: error: Horovod is not installed: `bash tools/install_horovod.sh` "
        "builds it for this TensorFlow\n"
    )


def test_tfgpu_ray_without_ray_says_what_to_install(without, capsys):
    from tfgpu.cli import ray

    without("ray")
    assert ray.main(["tfgpu-ray", "--help"]) == 0
    assert "--num_workers" in capsys.readouterr().out
    assert ray.main(["tfgpu-ray", "--num_workers=2", "--", "--train_steps=1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"tfgpu-ray: error: tfgpu-ray needs Ray Train: {install_extra('ray')}"]


def test_tfgpu_report_without_matplotlib_says_what_to_install(without):
    from tfgpu.cli import report

    without("matplotlib")
    with pytest.raises(UsageError, match=r"^tfgpu-report draws with matplotlib: pip install "):
        report.require_matplotlib()


def test_mlflow_tracking_without_mlflow_says_what_to_install(without):
    from tfgpu.results import tracking

    without("mlflow")
    with pytest.raises(ConfigError, match=r"^--mlflow_tracking_uri needs MLflow's client: pip"):
        tracking.check_client()


def test_an_export_format_without_its_runtime_says_what_to_install(without):
    from tfgpu.inference import export

    without("tf2onnx", "onnxruntime", "ai_edge_litert")
    assert export.missing_packages("saved_model") == ""
    assert export.missing_packages("onnx") == (
        f"--format=onnx needs tf2onnx and onnxruntime: {install_extra('export')}"
    )
    assert export.missing_packages("litert").startswith("--format=litert needs ai-edge-litert")
