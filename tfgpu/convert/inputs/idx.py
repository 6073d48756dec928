"""IDX files, MNIST's format (MNIST, Fashion-MNIST, KMNIST): a folder holding
``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte`` (or ``train-images.idx3-ubyte``),
gzipped or not, and optionally the same for ``t10k`` (or ``test``): the validation split.

A file is 0x00 0x00, a type code (0x08: uint8), the number of dimensions, each dimension a
big-endian int32, then the data. The header is read here and held to the file's size; no
more bytes are read than it claims (a gzip bomb stops there), nor allocated past memory.
"""

import gzip
import os
import re
import stat
import zlib

import numpy as np

from tfgpu.convert.inputs.arrays import Arrays, array_source, check_fits_memory, class_names_for
from tfgpu.errors import ConvertError
from tfgpu.convert.manifest import Source

_NAME = re.compile(r"(train|t10k|test)-(images[-.]idx3|labels[-.]idx1)-ubyte(\.gz)?")
_TYPES = {0x08: "uint8", 0x09: "int8", 0x0B: "int16", 0x0C: "int32", 0x0D: "float32"}
_GZIP_MAGIC = b"\x1f\x8b"


def is_idx_folder(path: str) -> bool:
    """True for a folder holding at least one IDX file named as MNIST's are."""
    return os.path.isdir(path) and bool(_listing(path))


def is_idx_name(name: str) -> bool:
    """True for a file name of MNIST's IDX files, e.g. ``t10k-labels-idx1-ubyte.gz``."""
    return bool(_NAME.fullmatch(name))


