"""A user who exports TF_CPP_MIN_LOG_LEVEL=3 to silence TensorFlow gets at least the silence
of the default start: none of the lines TensorFlow writes before its log is initialized (the
absl notice, cudart's and oneDNN's), in one process or in each multi_worker_mirrored worker.
Lower levels are honoured: 0 shows them all (the user asked for every log).

The multi_worker_mirrored workers' silence is checked on tests/e2e/test_mlflow.py's two workers
under tfgpu.launch (procs.assert_each_worker_quiet): a launch of its own here cost ~10 CPU-s
for no other claim."""

import os
import re
import subprocess
import sys

import pytest

from procs import TF_LINE

from tfgpu.cli import quiet

RUN = ["--synthetic_data", "--train_steps=1", "--model=tiny_cnn", "--image_size=16"]
RUN += ["--global_batch_size=4", "--num_classes=10", "--export=false"]


def _started(tmp_path, argv: list, level: str | None) -> str:
    """What a fresh ``python ARGV`` prints (stdout and stderr, as a terminal shows them) with
    TF_CPP_MIN_LOG_LEVEL=``level`` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    model_dir = tmp_path / f"run-{level}"
    out = subprocess.run(
        [sys.executable, *argv, f"--model_dir={model_dir}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:]
    return out.stdout


def _shape(text: str) -> list[str]:
    """The lines with their figures blanked: what two runs of one command share (the input
    wait, said only when the step waited long enough for it, left out: a loaded host's)."""
    shaped = [re.sub(r"\d[\d.,:e+-]*", "#", line) for line in text.splitlines() if line.strip()]
    return [re.sub(r"  input wait #%(?: \([^)]*\))?", "", line) for line in shaped]


def test_level_3_prints_what_the_default_start_prints_and_0_shows_tensorflows_lines(tmp_path):
    argv = ["-m", "tfgpu.main", *RUN, "--strategy=default"]
    default = _started(tmp_path, argv, None)
    assert not TF_LINE.findall(default), default[-3000:]
    # The first line a user reads is tfgpu's: no cudart_stub or cuInit complaint, no oneDNN
    # notice, no line naming TensorFlow's sources or tf.data's before it or after.
    lines = [line for line in default.splitlines() if line.strip()]
    assert lines[0].startswith("default: 1 replica(s), 1 updates of 4"), default[:2000]
    for noise in ("absl::InitializeLog", "cudart_stub", "cuInit", "oneDNN"):
        assert noise not in default
    assert not re.search(r"dataset\.cc|tensorflow/", default), default[-3000:]
    silent = _started(tmp_path, argv, "3")
    assert not TF_LINE.findall(silent), silent[-3000:]
    assert _shape(silent) == _shape(default)
    everything = _started(tmp_path, argv, "0")
    assert "WARNING: All log messages before absl::InitializeLog()" in everything
    assert _shape(everything)[-len(_shape(default)) :] == _shape(default)


@pytest.mark.fast
@pytest.mark.parametrize(
    "line, dropped_from",
    [
        ("WARNING: All log messages before absl::InitializeLog() is called are written", 1),
        ("I0000 00:00:1796571426.885994    8462 port.cc:153] oneDNN custom operations are on", 1),
        ("I0000 00:00:1796156518.651110   13822 cudart_stub.cc:31] Could not find cuda", 1),
        ("W0000 00:00:17.1 1 x.cc:1] a warning before absl's log started", 2),
        ("E0000 00:00:17.1 1 x.cc:1] an error before absl's log started", 3),
        ("tfgpu: error: x", 4),
        ("Traceback (most recent call last):", 4),
    ],
)
def test_each_level_drops_what_it_asks_to_hide(line, dropped_from):
    for level in range(4):
        assert quiet._is_noise(line, has_driver=True, level=level) == (level >= dropped_from)


@pytest.mark.fast
def test_the_level_is_read_as_tensorflow_reads_it(monkeypatch):
    for given, level in [(None, 1), ("3", 3), ("2", 2), ("0", 0), ("9", 3), ("x", 0)]:
        monkeypatch.setattr(quiet, "USER_LOG_LEVEL", given)
        assert quiet.log_level() == level
