"""Broken records, named once: a record whose image is cut short or not an image is trained
with weight 0 (``host_ops.looks_whole``), and here it is named (its shard and index) the first
time this process meets it, however many epochs pass over it.

The input pipeline calls ``reporter(files)`` for a record it finds broken: a ``tf.py_function``
that runs only then (so it costs nothing per whole record). Records are known by their
``origin``: the index of their file in ``files`` (upper 32 bits) and their index in it.
"""

import sys
import threading

import tensorflow as tf

_LOCK = threading.Lock()
_SEEN: dict = {}  # (file, index) -> reason, in the order met
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
        print(
            f"tfgpu: WARNING: record {key[1]} of {key[0]} is broken ({REASON}): it is trained "
            "with weight 0, and named here once",
            file=sys.stderr,
            flush=True,
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