def _listing(folder: str) -> dict:
    """{(split, "images" | "labels"): [file names]} of the IDX files in ``folder``."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    found: dict = {}
    for name in names:
        match = _NAME.fullmatch(name)
        if match:
            key = (match[1], match[2][:6])
            found.setdefault(key, []).append(name)
    return found


def idx_source(folder: str, class_names: list, validation_fraction: float, seed: int) -> Source:
    """The IDX files in ``folder`` as a Source: ``train`` files, and ``t10k`` or ``test`` files
    as the validation split (else ``validation_fraction`` of train, seeded). Classes are
    ``class_names`` (--class_names; the labels must run 0..len-1), else "0".."top"."""
    folder = os.path.abspath(folder)
    listing = _listing(folder)
    tests = sorted({split for split, _ in listing if split != "train"})
    if len(tests) > 1:
        raise ConvertError(f"--input={folder} holds both t10k and test IDX files: keep one pair")
    splits = {}
    for split, origin in (("train", "train"), ("validation", (tests or ["t10k"])[0])):
        files = {kind: _pick(folder, listing, origin, kind) for kind in ("images", "labels")}
        if not any(files.values()) and split == "validation":
            continue
        missing = [kind for kind, name in files.items() if not name]
        if missing:
            raise ConvertError(
                f"--input={folder} has no {origin}-{missing[0]}-idx"
                f"{1 if missing[0] == 'labels' else 3}-ubyte[.gz] file (expected an images "
                "and a labels file per split)"
            )
        splits[split] = _read_pair(folder, files, origin)
    names = class_names_for(splits, class_names, "--class_names")
    return array_source("IDX", folder, splits, names, validation_fraction, seed)


def _pick(folder: str, listing: dict, split: str, kind: str) -> str:
    """The one file of ``split``'s ``kind``: an uncompressed copy beside its .gz (``gunzip
    -k``) is preferred; two spellings of one file (dash, dot) are ambiguous."""
    names = listing.get((split, kind), [])
    plain = [n for n in names if not n.endswith(".gz")]
    names = plain or names
    if len(names) > 1:
        raise ConvertError(f"--input={folder} holds {' and '.join(names)}: keep one")
    return names[0] if names else ""


def _read_pair(folder: str, files: dict, origin: str) -> Arrays:
    """The images and labels of one split, read and held to each other."""
    paths = {kind: os.path.join(folder, name) for kind, name in files.items()}
    images = read_idx(paths["images"], ndim=3)
    labels = read_idx(paths["labels"], ndim=1)
    if len(images) != len(labels):
        raise ConvertError(
            f"{paths['images']} holds {len(images)} images but {paths['labels']} holds "
            f"{len(labels)} labels"
        )
    if not min(images.shape[1:], default=0):
        raise ConvertError(f"{paths['images']}: images of {images.shape[1:]} pixels")
    return Arrays(images, labels.astype(np.int64), origin, paths["labels"])


def read_idx(path: str, ndim: int) -> np.ndarray:
    """The uint8 array of the IDX file ``path`` (gzipped or not), of ``ndim`` dimensions; a
    ConvertError naming the file for anything else (magic, type, a size its header does not
    claim, a gzip stream that is cut short or corrupt)."""
    gzipped = False
    try:
        with _open_regular(path) as raw:
            gzipped = raw.peek(2)[:2] == _GZIP_MAGIC
            with gzip.GzipFile(fileobj=raw) if gzipped else raw as f:
                dims = _read_header(f, path, ndim)
                count = int(np.prod(dims, dtype=object))
                check_fits_memory(count, f"{path}: its header ({_shape(dims)})")
                data = f.read(count + 1)
    except (OSError, EOFError, zlib.error) as err:
        reason = "cut short" if isinstance(err, EOFError) else getattr(err, "strerror", None) or err
        raise ConvertError(f"{path}: cannot read{' gzip' if gzipped else ''}: {reason}") from None
    claim = f"{_shape(dims)} = {count} bytes of pixels"
    if len(data) < count:
        raise ConvertError(f"{path} is cut short: its header says {claim}, it holds {len(data)}")
    if len(data) > count:
        raise ConvertError(f"{path} holds more bytes than its header says ({claim})")
    return np.frombuffer(data, np.uint8).reshape(dims)


def _read_header(f, path: str, ndim: int) -> list[int]:
    """The dimensions in the IDX header of ``f``, checked: magic, uint8, ``ndim`` dims."""
    head = f.read(4)
    if len(head) < 4 or head[:2] != b"\0\0":
        raise ConvertError(
            f"{path} is not an IDX file: it starts {head.hex(' ') or 'empty'}, expected "
            "00 00 08 0N (MNIST's IDX magic)"
        )
    code, found = head[2], head[3]
    if code != 0x08:
        raise ConvertError(
            f"{path}: IDX type code 0x{code:02X} ({_TYPES.get(code, 'unknown')}), expected "
            "0x08 (uint8)"
        )
    if found != ndim:
        raise ConvertError(f"{path}: {found} dimensions in its IDX header, expected {ndim}")
    raw = f.read(4 * ndim)
    if len(raw) < 4 * ndim:
        raise ConvertError(f"{path} is cut short inside its IDX header")
    dims = [int(d) for d in np.frombuffer(raw, ">i4")]
    if min(dims) < 0:
        raise ConvertError(f"{path}: negative dimension in its IDX header ({_shape(dims)})")
    return dims


def _shape(dims: list) -> str:
    return "x".join(map(str, dims))


def looks_like_idx(path: str) -> bool:
    """True for a regular file (gzipped or not) that starts as an IDX file does, whatever its
    name: two zero bytes, a known type code, 1 to 4 dimensions."""
    try:
        with _open_regular(path) as raw:
            gzipped = raw.peek(2)[:2] == _GZIP_MAGIC
            with gzip.GzipFile(fileobj=raw) if gzipped else raw as f:
                head = f.read(4)
    except (ConvertError, OSError, EOFError, zlib.error):
        return False
    return len(head) == 4 and head[:2] == b"\0\0" and head[2] in _TYPES and 1 <= head[3] <= 4


def _open_regular(path: str):
    """``path`` opened for buffered binary reading if it is a regular file (a FIFO would
    block, a device never end); a ConvertError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise ConvertError(f"{path}: cannot read: {err.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConvertError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")
