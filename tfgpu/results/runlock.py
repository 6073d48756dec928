"""One run per --model_dir: the chief holds a lock on ``<model_dir>/.tfgpu.lock`` while it
trains, so a second run started into the same directory (another job, a forgotten terminal, a
launcher that started N copies) stops in one line naming the holder instead of writing over it.
Likewise one side-car evaluator per run (``SIDECAR_LOCK_FILE``).

An advisory ``flock``: the kernel drops it when the process ends, however it ends (a killed or
preempted run leaves no stale lock to clean up), and NFS clients emulate it with POSIX locks.
No TensorFlow here.
"""

import contextlib
import datetime
import fcntl
import os
import socket

LOCK_FILE = ".tfgpu.lock"
SIDECAR_LOCK_FILE = ".tfgpu-sidecar.lock"  # the side-car evaluator's (inference/sidecar.py)
# What a second holder is told, per lock file ({d}: the model_dir, {h}: the holder).
IN_USE = {
    LOCK_FILE: "--model_dir={d} is in use by another run ({h}): two runs would write one "
    "--model_dir; stop that run, or choose another --model_dir",
    SIDECAR_LOCK_FILE: "--model_dir={d} is watched by another side-car evaluator ({h}): two "
    "would evaluate every checkpoint twice and write each result twice; leave that one to it, "
    "or stop it first",
}
_HELD: dict = {}  # (real path of a model_dir, lock file) -> the open lock file of this process


def claim(model_dir: str, lock_file: str = LOCK_FILE) -> str:
    """Takes the lock ``lock_file`` of ``model_dir`` for this process; returns "" on success
    (also when this process holds it already), else one line naming the holder (``IN_USE``)."""
    key = (os.path.realpath(model_dir), lock_file)
    if key in _HELD:
        return ""
    os.makedirs(model_dir, exist_ok=True)
    f = open(os.path.join(model_dir, lock_file), "a+", encoding="utf-8")  # noqa: SIM115
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        return IN_USE[lock_file].format(d=model_dir, h=holder)
    f.seek(0)
    f.truncate()
    since = datetime.datetime.now().isoformat(timespec="seconds")
    f.write(f"host {socket.gethostname()}, pid {os.getpid()}, since {since}\n")
    f.flush()
    _HELD[key] = f
    return ""


def release(model_dir: str, lock_file: str = LOCK_FILE) -> None:
    """Drops this process's lock ``lock_file`` of ``model_dir`` (closing the file releases it)."""
    f = _HELD.pop((os.path.realpath(model_dir), lock_file), None)
    if f is not None:
        f.close()


@contextlib.contextmanager
def held(model_dir: str, take: bool):
    """Claims ``model_dir`` for the block when ``take`` (the chief); yields the error line
    ("" when free or not taken), and releases the lock after the block."""
    error = claim(model_dir) if take else ""
    try:
        yield error
    finally:
        if take and not error:
            release(model_dir)
