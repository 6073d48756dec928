"""Data that vanishes or changes under a run (issue 48): a shard deleted or made unreadable
while a run trains, and a dataset rewritten between a run and its resume. Each is one line
naming what is wrong; nothing trained before it is lost. (Labels that lie, and how a
dataset's changes are said: tests/data/test_lying_data.py.)"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import tensorflow as tf
from conftest import FAULTS_RUN, as_train_command, cli_flags, final_weights, make_image_arrays
from weights import assert_same_weights

from tfgpu import train
from tfgpu.config import config_from, validate
from tfgpu.convert import plan
from tfgpu.convert.manifest import items_from_arrays
from tfgpu.data import identity
from tfgpu.errors import DataError
from tfgpu.train.actions import Action

# conftest's FAULTS_RUN: 36 updates at 16x16 read from the shards all along; its uninterrupted
# run the session's (``faults_run``, shared with test_faults).
RUN = FAULTS_RUN


@pytest.fixture(scope="module")
def uninterrupted(faults_run):
    return final_weights(faults_run)


# Started without the capability that overrides file permissions: as root too, a shard
# made chmod 000 is unreadable to the run.
NO_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
NO_OVERRIDE += ["--inh-caps", "-dac_override,-dac_read_search"]


def _start(data_dir, model_dir):
    """A process of RUN on ``data_dir`` without the start-up probe of the input alone (up to
    100 batches through the policies; the probe is not what these runs are stopped for, and
    the in-process resume, which probes, still ends with the uninterrupted weights)."""
    values = dict(RUN, input_probe_s=0.0)
    flags = cli_flags(values, data_dir=data_dir, model_dir=model_dir, strategy="default")
    return subprocess.Popen(
        [*NO_OVERRIDE, sys.executable, "-m", "tfgpu.main", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


def _rows(model_dir) -> int:
    path = os.path.join(model_dir, "metrics.jsonl")
    return len(open(path).read().splitlines()) if os.path.exists(path) else 0


def _wait_for_rows(model_dir, rows: int, proc, timeout: float = 600) -> None:
    """Waits until ``model_dir``'s metrics.jsonl holds ``rows`` rows (2 steps each)."""
    deadline = time.time() + timeout
    while _rows(model_dir) < rows:
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no progress"
        time.sleep(0.05)


def _stopped_naming(proc, shard: str, why: str, model_dir) -> int:
    """Asserts the process ``proc`` stopped as ``_said_once`` says; returns its newest
    checkpoint's step."""
    _, err = proc.communicate(timeout=600)
    return _said_once(proc.returncode, err, shard, why, model_dir)


def _said_once(code: int, err: str, shard: str, why: str, model_dir) -> int:
    """Asserts a run ended with exit code ``code`` 2 and, in its stderr ``err``, one line
    naming ``shard`` and ``why``; returns the step of its newest checkpoint (kept)."""
    lines = [line for line in err.splitlines() if line.startswith("tfgpu: error:")]
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert f"{shard}: {why}" in lines[0] and "run the same command again" in lines[0], lines
    assert "Traceback" not in err
    kept = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
    return int(kept.rsplit("-", 1)[1])


class _MoveAway(Action):
    """Renames ``shard`` to ``shard.away`` at the resumed run's first loop boundary (4
    updates in, as the process was waited for two more rows): the next epoch opens it."""

    every = 4

    def __init__(self, shard: str):
        self.shard = shard

    def __call__(self, state) -> None:
        if os.path.exists(self.shard):
            os.rename(self.shard, self.shard + ".away")


@pytest.mark.timeout(1200)  # three runs of 36 updates: 191 s on 2 cores at load ~17, more at ~21
def test_a_shard_unreadable_or_deleted_mid_run_is_named_and_the_run_resumes_once_it_is_back(
    small_dataset, uninterrupted, tmp_path, capsys
):
    """A network file system going away: a shard made unreadable (chmod 000) while the run
    reads it, then, in the resumed run, deleted. Each stops the run in one line naming it,
    the checkpoints kept; with the shard back the run ends with the uninterrupted weights."""
    data, run = shutil.copytree(small_dataset, tmp_path / "data"), tmp_path / "run"
    shard = str(data / [n for n in sorted(os.listdir(data)) if n.startswith("train-")][-1])
    proc = _start(data, run)
    _wait_for_rows(run, 2, proc)
    os.chmod(shard, 0)  # the next epoch opens it again
    kept = _stopped_naming(proc, shard, "it cannot be read (Permission denied)", run)
    assert 4 <= kept < RUN["train_steps"]
    os.chmod(shard, 0o644)
    # The resumed run in this process, through the command's own ending: the exit code and
    # the line are the claim, not a second process (the permission needs the one above).
    capsys.readouterr()
    config = _config(data, run, train_steps=RUN["train_steps"], input_probe_s=0.0)
    code = as_train_command(config, actions=[_MoveAway(shard)])
    gone = "it is gone (No such file or directory)"
    kept = _said_once(code, capsys.readouterr().err, shard, gone, run)
    os.rename(shard + ".away", shard)
    # The resume to the end in this process: its claim is the weights, not the process.
    capsys.readouterr()
    summary = train.run(_config(data, run, train_steps=RUN["train_steps"]))
    assert summary["steps"] == RUN["train_steps"]
    out, err = capsys.readouterr()
    assert f"resumed from {run}/checkpoints/ckpt-{kept}" in out + err
    assert_same_weights(run, uninterrupted, atol=1e-6)


def _config(data_dir, model_dir, **overrides):
    values = {**RUN, "train_steps": 8, **overrides}
    return validate(
        config_from(data_dir=str(data_dir), model_dir=str(model_dir), strategy="default", **values)
    )


@pytest.mark.timeout(900)  # a refused start and a short run in-process, on 2 shared cores
def test_a_dataset_rewritten_between_a_run_and_its_resume_is_said_in_one_line(faults_run, tmp_path):
    """On a copy of the session's uninterrupted run (36 updates on the small dataset), its
    data re-converted from other images in another folder."""
    run = shutil.copytree(faults_run, tmp_path / "run")
    recorded = json.loads((run / identity.IDENTITY_FILE).read_text())
    assert recorded["train"]["examples"] == 96
    # Re-converted from other images: the same names, other records, other counts.
    data = tmp_path / "data"
    images, labels = make_image_arrays(100, seed=9)
    items = items_from_arrays(images, labels, prefix="other")
    plan.write_dataset(
        {"train": items[:80], "validation": items[80:]},
        class_names=["a", "b", "c", "d"],
        output_dir=str(data),
        source="tests",
        num_shards={"train": 4, "validation": 2},
    )
    config_before = (run / "config.json").read_bytes()
    resume = dict(train_steps=40, input_probe_s=0.0)  # the claim is the data, not its speed
    with pytest.raises(DataError) as caught:
        train.run(_config(data, run, **resume))
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"the data changed since the run in {run}")
    assert "the train split holds 80 examples, was 96" in line, line
    assert "another --model_dir" in line and f"move {run}/data.json away" in line, line
    assert (run / "config.json").read_bytes() == config_before  # nothing written
    # A copy of the same data elsewhere is the same data: moved, it resumes.
    (run / identity.IDENTITY_FILE).unlink()  # the user accepts the new data
    summary = train.run(_config(data, run, **resume))
    assert summary["steps"] == 40
    assert json.loads((run / identity.IDENTITY_FILE).read_text())["train"]["examples"] == 80
