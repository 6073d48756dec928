"""What the array inputs (IDX, ``.npz``, CIFAR's python batches) share: ``--class_names``, the
labels checked against the class names, the validation split, and a Source of raw pixels.

These formats hold whole uint8 arrays, read into memory by the parent (Fashion-MNIST: 55 MB):
each Item is one row, a view, which the workers encode (PNG by default: ``Source.raw_pixels``).
"""

import hashlib
import os
from collections import Counter
from dataclasses import dataclass

import numpy as np

from tfgpu.errors import ConvertError
from tfgpu.convert.manifest import MAX_CLASSES, Item, Source, split_items
from tfgpu.files import read_text

_MAX_NAMES_FILE_BYTES = 16 << 20


@dataclass(frozen=True)
class Arrays:
    """One split as read: uint8 images (N, H, W[, C]), int64 labels (N,), where it came from
    (``t10k``, ``x_test``: the summary says "t10k -> validation"), the file its labels came
    from (named by label errors), and its records' file names (default ``name[i]``)."""

    images: np.ndarray
    labels: np.ndarray
    name: str
    labels_file: str
    filenames: tuple = ()


def parse_class_names(value: str) -> list[str]:
    """``--class_names``: the path of a text file with one name per line (blank lines ignored),
    else comma-separated names; [] for ''. Names are stripped; an empty or repeated name is a
    ConvertError (two classes of one name would share a label in dataset_info.json)."""
    if not value:
        return []
    path = os.path.expanduser(value)
    if os.path.exists(path):
        try:
            lines = read_text(path, _MAX_NAMES_FILE_BYTES).splitlines()
        except ValueError as err:
            raise ConvertError(f"--class_names={value}: {err}") from None
        names = [line.strip() for line in lines if line.strip()]
    else:
        names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise ConvertError(f"--class_names={value!r}: an empty name (expected name,name,...)")
    repeated = [name for name, n in Counter(names).items() if n > 1]
    if repeated:
        raise ConvertError(f"--class_names: {repeated[0]!r} is given more than once")
    return names


def check_fits_memory(nbytes: int, what: str) -> None:
    """Refuses an array of ``nbytes`` (a header's claim) over half this machine's memory: a
    few hostile bytes of header must not make the converter allocate terabytes."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = 1 << 36  # no sysconf: assume 64 GB
    if nbytes > total // 2:
        raise ConvertError(
            f"{what} claims {nbytes / 2**30:.1f} GB, more than half this machine's memory "
            f"({total / 2**30:.1f} GB)"
        )


def class_names_for(splits: dict, given: list, flag: str) -> list[str]:
    """The class names of ``splits`` ({split: Arrays}): ``given`` (from ``flag``: the labels
    must run 0..len-1, the top one used) or, when ``given`` is empty, "0".."top"."""
    top, where = -1, ""
    for arrays in splits.values():
        if not arrays.labels.size:
            raise ConvertError(f"{arrays.labels_file} holds no images")
        if int(arrays.labels.min()) < 0:
            raise ConvertError(f"{arrays.labels_file}: negative label {arrays.labels.min()}")
        if int(arrays.labels.max()) > top:
            top, where = int(arrays.labels.max()), arrays.labels_file
    if given and flag == "--class_names" and len(given) != top + 1:
        raise ConvertError(
            f"--class_names gives {len(given)} names, but the labels of {where} run 0..{top} "
            f"({top + 1} classes)"
        )
    if given and top >= len(given):
        raise ConvertError(f"{where}: label {top}, but {flag} names only {len(given)} classes")
    if top >= MAX_CLASSES:
        raise ConvertError(
            f"{where}: label {top}: expected class indices below {MAX_CLASSES} (or --class_names)"
        )
    return list(given) or [str(i) for i in range(top + 1)]


def array_source(
    kind: str, where: str, splits: dict, names: list, validation_fraction: float, seed: int
) -> Source:
    """A Source of ``splits`` ({"train"[, "validation"]: Arrays}), classes ``names``: without
    a validation split, ``validation_fraction`` of each class of train (seeded). ``kind`` and
    ``where`` describe the input; the description ends with a digest of the arrays, so that a
    changed input is another conversion, not a resume of this one."""
    items = {s: _items(a) for s, a in splits.items()}
    if "validation" not in items:
        items["train"], items["validation"] = split_items(items["train"], validation_fraction, seed)
    items = {s: listed for s, listed in items.items() if listed}
    if "train" not in items:
        raise ConvertError(f"--input={where} holds no training images")
    row_bytes = int(np.prod(splits["train"].images.shape[1:]))
    sizes = {s: len(listed) * row_bytes for s, listed in items.items()}  # PNG: at most raw size
    digest = hashlib.sha256()
    for arrays in splits.values():
        digest.update(np.ascontiguousarray(arrays.images).data)
        digest.update(arrays.labels.astype("<i8").tobytes())
    description = f"{kind} {where} (sha256 {digest.hexdigest()[:16]})"
    note = f"{splits['validation'].name} -> validation" if "validation" in splits else ""
    return Source(description, names, items, sizes, raw_pixels=True, note=note)


def _items(arrays: Arrays) -> list[Item]:
    images, labels, name = arrays.images, arrays.labels, arrays.name
    files = arrays.filenames or [f"{name}[{i}]" for i in range(len(labels))]
    return [Item(images[i], int(labels[i]), files[i]) for i in range(len(labels))]
