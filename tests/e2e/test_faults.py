"""Faults injected for real: signals, kill -9 while checkpointing, non-finite losses, bad flags
and environments. Nothing finished is lost and every error is one clear line."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import FAULTS_RUN, as_train_command, cli_flags, final_weights
from weights import assert_same_weights
import tensorflow as tf

from tfgpu import train
from tfgpu.config import config_from, validate
from tfgpu.errors import CheckpointError
from tfgpu.step.train_step import NonFiniteLoss

# The run the faults interrupt: conftest's FAULTS_RUN (16x16: the faults are the run's, not the
# model's), its uninterrupted run the session's (``faults_run``, shared with test_data_faults).
RUN = FAULTS_RUN
# RUN for the faults that stop or go on within the run's first updates whatever its input
# does (a non-finite loss, a label out of range, a checkpoint that fails to write): without
# the per-example policies, whose draws are the resumes' claim, and without the start-up
# probe of the input alone (up to 100 batches through those policies first).
PLAIN = dict(RUN, augment_policy="none", random_erasing=0.0, input_probe_s=0.0)


def _flags(data_dir, model_dir, **overrides):
    values = dict(RUN, **overrides)
    return cli_flags(values, data_dir=data_dir, model_dir=model_dir, strategy="default")


def _start(flags, **env):
    return subprocess.Popen(
        [sys.executable, "-m", "tfgpu.main", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **env),
    )


def _wait_for(predicate, proc, timeout=120):
    deadline = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def _logged_step(model_dir) -> int:
    path = os.path.join(model_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return 0
    steps = [json.loads(line)["step"] for line in open(path) if line.strip().endswith("}")]
    return max(steps, default=0)


def _config(data_dir, model_dir):
    """RUN on one default process, as ``_flags`` says it (in this one)."""
    return validate(
        config_from(data_dir=str(data_dir), model_dir=str(model_dir), strategy="default", **RUN)
    )


@pytest.fixture(scope="module")
def uninterrupted(faults_run):
    return final_weights(faults_run)


def test_sigterm_checkpoints_exits_75_and_the_resumed_run_is_exact(
    small_dataset, uninterrupted, tmp_path, capsys
):
    # The process without the start-up probe of the input alone (up to 100 batches through
    # the policies): the signal is its claim; the in-process resume below probes, as a run
    # started again does, and still ends with the uninterrupted weights.
    proc = _start(_flags(small_dataset, tmp_path, input_probe_s=0.0))
    _wait_for(lambda: _logged_step(tmp_path) >= 4, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert "run the same command again to resume" in err and "Traceback" not in err
    stopped_at = int(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).rsplit("-", 1)[1])
    assert 4 <= stopped_at < RUN["train_steps"]
    # The resume in this process: its claim is the weights it ends with, not the process.
    capsys.readouterr()
    summary = train.run(_config(small_dataset, tmp_path))
    assert summary["steps"] == RUN["train_steps"]
    assert f"resumed from {tmp_path}/checkpoints/ckpt-{stopped_at}" in capsys.readouterr().out
    assert_same_weights(tmp_path, uninterrupted, atol=1e-6)


@pytest.mark.heavy  # 86 s; SIGTERM (above) and a damaged newest checkpoint (below) stay
def test_kill_9_while_checkpointing_every_step_resumes_from_a_complete_one(
    small_dataset, uninterrupted, tmp_path
):
    proc = _start(_flags(small_dataset, tmp_path, checkpoint_every_steps=1))
    _wait_for(lambda: _logged_step(tmp_path) >= 6, proc)
    proc.kill()
    proc.communicate()
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
    resumed = _start(_flags(small_dataset, tmp_path, checkpoint_every_steps=1))
    out, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err[-3000:]
    assert_same_weights(tmp_path, uninterrupted, atol=1e-6)


def test_non_finite_float32_loss_stops_naming_the_step_and_keeps_the_last_checkpoint(
    small_dataset, tmp_path
):
    config = validate(
        config_from(
            data_dir=small_dataset,
            model_dir=str(tmp_path),
            strategy="default",
            **dict(PLAIN, learning_rate=1e30, optimizer="sgd", train_steps=40),
        )
    )
    with pytest.raises(NonFiniteLoss, match=r"at step \d+"):
        train.run(config)
    assert not os.path.exists(tmp_path / "final.weights.h5")


def test_skip_non_finite_counts_skipped_updates(small_dataset, tmp_path):
    config = validate(
        config_from(
            data_dir=small_dataset,
            model_dir=str(tmp_path),
            strategy="default",
            skip_non_finite=True,
            **dict(PLAIN, learning_rate=1e30, optimizer="sgd", train_steps=8, export=False),
        )
    )
    summary = train.run(config)
    assert summary["skipped_updates"] > 0


@pytest.mark.parametrize(
    "flags,env,expected",
    [
        (["--model=resnet5"], {}, "--model='resnet5' is unknown; choose from"),
        (["--strategy=ring"], {}, "--strategy='ring' is unknown; choose from auto, default"),
        (
            ["--global_batch_size=10", "--grad_accum_steps=3"],
            {},
            "does not divide by --grad_accum_steps=3",
        ),
        (
            ["--strategy=mirrored", "--logical_cpu_devices=2", "--global_batch_size=15"],
            {},
            "does not divide by 2 replicas",
        ),
        (["--data_dir=/nonexistent/data"], {}, "--data_dir=/nonexistent/data is not a directory"),
        (["--data_dir={empty}"], {}, "holds no train-* shards"),
        (
            ["--strategy=multi_worker_mirrored"],
            {"TF_CONFIG": "{not json"},
            "TF_CONFIG is malformed",
        ),
        (["--strategy=horovod"], {}, "--strategy=horovod must run under horovodrun"),
        (["--model_dir=/proc/tfgpu-run"], {}, "--model_dir=/proc/tfgpu-run is not writable"),
        (["--unfreeze_after_steps=10"], {}, "--unfreeze_after_steps unfreezes a frozen backbone"),
        (
            ["--model=tiny_cnn", "--layer_lr_decay=0.8"],
            {},
            "--layer_lr_decay=0.8 is for models with a backbone in blocks",
        ),
        (["--backbone_lr_multiplier=2"], {}, "--backbone_lr_multiplier=2.0 must be in (0, 1]"),
    ],
)
def test_bad_flags_and_environment_are_one_clear_line(flags, env, expected, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    flags = [f.replace("{empty}", str(empty)) for f in flags]
    if not any(f.startswith("--model_dir") for f in flags):
        flags.append(f"--model_dir={tmp_path / 'run'}")
    proc = _start(flags + ["--train_steps=1"], **env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    lines = [line for line in err.splitlines() if line.startswith("tfgpu: error:")]
    assert len(lines) == 1 and expected in lines[0], err[-2000:]
    assert "Traceback" not in err


def test_label_out_of_range_is_one_clear_line(small_dataset, tmp_path, capsys):
    """A record's label past --num_classes, found by the reader mid-run: through the command's
    own ending (``run_command`` with tfgpu-train's translation of TensorFlow's error, in this
    process: the claim is the line), exit 2 and one line naming the range and the flag."""
    values = dict(PLAIN, train_steps=4, num_classes=2, strategy="default")
    config = validate(
        config_from(data_dir=small_dataset, model_dir=str(tmp_path / "run"), **values)
    )
    code = as_train_command(config)
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("tfgpu: error:")]
    assert len(lines) == 1 and "outside [0, 2)" in lines[0] and "--num_classes" in lines[0], err[
        -2000:
    ]
    assert "Traceback" not in err


def test_a_failed_checkpoint_write_is_loud_and_the_final_one_is_an_error(
    small_dataset, tmp_path, monkeypatch, capsys
):
    real_save = tf.train.CheckpointManager.save
    calls = []

    def disk_full(self, *args, **kwargs):
        calls.append(1)
        if len(calls) in (1, 3):  # the first periodic save, and the final one
            raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(tf.train.CheckpointManager, "save", disk_full)
    config = validate(
        config_from(
            data_dir=small_dataset,
            model_dir=str(tmp_path),
            strategy="default",
            **dict(PLAIN, train_steps=20, checkpoint_every_steps=8),
        )
    )
    with pytest.raises(CheckpointError, match="No space left on device"):
        train.run(config)
    assert "checkpoint at step 8 failed" in capsys.readouterr().err
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("-16")


def _truncate_data_files(checkpoint_prefix: str) -> None:
    for name in os.listdir(os.path.dirname(checkpoint_prefix)):
        path = os.path.join(os.path.dirname(checkpoint_prefix), name)
        if name.startswith(os.path.basename(checkpoint_prefix) + ".data"):
            with open(path, "r+b") as f:
                f.truncate(max(os.path.getsize(path) // 2, 1))


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(
    small_dataset, faults_run, uninterrupted, tmp_path, capsys
):
    """A run started again on checkpoints whose newest is damaged: one warning naming it,
    then the one before it resumes and the run ends with the undamaged run's weights; with
    every checkpoint damaged, one line and exit 4. In this process, through the command's own
    ending (``run_command`` with tfgpu-train's translation): the claim is what the restore
    does and says, not the process (the SIGTERM test above resumes through the command). On a
    copy of the session's uninterrupted run (its checkpoints at 28, 32 and 36)."""
    model_dir = tmp_path / "run"
    shutil.copytree(faults_run, model_dir)
    os.remove(model_dir / "final.weights.h5")  # the resumed run must write its own
    config = _config(small_dataset, model_dir)
    _truncate_data_files(str(model_dir / "checkpoints" / "ckpt-36"))
    capsys.readouterr()
    code = as_train_command(config)
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    warning = [line for line in err.splitlines() if "does not read back" in line]
    assert len(warning) == 1 and "ckpt-36" in warning[0] and "trying an older one" in warning[0]
    assert "resumed from" in out and "ckpt-32 at step 32" in out
    assert_same_weights(model_dir, uninterrupted, atol=1e-6)
    for step in (28, 32, 36):
        _truncate_data_files(str(model_dir / "checkpoints" / f"ckpt-{step}"))
    code = as_train_command(config)
    err = capsys.readouterr().err
    assert code == 4, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("tfgpu: error:")]
    assert len(lines) == 1 and "no checkpoint in" in lines[0] and "Traceback" not in err
