"""tfgpu.errors: every error carries its exit code, every command prints it as one line, and
errors from TensorFlow ops are said in words (a failed checkpoint write, for real)."""

import os

import pytest
import tensorflow as tf

from tfgpu import errors
from tfgpu.cli import app
from tfgpu.checkpoint.store import Checkpoints
from tfgpu.config import ConfigError
from tfgpu.data.spec import DataError
from tfgpu.distribute import DistributeError
from tfgpu.errors import CheckpointError, Preempted
from tfgpu.step.train_step import NonFiniteLoss

# What SaveV2 raises when the disk is full: op name, temp file and all.
DISK_FULL = (
    "{{function_node __wrapped__SaveV2_dtypes_4_device_/job:localhost/replica:0/task:0/device:"
    "CPU:0}} /run/checkpoints/ckpt-2_temp/part-00000-of-00001.data-00000-of-00001.tempstate38521"
    "; No space left on device [Op:SaveV2]"
)


@pytest.mark.parametrize(
    "err, code, line",
    [
        (ConfigError("--x=1 is wrong"), 2, "tfgpu: error: --x=1 is wrong"),
        (DataError("no shards"), 2, "tfgpu: error: no shards"),
        (DistributeError("no TF_CONFIG"), 2, "tfgpu: error: no TF_CONFIG"),
        (
            NonFiniteLoss("non-finite loss at step 3"),
            3,
            "tfgpu: error: non-finite loss at step 3; the last good checkpoint is kept",
        ),
        (CheckpointError("no checkpoint reads back"), 4, "tfgpu: error: no checkpoint reads back"),
        (errors.WorkerLost("lost contact"), 5, "tfgpu: error: lost contact"),
        (errors.OutOfMemory("out of memory"), 7, "tfgpu: error: out of memory"),
        (Preempted("stopped by SIGTERM"), 75, "tfgpu: stopped by SIGTERM; run the same command"),
    ],
)
def test_each_error_is_one_line_and_its_exit_code(err, code, line, capsys):
    assert isinstance(err, errors.TfgpuError)
    assert app.run_command(lambda: (_ for _ in ()).throw(err)) == code
    out = capsys.readouterr().err
    assert out.startswith(line) and out.count("\n") == 1


def test_the_line_is_written_at_once(monkeypatch):
    """The processes of one launch share a stream (mpirun forwards their stderr as it comes):
    a line and its newline written apart ran two workers' lines into one."""
    writes = []
    stream = type(
        "Stream", (), {"write": lambda self, t: writes.append(t), "flush": lambda self: None}
    )
    monkeypatch.setattr("sys.stderr", stream())
    assert app.report(DistributeError("2 separate copies")) == 2
    assert writes == ["tfgpu: error: 2 separate copies\n"]


def test_run_command_passes_codes_and_unknown_errors_through(capsys):
    assert app.run_command(lambda: None) == 0
    assert app.run_command(lambda a: a, 7) == 7
    with pytest.raises(ZeroDivisionError):
        app.run_command(lambda: 1 / 0)
    translated = app.run_command(
        lambda: 1 / 0, prog="x", translate=lambda e: errors.UsageError(f"said: {e}")
    )
    assert translated == 2 and capsys.readouterr().err == "x: error: said: division by zero\n"


def test_op_errors_are_said_without_op_names_or_temp_files():
    cause = errors.op_error_cause(tf.errors.ResourceExhaustedError(None, None, DISK_FULL))
    assert cause == "No space left on device"
    assert errors.op_error_cause(OSError(28, os.strerror(28), "/x")) == "No space left on device"


class _Chief:
    is_chief = True

    def checkpoint_dir(self, directory):
        return directory


def _checkpoints(model_dir) -> tuple[Checkpoints, tf.Variable]:
    step = tf.Variable(1, dtype=tf.int64)
    return Checkpoints({"step": step, "w": tf.Variable([1.0, 2.0])}, _Chief(), model_dir, 3), step


def _assert_in_words(line: str, directory: str, kept: str, cause: str) -> None:
    assert "function_node" not in line and "_temp" not in line and "[Op:" not in line, line
    assert f"checkpoint at step 2 failed: writing it to {directory} failed ({cause})" in line
    assert f"the newest complete checkpoint, {kept}, is kept" in line


def test_a_failed_checkpoint_write_says_what_where_why_and_what_is_kept(tmp_path, capsys):
    checkpoints, step = _checkpoints(str(tmp_path))
    checkpoints.save()
    step.assign(2)
    # A real failure: the save's temporary directory is taken by a file (as root, chmod
    # would not stop a write), so TensorFlow's SaveV2 op fails with ENOTDIR.
    open(os.path.join(checkpoints.directory, "ckpt-2_temp"), "w").close()
    checkpoints.save()
    line = capsys.readouterr().err.strip()
    assert line.startswith("tfgpu: WARNING: ") and "\n" not in line
    _assert_in_words(line, checkpoints.directory, "ckpt-1", os.strerror(20))
    with pytest.raises(CheckpointError) as raised:
        checkpoints.save(final=True)
    _assert_in_words(raised.value.message, checkpoints.directory, "ckpt-1", os.strerror(20))


def test_a_full_disk_is_named(tmp_path, monkeypatch):
    checkpoints, step = _checkpoints(str(tmp_path))
    checkpoints.save()
    step.assign(2)

    def disk_full(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, DISK_FULL)

    monkeypatch.setattr(checkpoints._manager, "save", disk_full)
    with pytest.raises(CheckpointError) as raised:
        checkpoints.save(final=True)
    _assert_in_words(
        raised.value.message, checkpoints.directory, "ckpt-1", "No space left on device"
    )
