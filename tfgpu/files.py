"""Files written safely: a new file never goes through a symlink, JSON lands atomically.

The one JSON writer and the one JSON reader of tfgpu (converter and trainer alike).
"""

import json
import os
import stat

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_new(path: str):
    """Opens ``path`` for writing as a new regular file, never through a symlink.

    Whatever sits at ``path`` (a stale temp file, or a symlink planted there) is unlinked
    first, and O_EXCL|O_NOFOLLOW make sure the file created is the one opened.
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    return os.fdopen(fd, "wb")


def write_json(path: str, obj) -> None:
    """Writes ``obj`` as JSON to ``path`` atomically (a new temp file, then rename): readers
    see the old file or the new one, never half of one."""
    with open_new(path + ".tmp") as f:
        f.write(json.dumps(obj, indent=1, ensure_ascii=False).encode("utf-8"))
    os.replace(path + ".tmp", path)


def read_json(path: str) -> dict:
    """The JSON object in ``path``; {} when there is no such file. A file that is not a JSON
    object, or not a regular file (a FIFO would block the reader for ever, a directory), raises
    ValueError with a one-line message naming it."""
    try:
        # Non-blocking: opening a FIFO would otherwise wait for a writer that never comes.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ValueError("not a regular file")
        with os.fdopen(fd, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} is not readable JSON: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds JSON but not an object")
    return value
