"""``translate``: the tfgpu error meant by one that TensorFlow raised (an ``OpError``: a
label out of range, a damaged shard, a lost worker; ``tf_errors`` says which) or a registry
lookup (a ``KeyError``). The errors, each with its exit code, are ``tfgpu.errors``;
docs/faults.md has the table. No TensorFlow imported here: the commands import this module
before TensorFlow starts.
"""

import sys

from tfgpu.errors import UsageError


def translate(err: Exception):
    """The error tfgpu means by one that TensorFlow (or a registry lookup) raised, or None:
    a record's label out of range (the reader's check), a shard gone or unreadable mid-run,
    a lost worker. Every way a run can stop early is a ``tfgpu.errors.TfgpuError``, which
    carries its exit code."""
    if isinstance(err, KeyError):  # an unknown registry name; the message says which
        return UsageError(err.args[0] if err.args else str(err))
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(err, tf.errors.OpError):
        return None
    # Imported here, and only once TensorFlow runs: the commands import this module before
    # TensorFlow starts (tests/test_imports.py: --help and a bad flag never wait for it).
    from tfgpu.train import tf_errors  # noqa: PLC0415

    return tf_errors.translate_op_error(err)
