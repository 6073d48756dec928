"""Scratch directories: where a non-chief worker writes the checkpoints it must take part in
but that only the chief keeps (``Backend.checkpoint_dir``). Removed when the process exits
normally, or at once by ``remove_scratch_dirs`` (a process that ends by a kill: a Ray worker,
one the heartbeat watcher ends). No TensorFlow here: the heartbeat watcher removes them
without it.
"""

import tempfile

_SCRATCH: list = []  # removed when the process exits normally


def remove_scratch_dirs() -> None:
    """Removes this process's scratch directories now (a process that ends by a kill, such as
    a Ray worker, never runs the exit handlers that would)."""
    while _SCRATCH:
        _SCRATCH.pop().cleanup()


def scratch_dir(prefix: str) -> str:
    """A temporary directory for a non-chief worker's throw-away checkpoint saves."""
    _SCRATCH.append(tempfile.TemporaryDirectory(prefix=prefix))
    return _SCRATCH[-1].name
