"""Broken records, named once: a record whose image is cut short or not an image is trained
with weight 0 (``host_ops.looks_whole``), and here it is named (its shard and index) the first
time this process meets it, however many epochs pass over it.

The input pipeline calls ``reporter(files)`` for a record it finds broken: a ``tf.py_function``
that runs only then (so it costs nothing per whole record). Records are known by their
``origin``: the index of their file in ``files`` (upper 32 bits) and their index in it.
"""

import errno
import os
import re
import threading

import tensorflow as tf

from tfgpu.errors import DataError, op_error_cause, warn
from tfgpu.data.recordformat import damaged_at

_LOCK = threading.Lock()
_SEEN: dict = {}  # (file, index) -> reason, in the order met
_SHARDS: set = set()  # the shards datasets of this process list, to name a damaged one
_DATA_LOSS = re.compile(r"(corrupted|truncated) record at (\d+)")
REASON = "not a whole image (cut short, or not an image)"


def origin(file_index, record_index) -> tf.Tensor:
    """The int64 origin of record ``record_index`` of file ``file_index``."""
    return tf.bitwise.left_shift(tf.cast(file_index, tf.int64), 32) + tf.cast(
        record_index, tf.int64
    )


def reporter(files):
    """``report(origin) -> bool tensor`` for records of ``files``: names the record the first
    time, in one warning line, and remembers it for the run's summary."""
    names = list(files)

    def record(value) -> bool:
        value = int(value)
        key = (names[value >> 32], value & 0xFFFFFFFF)
        with _LOCK:
            if key in _SEEN:
                return True
            _SEEN[key] = REASON
        warn(
            f"record {key[1]} of {key[0]} is broken ({REASON}): it is trained with weight 0, "
            "and named here once"
        )
        return True

    def report(value: tf.Tensor) -> tf.Tensor:
        return tf.py_function(record, [value], tf.bool)

    return report


def weight(valid: tf.Tensor, origin: tf.Tensor, report=None) -> tf.Tensor:
    """The training weight of a record: 1.0 for a whole image, 0.0 for a broken one, which
    ``report`` (``reporter(files)``) names once, when given."""
    if report is None:
        return tf.cast(valid, tf.float32)
    named = tf.cond(valid, lambda: tf.constant(True), lambda: report(origin))
    with tf.control_dependencies([named]):
        return tf.cast(valid, tf.float32)


def found() -> list:
    """[{"file", "index", "reason"}] of the broken records this process met, in order."""
    with _LOCK:
        return [{"file": f, "index": i, "reason": r} for (f, i), r in _SEEN.items()]


def forget() -> None:
    """Starts a new run's list (runs in one process: tests)."""
    with _LOCK:
        _SEEN.clear()


def reading(files) -> None:
    """Remembers ``files`` as shards this process reads (``load_data_spec`` lists them)."""
    with _LOCK:
        _SHARDS.update(files)


def data_loss_error(err) -> DataError | None:
    """The one-line DataError for TensorFlow's DataLossError of a record that fails its
    checksum, naming the shard and the byte (TensorFlow names neither file nor split), or
    None for a DataLossError of something else. Such a record is not skipped: TensorFlow's
    reader cannot go past it in its file, so skipping would silently drop the shard's rest.
    The shards are searched only now, on the way out: reading costs nothing per record."""
    found = _DATA_LOSS.search(getattr(err, "message", "") or str(err))
    if not found:
        return None
    offset = int(found[2])
    with _LOCK:
        shards = sorted(_SHARDS)
    for path in shards:
        if "://" not in path and os.path.isfile(path) and damaged_at(path, offset):
            return DataError(
                f"{path}: the record at byte {offset} is {found[1]} (it fails its checksum: the "
                "file is damaged); re-copy or re-convert it"
            )
    return DataError(
        f"a shard holds a {found[1]} record at byte {offset} (it fails its checksum; TensorFlow "
        "does not say which file): re-copy or re-convert the dataset"
    )


def vanished_shard_error(err) -> DataError | None:
    """The one-line DataError for a TensorFlow error (not found, permission denied, an I/O
    error of a network file system) naming a shard this process reads (``reading``), that was
    there when the run started and is gone or unreadable now: it names the shard and the OS's
    reason. None when the error names no such shard (then it is not the data's)."""
    message = getattr(err, "message", "") or str(err)
    with _LOCK:
        shards = sorted(_SHARDS, key=len, reverse=True)  # the longest name that matches
    shard = next((path for path in shards if path in message), None)
    if shard is None:
        return None
    reason = next((r for r in _IO_REASONS if r in message), op_error_cause(err))
    why = "it is gone" if not os.path.exists(shard) else "it cannot be read"
    return DataError(
        f"{shard}: {why} ({reason}), though it was there when the run started; the last "
        "checkpoint is kept: run the same command again once the shard is back"
    )


# What the OS says of a file gone or out of reach (TensorFlow quotes it after the path).
_IO_REASONS = tuple(
    os.strerror(code)
    for code in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.ESTALE, errno.EIO, errno.ENOTCONN)
)
