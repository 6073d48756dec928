"""The code stays formatted and lint-clean (ruff, configured in pyproject.toml)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PATHS = ["tfgpu", "tests", "bench", "tools"]


def _ruff(*args):
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *PATHS], cwd=ROOT, capture_output=True, text=True
    )


def test_ruff_check_passes():
    out = _ruff("check")
    assert out.returncode == 0, out.stdout[-4000:]


def test_ruff_format_is_applied():
    out = _ruff("format", "--check")
    assert out.returncode == 0, out.stdout[-4000:]
