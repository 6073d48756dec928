"""``translate``: the tfgpu error meant by one that TensorFlow raised (an ``OpError``: a
label out of range, a damaged shard, a lost worker) or a registry lookup (a ``KeyError``).
The errors, each with its exit code, are ``tfgpu.errors``; docs/faults.md has the table.
No TensorFlow imported here: the commands import this module before TensorFlow starts.
"""

import sys

from tfgpu.errors import DataError, UsageError, WorkerLost


def translate(err: Exception):
    """The error tfgpu means by one that TensorFlow (or a registry lookup) raised, or None:
    a record's label out of range (the reader's check), a shard gone or unreadable mid-run,
    a lost worker. Every way a run can
    stop early is a ``tfgpu.errors.TfgpuError``, which carries its exit code."""
    if isinstance(err, KeyError):  # an unknown registry name; the message says which
        return UsageError(err.args[0] if err.args else str(err))
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(err, tf.errors.OpError):
        return None
    # Imported here, and only once TensorFlow runs: the commands import this module before
    # TensorFlow starts (tests/test_imports.py: --help and a bad flag never wait for it).
    from tfgpu.data.spec import LABEL_ERROR  # noqa: PLC0415

    if isinstance(err, tf.errors.DataLossError):  # a damaged shard: named, exit 2
        from tfgpu.data.broken import data_loss_error  # noqa: PLC0415

        return data_loss_error(err)
    if isinstance(err, _FILE_ERRORS(tf)):
        from tfgpu.data.broken import vanished_shard_error  # noqa: PLC0415

        vanished = vanished_shard_error(err)  # None: not a shard of this run's
        if vanished is not None:
            return vanished
    if isinstance(err, tf.errors.InvalidArgumentError):
        if LABEL_ERROR not in err.message:
            return None  # not a label: keep TensorFlow's full error
        detail = err.message.split(LABEL_ERROR, 1)[1].split("\n")[0].rstrip("]'").strip()
        return DataError(
            f"{detail}: check --num_classes and --label_offset (labels "
            "that start at 1, as in TensorFlow's official ImageNet records: --label_offset=1)"
        )
    from tfgpu.distribute.failures import lost_worker_message  # noqa: PLC0415
    from tfgpu.distribute.heartbeats import silent_peers  # noqa: PLC0415

    message = lost_worker_message(err, silent_peers())
    return WorkerLost(message) if message else None  # not a lost peer: TensorFlow's full error


def _FILE_ERRORS(tf) -> tuple:  # noqa: N802
    """The TensorFlow errors a shard gone or out of reach mid-run raises (a deleted file, a
    permission taken away, a network file system's I/O error)."""
    e = tf.errors
    return (e.NotFoundError, e.PermissionDeniedError, e.UnknownError, e.UnavailableError)
