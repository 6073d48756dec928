"""What a test session makes once and every test shares, across pytest-xdist's workers too:
the small dataset, the reference runs that several modules compare with (tests/conftest.py's
``small_dataset`` and ``reference_run`` fixtures).

``made_once(path, make)`` runs ``make(path)`` in the first process that asks for ``path``;
the others wait on a file lock and find it made. A maker that failed leaves no mark, so the
next one to ask tries again (and fails the same way, in its own test).
"""

import fcntl
import hashlib
import json
import pathlib
import shutil


def shared_root(tmp_path_factory, config) -> pathlib.Path:
    """A folder of this session that every xdist worker sees: the parent of the workers' own
    temporary folders (``pytest-N`` of this run), else the session's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


def made_once(path: pathlib.Path, make) -> pathlib.Path:
    """``path``, made by ``make(path)`` unless a process of this session made it already."""
    done = path.with_name(path.name + ".made")
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)  # what a failed maker left
            make(path)
            done.touch()
    return path


def key(values: dict) -> str:
    """A short name for a run's settings (a folder name)."""
    return hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]
