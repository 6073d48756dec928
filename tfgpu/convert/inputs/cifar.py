"""CIFAR's python batches: the folder ``cifar-10-batches-py`` (``data_batch_1`` .. ``_5``,
``test_batch``, ``batches.meta`` with ``label_names``) or ``cifar-100-python`` (``train``,
``test``, ``meta`` with ``fine_label_names``; the fine labels are used).

They are Python pickles, and unpickling can run any code the file names. They are read by an
Unpickler that resolves exactly the globals a numpy array needs (``_reconstruct``, ``ndarray``,
``dtype``) and refuses every other one, so a planted ``os.system`` is named, never called.
Rows are 3072 bytes, channel-first (3 x 32 x 32): stored as 32 x 32 x 3.
"""

import os
import pickle
import re
import stat
from dataclasses import dataclass

import numpy as np

from tfgpu.convert.inputs.arrays import Arrays, array_source, check_fits_memory, class_names_for
from tfgpu.errors import ConvertError
from tfgpu.convert.manifest import Source

# What numpy itself pickles an array as (numpy 1.x: numpy.core.multiarray, 2.x: numpy._core).
_RECONSTRUCT = np.ndarray((0,), np.uint8).__reduce__()[0]
_ROW = 3 * 32 * 32


@dataclass(frozen=True)
class _Layout:
    kind: str
    meta: str
    names_key: str
    labels_key: str
    test: str


_CIFAR10 = _Layout("CIFAR-10", "batches.meta", "label_names", "labels", "test_batch")
_CIFAR100 = _Layout("CIFAR-100", "meta", "fine_label_names", "fine_labels", "test")


def _train_batches(folder: str, layout: _Layout) -> list[str]:
    if layout is _CIFAR100:
        return ["train"]
    names = [n for n in os.listdir(folder) if re.fullmatch(r"data_batch_\d+", n)]
    return sorted(names, key=lambda n: int(n.rsplit("_", 1)[1]))


def cifar_layout(path: str):
    """The layout of a CIFAR python folder at ``path``, else None: CIFAR-10's by its
    ``batches.meta``, CIFAR-100's by ``meta`` and ``train`` (names too common to go alone)."""
    if not os.path.isdir(path):
        return None
    if os.path.exists(os.path.join(path, _CIFAR10.meta)):
        return _CIFAR10
    if all(os.path.exists(os.path.join(path, n)) for n in (_CIFAR100.meta, "train")):
        return _CIFAR100
    return None


def cifar_source(folder: str, validation_fraction: float, seed: int) -> Source:
    """The CIFAR-10 or CIFAR-100 python folder ``folder`` as a Source: the training batches,
    and the test batch as the validation split (else ``validation_fraction`` of train).
    Class names come from the meta file."""
    folder = os.path.abspath(folder)
    layout = cifar_layout(folder)
    if layout is None:
        raise ConvertError(f"--input={folder} is not a CIFAR python folder")
    meta_path = os.path.join(folder, layout.meta)
    names = _names(load_pickle(meta_path), meta_path, layout.names_key)
    batches = [_batch(folder, b, layout) for b in _train_batches(folder, layout)]
    if not batches:
        raise ConvertError(f"--input={folder} holds {layout.meta} but no data_batch_N files")
    splits = {
        "train": Arrays(
            np.concatenate([b.images for b in batches]),
            np.concatenate([b.labels for b in batches]),
            "train",
            ", ".join(b.labels_file for b in batches),
            sum((b.filenames for b in batches), ()),
        )
    }
    if os.path.exists(os.path.join(folder, layout.test)):
        splits["validation"] = _batch(folder, layout.test, layout)
    classes = class_names_for(splits, names, os.path.basename(meta_path))
    return array_source(layout.kind, folder, splits, classes, validation_fraction, seed)


def _names(meta, path: str, key: str) -> list[str]:
    names = _get(meta, key)
    if not isinstance(names, list) or not all(isinstance(n, (bytes, str)) for n in names):
        raise ConvertError(f"{path}: expected a dict with a list {key} (the class names)")
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in names]


def _batch(folder: str, name: str, layout: _Layout) -> Arrays:
    """One batch file: its rows as HWC uint8 images, its labels, its records' file names."""
    path = os.path.join(folder, name)
    batch = load_pickle(path)
    data, labels = _get(batch, "data"), _get(batch, layout.labels_key)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise ConvertError(f"{path}: expected a dict whose data is a uint8 (N, {_ROW}) array")
    if data.shape[1] != _ROW:
        raise ConvertError(f"{path}: rows of {data.shape[1]} bytes, expected {_ROW} (3x32x32)")
    labels = _labels(labels, len(data), path, layout.labels_key)
    images = np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    files = _get(batch, "filenames")
    if isinstance(files, list) and len(files) == len(data):
        filenames = tuple(f"{name}/{_text(f)}" for f in files)
    else:
        filenames = tuple(f"{name}[{i}]" for i in range(len(data)))
    return Arrays(images, labels, name, path, filenames)


def _labels(labels, n: int, path: str, key: str) -> np.ndarray:
    if isinstance(labels, list) and all(type(v) is int for v in labels):
        labels = np.array(labels, dtype=np.int64)
    if not isinstance(labels, np.ndarray) or labels.dtype.kind not in "iu" or labels.shape != (n,):
        raise ConvertError(f"{path}: expected {key}, a list of {n} integer labels")
    return labels.astype(np.int64)


def _get(d, key: str):
    """``d[key]``: CIFAR's pickles (Python 2) have bytes keys, re-pickled ones str keys."""
    if not isinstance(d, dict):
        return None
    return d.get(key.encode(), d.get(key))


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _Refused(Exception):
    """A global the pickle names that is not allowed; the message names it."""


class _ArrayType:
    """What the pickle gets for ``numpy.ndarray``: a token for ``_reconstruct``'s first
    argument, not the constructor (``ndarray((2**40,))`` would allocate a terabyte)."""

    def __call__(self, *args, **kwargs):
        raise _Refused("it calls numpy.ndarray itself, which an array's pickle never does")


_NDARRAY = _ArrayType()


def _reconstruct(cls, shape, dtype):
    """numpy's own ``_reconstruct``, as an array's pickle calls it: an empty array that the
    pickle's state then fills (checked by ``ndarray.__setstate__``). Anything else would
    allocate what the pickle asks."""
    if cls is not _NDARRAY or shape != (0,):
        raise _Refused("numpy's _reconstruct with other arguments than an array's pickle gives")
    return _RECONSTRUCT(np.ndarray, shape, dtype)


_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): np.dtype,
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            shown = f"{module}.{name}".encode("unicode_escape").decode()[:80]
            raise _Refused(f"it names {shown}, which a CIFAR batch never does")
        return allowed

    def persistent_load(self, pid):
        raise _Refused("it holds a persistent reference")


def load_pickle(path: str):
    """The object the CIFAR pickle ``path`` holds, read by the restricted Unpickler (bytes
    keys, as Python 2 wrote them); a ConvertError naming the file for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise ConvertError(f"{path}: cannot read: {err.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ConvertError(f"{path} is not a regular file")
    check_fits_memory(info.st_size, path)
    with os.fdopen(fd, "rb") as f:
        try:
            return _Unpickler(f, encoding="bytes").load()
        except _Refused as err:
            raise ConvertError(f"{path}: refused, not unpickled: {err}") from None
        except Exception as err:  # noqa: BLE001 - unpickling garbage raises many types
            first = (str(err).splitlines() or [""])[0][:120]
            raise ConvertError(
                f"{path} is not a readable CIFAR pickle: {type(err).__name__}: {first}"
            ) from None
