"""What an error TensorFlow raised (an ``OpError``) means for a run: a record's label out of
range (the reader's check), a damaged shard, a shard gone or unreadable mid-run, a lost
worker. Imported by ``op_errors.translate`` only once TensorFlow runs: the commands import
that module before TensorFlow starts, and every module here imports it at its top.
"""

import tensorflow as tf

from tfgpu.data.broken import data_loss_error, vanished_shard_error
from tfgpu.data.spec import LABEL_ERROR
from tfgpu.distribute.failures import lost_worker_message
from tfgpu.distribute.heartbeats import silent_peers
from tfgpu.errors import DataError, WorkerLost

# The TensorFlow errors a shard gone or out of reach mid-run raises (a deleted file, a
# permission taken away, a network file system's I/O error).
FILE_ERRORS = (
    tf.errors.NotFoundError,
    tf.errors.PermissionDeniedError,
    tf.errors.UnknownError,
    tf.errors.UnavailableError,
)


def translate_op_error(err: tf.errors.OpError):
    """The tfgpu error meant by ``err``, or None (TensorFlow's full error is kept)."""
    if isinstance(err, tf.errors.DataLossError):  # a damaged shard: named, exit 2
        return data_loss_error(err)
    if isinstance(err, FILE_ERRORS):
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
    message = lost_worker_message(err, silent_peers())
    return WorkerLost(message) if message else None  # not a lost peer: TensorFlow's full error
