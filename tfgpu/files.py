"""Files written safely: a new file never goes through a symlink, a result lands whole
(a temporary file in its folder, then a rename) or not at all, an append never follows a
symlink, two writers that would race take turns (``locked``), and an output is checked
before any work is done for it.

The one JSON writer and the one JSON reader of tfgpu (converter and trainer alike).
"""

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import threading
import time

from tfgpu.errors import UsageError

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


def write_json(path: str, obj, indent: int | None = 1) -> None:
    """Writes ``obj`` as JSON to ``path`` atomically (a new temp file, then rename): readers
    see the old file or the new one, never half of one. ``indent=None``: on one line, by
    json's C encoder (an indented file is written by its Python one, ~10x slower)."""
    # A file name that is not UTF-8 (os.fsdecode's lone surrogates) is written as its \\u
    # escape, which json reads back as the same string: os.fsencode gives its bytes again.
    text = json.dumps(obj, indent=indent, ensure_ascii=False)
    with replacing(path) as f:
        f.write(text.encode("utf-8", "backslashreplace"))


@contextlib.contextmanager
def replacing(path: str):
    """Yields a binary file that becomes ``path`` when the block ends without an error: a
    new temporary file in ``path``'s folder (``open_new``), renamed over ``path``. Whatever
    was at ``path`` (a file, a symlink: the link itself, its target never written) is
    replaced at once; after an error the temporary file is removed and ``path`` untouched.
    The temporary name is this process's and thread's own: two writers of one file (two
    commands given one --output) each rename a whole file of theirs, the last one stays."""
    temp = f"{path}.{os.getpid()}-{threading.get_native_id()}.tmp"
    try:
        with open_new(temp) as f:
            yield f
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


