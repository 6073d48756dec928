"""What both kinds of backend share (``backends.StrategyBackend``, ``horovod.HorovodBackend``):
their counters, the timing of the update's all-reduce and the gathering of bytes through an
int32 collective (their scratch directories for non-chief saves: ``scratch.py``)."""

import numpy as np
import tensorflow as tf

from tfgpu import compat


def counter(dtype=tf.int64) -> tf.Variable:
    """Counts gradient all-reduces as they run (tests check one per update), or seconds;
    every replica adds to it, the first replica's sum is the one kept."""
    return tf.Variable(
        0, trainable=False, dtype=dtype, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
    )


def timed(backend, reduce, values: list) -> list:
    """``reduce(values)``; with several workers, the seconds it waited are added to
    ``backend.wait_seconds`` (compute per update = step time - wait: the straggler is the one
    that waits least). Not under --deterministic: TensorFlow refuses clocks then."""
    if backend.num_workers == 1 or compat.op_determinism_enabled():
        return reduce(values)
    with tf.control_dependencies(values):
        start = tf.timestamp()
    with tf.control_dependencies([start]):
        reduced = reduce(values)
    with tf.control_dependencies(reduced):
        waited = backend.wait_seconds.assign_add(tf.timestamp() - start)
    with tf.control_dependencies([waited]):
        return [tf.identity(r) for r in reduced]


def gathered_bytes(blob: bytes, gather) -> list[bytes]:
    """All workers' ``blob`` through ``gather([1, L] int32 rows) -> [workers, L]``: the lengths
    first, so that every worker pads to the same L (collectives need equal shapes)."""
    lengths = gather(np.array([[len(blob)]], np.int32))[:, 0]
    rows = np.zeros([1, max(int(lengths.max()), 1)], np.int32)  # a 0-length collective crashes
    rows[0, : len(blob)] = np.frombuffer(blob, np.uint8)
    return [bytes(row[:n].astype(np.uint8)) for row, n in zip(gather(rows), lengths)]
