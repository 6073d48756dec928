"""Scratch directories: where a non-chief worker writes the checkpoints it must take part in
but that only the chief keeps (``Backend.checkpoint_dir``). Removed when the process exits
normally, or at once by ``remove_scratch_dirs`` (a process that ends by a kill: a Ray worker,
one the heartbeat watcher ends). No TensorFlow here: the heartbeat watcher removes them
without it.
"""

import atexit
import os
import shutil
import tempfile
import time

_SCRATCH: list = []  # paths, removed when the process exits normally
REMOVE_WAIT_S = 2.0  # how long a removal tries again while a save writes into a directory


def remove_scratch_dirs(wait_s: float = REMOVE_WAIT_S) -> None:
    """Removes this process's scratch directories now (a process that ends by a kill, such as
    a Ray worker, never runs the exit handlers that would). The heartbeat watcher calls this
    while the main thread may be saving into one: each is renamed before it is removed, and a
    removal that finds a file a save was still writing tries again for up to ``wait_s`` s."""
    deadline = time.monotonic() + wait_s
    while _SCRATCH:
        path = _SCRATCH.pop()
        # Renamed first: a save's next file cannot be made under the old path, so the
        # removal is not outrun; one opened before the rename is removed on a second try.
        gone = f"{path}.removing"
        try:
            os.rename(path, gone)
        except OSError:  # already gone
            gone = path
        shutil.rmtree(gone, ignore_errors=True)
        while os.path.exists(gone) and time.monotonic() < deadline:
            time.sleep(0.02)
            shutil.rmtree(gone, ignore_errors=True)


def scratch_dir(prefix: str) -> str:
    """A new temporary directory (its name starting with ``prefix``) for a non-chief
    worker's throw-away checkpoint saves."""
    _SCRATCH.append(tempfile.mkdtemp(prefix=prefix))
    return _SCRATCH[-1]


atexit.register(remove_scratch_dirs)  # a normal exit: nothing to do when none was made
