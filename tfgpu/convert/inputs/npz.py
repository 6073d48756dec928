"""NumPy ``.npz`` archives in keras.datasets' layout: ``x_train`` uint8 (N, H, W[, C]) and
``y_train`` integer labels (N,) or (N, 1), with ``x_test`` and ``y_test`` (the validation
split) optional. Loaded with ``allow_pickle=False``: object arrays are refused, never
unpickled (unpickling runs whatever code the data names)."""

import os
import stat
import zipfile
import zlib

import numpy as np

from tfgpu.convert.inputs.arrays import Arrays, array_source, check_fits_memory, class_names_for
from tfgpu.errors import ConvertError
from tfgpu.convert.manifest import Source

_ZIP_MAGIC = b"PK\x03\x04"
_EMPTY_ZIP = b"PK\x05\x06"
_PICKLE_PROTOCOLS = range(2, 6)  # a pickle starts 0x80 <protocol>
_KEYS = {"train": ("x_train", "y_train"), "validation": ("x_test", "y_test")}


def is_npz(path: str) -> bool:
    """True for a regular file named ``*.npz`` or starting as a zip archive does."""
    if path.endswith(".npz") and os.path.isfile(path):
        return True
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False  # a FIFO would block the read below
        with open(path, "rb") as f:
            return f.read(4) in (_ZIP_MAGIC, _EMPTY_ZIP)
    except OSError:
        return False


def npz_source(path: str, class_names: list, validation_fraction: float, seed: int) -> Source:
    """The arrays of the ``.npz`` file ``path`` as a Source: ``x_train``/``y_train``, and
    ``x_test``/``y_test`` as the validation split (else ``validation_fraction`` of train,
    seeded). Classes are ``class_names`` (--class_names), else "0".."top"."""
    path = os.path.abspath(path)
    _check_zip(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            keys = set(archive.files)
            splits = {
                split: _split(archive, path, x, y)
                for split, (x, y) in _KEYS.items()
                if split == "train" or {x, y} & keys
            }
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        raise ConvertError(f"--input={path} is not a readable .npz archive: {err}") from None
    names = class_names_for(splits, class_names, "--class_names")
    return array_source(".npz", path, splits, names, validation_fraction, seed)


def _check_zip(path: str) -> None:
    """Refuses a file that is not a zip archive before numpy sees it: numpy would take a
    pickle (``pickle.dump`` of a dict, named .npz) for one, and refuse it in other words."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        raise ConvertError(f"--input={path}: cannot read: {err.strerror}") from None
    if len(head) >= 2 and head[0] == 0x80 and head[1] in _PICKLE_PROTOCOLS:
        raise ConvertError(
            f"--input={path} is a Python pickle, not an .npz archive: refused, never unpickled "
            "(save the arrays with numpy.savez)"
        )
    if head not in (_ZIP_MAGIC, _EMPTY_ZIP):
        raise ConvertError(
            f"--input={path} is not an .npz archive (a zip of .npy arrays): it starts "
            f"{head.hex(' ') or 'empty'}"
        )


def _split(archive, path: str, x_key: str, y_key: str) -> Arrays:
    """One split's arrays, their headers checked before they are read."""
    for key in (x_key, y_key):
        if key not in archive.files:
            found = ", ".join(sorted(archive.files)) or "no arrays"
            raise ConvertError(
                f"--input={path} has no array {key} (it holds {found}; expected x_train, "
                "y_train and optionally x_test, y_test, as keras.datasets saves them)"
            )
    images, labels = (_load(archive, path, key) for key in (x_key, y_key))
    if images.dtype != np.uint8 or not (
        images.ndim == 3 or images.ndim == 4 and images.shape[3] in (1, 3)
    ):
        raise ConvertError(
            f"--input={path}: {x_key} is {images.dtype} {images.shape}, expected uint8 "
            "(N, H, W) or (N, H, W, C) with C 1 or 3"
        )
    if not min(images.shape[1:3]):
        raise ConvertError(f"--input={path}: {x_key} holds images of {images.shape[1:3]} pixels")
    if labels.ndim == 2 and labels.shape[1:] == (1,):
        labels = labels[:, 0]  # CIFAR's keras arrays: (N, 1)
    if labels.dtype.kind not in "iu" or labels.shape != images.shape[:1]:
        raise ConvertError(
            f"--input={path}: {y_key} is {labels.dtype} {labels.shape}, expected "
            f"{images.shape[0]} integer labels ({x_key} holds {images.shape[0]} images)"
        )
    return Arrays(images, labels.astype(np.int64), x_key, f"{path} ({y_key})")


def _load(archive, path: str, key: str) -> np.ndarray:
    """``archive[key]``, once its .npy header says it is no object array and its claimed size
    fits both the member's size and this machine's memory."""
    with archive.zip.open(f"{key}.npy") as member:
        version = np.lib.format.read_magic(member)
        read = np.lib.format.read_array_header_1_0
        if version != (1, 0):
            read = np.lib.format.read_array_header_2_0
        shape, _, dtype = read(member)
    if dtype.hasobject:
        raise ConvertError(
            f"--input={path}: {key} holds Python objects (a pickle): refused, never unpickled "
            "(save plain numeric arrays)"
        )
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes > archive.zip.getinfo(f"{key}.npy").file_size:
        raise ConvertError(f"--input={path}: {key}'s header claims {shape}, more than it holds")
    check_fits_memory(nbytes, f"--input={path}: {key}")
    return archive[key]
