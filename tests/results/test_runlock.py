"""One run per --model_dir: a second run started into a directory another run trains in stops
in one line naming the holder, on every one of its workers, and writes nothing there."""

import fcntl
import os
import re
import subprocess
import sys

import pytest
from conftest import TINY_RUN, as_train_command, cli_flags

from tfgpu.config import config_from, validate
from tfgpu.results import runlock


def _hold(model_dir) -> object:
    """The lock taken as another run would (its own open file)."""
    os.makedirs(model_dir, exist_ok=True)
    f = open(os.path.join(model_dir, runlock.LOCK_FILE), "a+", encoding="utf-8")  # noqa: SIM115
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    f.write("host node7, pid 4242, since 2026-12-02T10:00:00\n")
    f.flush()
    return f


@pytest.mark.fast
def test_a_held_model_dir_is_named_with_its_holder(tmp_path):
    other = _hold(tmp_path)
    error = runlock.claim(str(tmp_path))
    assert "in use by another run (host node7, pid 4242" in error and "\n" not in error
    other.close()  # that run ended (or was killed): the kernel dropped its lock
    assert runlock.claim(str(tmp_path)) == ""
    assert runlock.claim(str(tmp_path)) == ""  # this process again: a resumed run in-process
    with open(tmp_path / runlock.LOCK_FILE, encoding="utf-8") as f:
        assert f"pid {os.getpid()}" in f.read()
    runlock.release(str(tmp_path))
    with runlock.held(str(tmp_path), take=True) as in_use:
        assert in_use == ""
    _hold(tmp_path).close()  # released after the block


def test_a_second_run_into_a_model_dir_in_use_stops_in_one_line(small_dataset, tmp_path, capsys):
    """One default run, in this process (its lock file opened anew, as another process's
    would be: flock refuses it): the command's one line and code 2, nothing written. Every
    worker of a multi-worker run, each its own process: the test below."""
    holder = _hold(tmp_path)
    config = validate(
        config_from(strategy="default", data_dir=small_dataset, model_dir=str(tmp_path), **TINY_RUN)
    )
    code = as_train_command(config)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("tfgpu: error: ") and "in use by another run" in lines[0]
    assert "host node7, pid 4242" in lines[0]
    assert os.listdir(tmp_path) == [runlock.LOCK_FILE], "the second run wrote into the dir"
    holder.close()


def test_a_second_run_into_a_model_dir_in_use_stops_on_every_worker(small_dataset, tmp_path):
    """Two workers (tfgpu.launch, multi_worker_mirrored): each stops with its own line."""
    workers = 2
    holder = _hold(tmp_path)
    flags = cli_flags(TINY_RUN, data_dir=small_dataset, model_dir=tmp_path)
    cmd = [sys.executable, "-m", "tfgpu.launch", f"--num_workers={workers}", "--"]
    cmd += ["--strategy=multi_worker_mirrored", *flags]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    text = out.stdout + out.stderr
    # Each worker's own error line (tfgpu.launch prefixes them with "[worker i] ").
    own = re.compile(r"\[worker \d\] tfgpu: error: .*in use by another run")
    lines = [line for line in text.splitlines() if own.match(line)]
    assert out.returncode == 2 and len(lines) == workers, text[-3000:]
    assert "host node7, pid 4242" in lines[0]
    assert os.listdir(tmp_path) == [runlock.LOCK_FILE], "the second run wrote into the dir"
    holder.close()