@contextlib.contextmanager
def locked(folder: str):
    """Holds an exclusive advisory lock (``flock``) on ``folder`` itself for the block,
    waiting for another holder to let go: for the short moments in which two writers into
    one folder would race (a read-modify-write of a shared file, a rename over a name). No
    file is left behind; the kernel lets go when the process ends, however it ends. Where
    the file system locks no folders (some NFS clients), the block runs unlocked."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        with contextlib.suppress(OSError):  # ENOLCK, EBADF: no folder locks here
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def open_append(path: str, warn=None):
    """Opens ``path`` (a text file, UTF-8) to append to it, never through a symlink: a
    symlink there is replaced by a new file of its own (its target is not written;
    ``warn(line)`` says so), and anything but a regular file raises OSError."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | _NOFOLLOW
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        target = os.readlink(path)
        os.unlink(path)
        if warn:
            warn(f"{shown(path)} was a symlink (to {shown(target)}): replaced by a file of its own")
        fd = os.open(path, flags | os.O_EXCL, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return os.fdopen(fd, "a", encoding="utf-8", newline="")


def read_lines(path: str):
    """The lines of the regular file ``path`` (UTF-8; other bytes kept as surrogate escapes,
    which ``encode("utf-8", "surrogateescape")`` gives back), each with its end; None when
    there is none, or it is a symlink (``open_append`` replaces one) or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, encoding="utf-8", errors="surrogateescape", newline="") as f:
        return f.readlines() if stat.S_ISREG(os.fstat(fd).st_mode) else None


def append_text(f, text: str, point: str = "") -> None:
    """Appends ``text`` to the open text file ``f``. Under the test-only TFGPU_TEST_PAUSE at
    ``point`` (``pause_for_tests``), the first half is written and flushed before the pause:
    a kill there leaves a torn line, as a crash in the middle of a write can."""
    if point and _pause_due(point):
        half = len(text) // 2
        f.write(text[:half])
        f.flush()
        _pause(point)
        text = text[half:]
    f.write(text)


# Test-only (tests/e2e/test_chaos.py, bench/chaos_soak.py), off unless set:
# TFGPU_TEST_PAUSE=POINT[@N] makes the N-th time (default the first) this process reaches
# ``pause_for_tests(POINT)`` (or ``append_text`` at POINT) print ``tfgpu-test: paused in
# POINT`` on stderr and sleep TFGPU_TEST_PAUSE_S seconds (default 60), so that a test's kill
# lands inside that write; with TFGPU_TEST_PAUSE_UNTIL=PATH the pause ends as soon as PATH
# exists (the test's sign that what it waited for happened), TFGPU_TEST_PAUSE_S at most. The
# points: "checkpoint" (its files written, the index not yet), "best" (best/ckpt-S written,
# best.json not yet), "metrics.jsonl" and "summary.csv" (half a row written), "export"
# (model.keras written, the SavedModel not yet), "final.weights" (before final.weights.h5 is
# written).
TEST_PAUSE_ENV = "TFGPU_TEST_PAUSE"
_pauses_seen: dict = {}


def pause_for_tests(point: str) -> None:
    """The test-only pause at ``point`` (see TEST_PAUSE_ENV); nothing when it is not set."""
    if _pause_due(point):
        _pause(point)


def _pause_due(point: str) -> bool:
    wanted = os.environ.get(TEST_PAUSE_ENV, "")
    if not wanted or wanted.partition("@")[0] != point:
        return False
    _pauses_seen[point] = seen = _pauses_seen.get(point, 0) + 1
    return seen == int(wanted.partition("@")[2] or 1)


def _pause(point: str) -> None:
    os.write(2, f"tfgpu-test: paused in {point}\n".encode())
    seconds = float(os.environ.get("TFGPU_TEST_PAUSE_S", "60"))
    until = os.environ.get("TFGPU_TEST_PAUSE_UNTIL", "")
    if not until:
        time.sleep(seconds)
        return
    deadline = time.monotonic() + seconds
    while not os.path.exists(until) and time.monotonic() < deadline:
        time.sleep(0.05)


def check_output(path: str, flag: str = "--output") -> str:
    """``path`` (``~`` expanded) once a result can be written there: it is not a folder, and
    its folder exists and takes a new file (a real file is made and removed: permissions,
    a read-only file system and a full quota all show). Else a UsageError in one line naming
    ``flag``; call it before any work is done for the result."""
    full = os.path.expanduser(path)
    if os.path.isdir(full) and not os.path.islink(full):  # a symlink is replaced, not entered
        raise UsageError(f"{flag}={shown(path)} is a folder; name a file in it")
    folder = os.path.dirname(full) or "."
    if not os.path.isdir(folder):
        raise UsageError(f"{flag}={shown(path)}: no folder {shown(folder)}")
    probe = os.path.join(folder, f".{os.path.basename(full)}.{os.getpid()}.probe.tmp")
    try:
        open_new(probe).close()
        os.unlink(probe)
    except OSError as err:
        raise UsageError(
            f"{flag}={shown(path)}: its folder {shown(folder)} takes no new file ({err.strerror})"
        ) from None
    return full


def shown(path: str) -> str:
    """``path`` for a message: bytes that are not UTF-8 (a file name from elsewhere) as
    ``\\xNN``, so that printing it never fails."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def write_bytes_to_stdout(data: bytes) -> None:
    """``data`` on standard output as it is (its own bytes, whatever the locale's encoding)."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a text-only stream (some test runners)
        sys.stdout.write(data.decode("utf-8", "surrogateescape"))
    else:
        buffer.write(data)
        buffer.flush()


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
    except (OSError, ValueError, RecursionError) as err:  # nesting too deep for the parser
        raise ValueError(f"{path} is not readable JSON: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds JSON but not an object")
    return value


MAX_FLAGFILE_BYTES = 1 << 20  # recipes are a few hundred bytes
MAX_FLAGFILES = 64  # files read through --flagfile, nested ones included


def check_flagfiles(argv: list) -> None:
    """Reads ahead every ``--flagfile`` of ``argv`` (and the ones they name) the way absl will,
    and raises UsageError (one line naming it) for one absl would hang on or fail on with a
    traceback: not a regular file (a FIFO blocks for ever, /dev/zero never ends), over
    MAX_FLAGFILE_BYTES, not UTF-8, including itself under another spelling (absl recurses
    until Python's stack runs out), or more than MAX_FLAGFILES of them in all."""
    seen: list = []

    def visit(name: str, stack: tuple) -> None:
        path = os.path.expanduser(name)
        real = os.path.realpath(path) if path else ""
        if real in stack:
            return  # absl names and skips a file including itself under the same spelling
        seen.append(real)
        if len(seen) > MAX_FLAGFILES:
            raise UsageError(f"--flagfile={name}: more than {MAX_FLAGFILES} flagfiles in all")
        try:
            text = read_text(path, MAX_FLAGFILE_BYTES)
        except ValueError as err:
            raise UsageError(f"--flagfile={name}: {err}") from None
        for line in text.splitlines():
            nested = _flagfile_named(line.strip())
            if nested is not None:
                visit(nested, stack + (real,))

    for name in flagfiles_named(argv):
        visit(name, ())


def flagfiles_named(argv: list) -> list[str]:
    """The ``--flagfile``s ``argv`` (program name first) names itself, in order."""
    out = []
    for i, arg in enumerate(argv[1:], 1):
        name = _flagfile_named(arg)
        if name is None and arg in ("--flagfile", "-flagfile") and i + 1 < len(argv):
            name = argv[i + 1]
        if name:
            out.append(name)
    return out


def typed_flags(argv: list) -> set[str]:
    """The names of the flags ``argv`` (program name first) sets itself, not through a
    flagfile: ``--name``, ``--name=value``, ``--noname`` (as ``name`` and ``noname``: a
    boolean's either way), up to a ``--`` that ends the flags."""
    args = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
    names = {a.lstrip("-").split("=")[0] for a in args if a.startswith("-") and len(a) > 1}
    return names | {n[2:] for n in names if n.startswith("no")}


def _flagfile_named(arg: str):
    """The file ``--flagfile=FILE`` (or ``-flagfile=FILE``) names, else None."""
    for prefix in ("--flagfile=", "-flagfile="):
        if arg.startswith(prefix):
            return arg[len(prefix) :]
    return None


def read_text(path: str, max_bytes: int) -> str:
    """The UTF-8 text of the regular file ``path``; ValueError saying why it is not that (a
    FIFO or a device is refused unread: one would block, the other never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise ValueError(f"cannot read: {err.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"larger than {max_bytes >> 20} MB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 text (byte {err.start})") from None
