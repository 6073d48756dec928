"""``--overwrite`` of a finished dataset: the new one is written beside it and swapped in
only once it is complete, so an interrupted or failed re-run leaves the old one as it was.

The new dataset goes to a hidden sibling folder of ``--output_dir`` (same parent, so same
file system: a rename moves it), ``.<name>.to_tfrecord-new``; a re-run with the same inputs
and flags resumes there as a plain run resumes in place. At the end the two folders are
exchanged in one atomic ``renameat2(RENAME_EXCHANGE)`` (Linux), else by two renames; what
the user kept in ``--output_dir`` besides the dataset (notes, logs) moves into the new folder,
and the old dataset is deleted. When the parent is not writable, or ``--output_dir`` cannot
be renamed (a mount point), the new dataset is written to ``--output_dir/.to_tfrecord-new``
and its files are renamed in one by one, ``dataset_info.json`` last: the old dataset then
stops claiming to be whole (its info file goes first) only once the new one is complete.
"""

import ctypes
import os
import re
import shutil
import stat

from tfgpu.errors import ConvertError
from tfgpu.data.recordformat import INFO_FILE, QUALITY_FILE

PLAN_FILE = ".to_tfrecord-plan.json"
# Everything a conversion may leave in --output_dir; --overwrite removes these and only these.
_OWN_FILE = re.compile(r"^\.?[\w.]+-\d{5}-of-\d{5}\.tfrecord(\.tmp|\.json|\.json\.tmp|\.npy)?$")
_INSIDE = ".to_tfrecord-new"  # the staging folder when no sibling can be made
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def is_own(name: str) -> bool:
    """True for a file name a conversion writes in its output folder."""
    return bool(_OWN_FILE.match(name)) or name.split(".tmp")[0] in (
        INFO_FILE,
        PLAN_FILE,
        QUALITY_FILE,
    )


def has_finished(output_dir: str) -> bool:
    """True when ``output_dir`` holds a finished dataset: its info file (written last), a
    regular file, not a symlink someone planted under that name."""
    try:
        return stat.S_ISREG(os.lstat(os.path.join(output_dir, INFO_FILE)).st_mode)
    except OSError:
        return False


def staging_dir(output_dir: str) -> str:
    """The folder (created if missing) where the dataset replacing ``output_dir``'s is
    written: its sibling, or a hidden folder inside it when the parent is not writable."""
    real = os.path.realpath(output_dir)
    parent, name = os.path.split(real)
    sibling = os.path.join(parent, f".{name}.to_tfrecord-new")
    for path in (sibling, os.path.join(real, _INSIDE)):
        try:
            os.makedirs(path, exist_ok=True)
            if not os.path.islink(path):
                return path
        except OSError:
            continue
    raise ConvertError(
        f"--output_dir={output_dir}: --overwrite writes the new dataset beside the old one "
        f"first, and neither {parent} nor {real} is writable"
    )


def swap_in(staging: str, output_dir: str) -> None:
    """Puts the complete dataset of ``staging`` in place of ``output_dir``'s (see the module
    docstring); the old dataset is deleted, the user's other files stay."""
    real = os.path.realpath(output_dir)
    if os.path.dirname(staging) == real or not _swap_folders(staging, real):
        _replace_files(staging, real)
        os.rmdir(staging)
        return
    old = staging  # the folders have changed places
    for name in os.listdir(old):
        if not is_own(name):
            os.rename(os.path.join(old, name), os.path.join(real, name))
    shutil.rmtree(old)  # never follows a symlink: it removes the link


def _swap_folders(a: str, b: str) -> bool:
    """Exchanges folders ``a`` and ``b`` (atomically where the kernel can); False when
    ``b`` cannot be renamed at all (a mount point, say), with nothing changed."""
    if _exchange(a, b):
        return True
    old = a + "-old"
    try:
        os.rename(b, old)
    except OSError:
        return False
    os.rename(a, b)
    os.rename(old, a)
    return True


def _exchange(a: str, b: str) -> bool:
    """``renameat2(a, b, RENAME_EXCHANGE)``; False where there is none (not Linux, an old
    kernel or C library, a file system without it)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    code = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return code == 0


def _replace_files(staging: str, output_dir: str) -> None:
    """Replaces ``output_dir``'s dataset by ``staging``'s, file by file: the old info file
    first (the old dataset is no longer whole), the new info file last (the new one is)."""
    os.unlink(os.path.join(output_dir, INFO_FILE))
    for name in os.listdir(output_dir):
        if is_own(name):
            os.unlink(os.path.join(output_dir, name))
    for name in sorted(os.listdir(staging), key=lambda n: n == INFO_FILE):
        os.rename(os.path.join(staging, name), os.path.join(output_dir, name))
