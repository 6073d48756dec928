"""What the duplicate check keeps of each image, computed by the converter's workers as they
decode it: an exact key, a perceptual hash of the image and of its mirror, a 16x16 thumbnail.

- exact key: xxHash's XXH3 (64 bits) of the decoded pixels, seeded by their mode and size;
  for a JPEG the converter stores as it is (and so decodes at 1/8 scale only, ``encode.py``),
  of its image data without the metadata segments (APPn, COM) that lead it: equal data decodes to
  equal pixels, and the full decode it would take costs more than the rest of the
  conversion. XXH3, not a cryptographic digest: SHA-1 of an 87 KB JPEG takes 52 us, XXH3 2;
  two of ImageNet's 1.28M distinct images share a key with probability ~4e-8. Neither is a
  defence against collisions made on purpose, and the check claims none.
- pHash: imagehash's ``phash`` (a 32x32 grayscale thumbnail, its 2-D DCT-II, the 8x8 lowest
  frequencies thresholded at their median: 64 bits), computed in numpy for a whole shard
  at once (the products in ``columns.py``): a 32x32 DCT is two small matrix products, and
  imagehash's call per image (scipy's FFT twice, a PIL resize) would cost about as much as
  the rest of converting a small image (tests compare both on the same thumbnails). The
  thumbnail is an area average (PIL's ``reduce`` for large images, then a matrix product),
  where imagehash takes Lanczos.
- mirror pHash: the pHash of the horizontally flipped image, from the same coefficients (a
  flip negates the odd horizontal frequencies of a DCT-II), so flipped copies are found too.
- thumbnail: 16x16 grayscale, uint8, which confirms a perceptual match (``duplicates.py``).

No TensorFlow (workers stay light).
"""

import functools
import itertools
import os
import stat
from array import array

import numpy as np
import xxhash
from PIL import Image

from tfgpu.convert import columns
from tfgpu.files import replacing

KEY = "xxh3-64"  # the exact key's kind, kept in done markers (a resumed run checks it)
DRAFT_SIDE = 32  # a JPEG's draft keeps at least this many pixels a side (``draft_size``)
_JPEG_METADATA = set(range(0xE0, 0xF0)) | {0xFE}  # APP0..APP15, COM
_CHUNK = 4096  # rows hashed at once (``hashes``)


def exact_key(image: Image.Image) -> int:
    """The exact key of a decoded image: its mode, size and pixels."""
    return _key(image.mode, image.size, image.tobytes())


def _key(mode: str, size: tuple, pixels) -> int:
    return xxhash.xxh3_64_intdigest(pixels, seed=_seed(mode, size))


def _pixels(array: np.ndarray):
    """``array``'s bytes in row-major order: its own buffer when it is contiguous."""
    return array.data if array.flags.c_contiguous else array.tobytes()


def _contiguous(array: np.ndarray):
    """``array`` itself when its bytes are in row-major order (xxhash reads its buffer),
    else a copy of them."""
    return array if array.flags.c_contiguous else array.tobytes()


@functools.lru_cache(maxsize=64)
def _seed(mode: str, size: tuple) -> int:
    """The hash's seed for images of ``mode`` and ``size``: equal pixels in another shape
    get another key."""
    return xxhash.xxh3_64_intdigest(f"{mode}{size}".encode())


_JPEG_SEED = xxhash.xxh3_64_intdigest(b"JPEG")


def jpeg_key(data: bytes) -> int:
    """The exact key of JPEG bytes stored as they are: of their image data, from the first
    segment after the metadata (APPn, COM) that follows the start marker; the whole of
    ``data`` when its markers do not parse. Metadata written later (rare) stays in: such
    copies are then found as near, not exact, duplicates."""
    view, at = memoryview(data), 2
    while at + 4 <= len(data) and data[at] == 0xFF and data[at + 1] in _JPEG_METADATA:
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    start = at if at + 2 <= len(data) and data[at] == 0xFF else 0
    return xxhash.xxh3_64_intdigest(view[start:], seed=_JPEG_SEED)


def draft_size(width: int, height: int) -> tuple:
    """The size to ask a JPEG's draft for (PIL's ``draft``: libjpeg scales by 1/1, 1/2, 1/4
    or 1/8): the strongest reduction that leaves DRAFT_SIDE pixels on the shorter side. A 1/8 draft
    of a 100 px JPEG is 13 px, each pixel one 8x8 block, the blocks laid from the corner: a
    copy resized or cropped by a few pixels has its blocks over other parts of the picture,
    and its thumbnail drifts by more than the check allows (none of them was found)."""
    scale = next((s for s in (8, 4, 2) if min(width, height) // s >= DRAFT_SIDE), 1)
    return max(1, width // scale), max(1, height // scale)


def view(image: Image.Image, step: int = 1) -> tuple:
    """What a 32x32 thumbnail is made from (``thumbnails``): (the image's grayscale pixels,
    uint8 2-D, each standing for ``step`` x ``step`` pixels of the original, a JPEG draft's
    8, the last ones for what is left; the original's (height, width), from
    ``image.info["size"]`` for a draft; the step)."""
    full = image.info.get("size", image.size) if step > 1 else image.size
    gray = image if image.mode == "L" else image.convert("L")
    factor = min(gray.size) // (2 * columns.THUMB)
    if factor > 1:  # PIL's box reduction in C first: a large photo costs ~1 ms less
        gray, step = gray.reduce(factor), step * factor
    return np.asarray(gray), tuple(full[::-1]), step


def of_array(array: np.ndarray, image: Image.Image) -> tuple:
    """(exact key, view) of ``image``, the PIL image made of the uint8 ``array`` (H x W or
    H x W x C), from the array where that is cheaper than PIL's copy of its pixels: a small
    grayscale array is its own view, and its key (None here) is made with its shard's
    others (``Collector``); a large one is reduced first, as ``view`` does."""
    if array.ndim == 2 and min(array.shape) < 4 * columns.THUMB:
        return None, (array, array.shape, 1)
    return _key(image.mode, image.size, _pixels(array)), view(image)


class Collector:
    """A shard's fingerprints, gathered as its records are written: each record's exact
    key, view, label, short-side bucket and file name, appended to a list or an array of
    each, and sorted into the views' kinds (gray shape, original size, step) only when the
    shard is done (``record``). Done per image, among the encoding of others, the sorting
    cost a conversion of 70,000 small images ~0.1 CPU s more than done at once at the end,
    its objects fetched from memory each time. A view's size and step are kept as numbers,
    not as its tuples: two tuples kept per image made Python's cycle collector run three
    times as often during a conversion, and once more over all of its objects (~0.1 CPU s
    for 70,000 small images, the source's items among them)."""

    def __init__(self):
        self.keys: list = []
        self.grays: list = []
        self.sizes = array("q")  # each view's original height, width and step in turn
        self.labels, self.sides = array("q"), array("q")
        self.files: list = []

    def add(self, key: int | None, view: tuple, label: int, file: str, side: int) -> None:
        """One record: ``key`` None for a view that is its whole grayscale image (a small
        array's, ``of_array``): its key is made from the kind's pixels, in ``record``."""
        gray, (height, width), step = view
        self.keys.append(key)
        self.grays.append(gray)
        self.sizes.extend((height, width, step))
        self.labels.append(label)
        self.sides.append(side)
        self.files.append(file)

    def record(self) -> dict:
        """The shard's check record (``shard_record``); the collector's last use."""
        kinds = self._arrays()
        given = self.keys
        none = given.count(None) == len(given)  # a shard of small arrays: no key given
        keys = np.array([0] * len(given) if none else [k or 0 for k in given], np.uint64)
        for (shape, _, _), (grays, members) in kinds.items():
            # Whole grayscale images (``of_array``): each one's key is that of its pixels.
            if none:
                keys[members] = _keys(grays, _seed("L", shape[::-1]))
                continue
            unkeyed = [at for at, i in enumerate(members.tolist()) if given[i] is None]
            if unkeyed:
                found = _keys([grays[at] for at in unkeyed], _seed("L", shape[::-1]))
                keys[members[unkeyed]] = found
        return _record(keys, kinds, self.labels, self.files, self.sides)

    def _arrays(self) -> dict:
        """{kind: (its grays, a list of (h, w) uint8 arrays, their records' indices)}, the
        kinds in the order of their first record."""
        grays = self.grays
        n = len(grays)
        # The shapes through an iterator: a list of their tuples would bring the collector
        # back (``Collector``).
        shapes = itertools.chain.from_iterable(gray.shape for gray in grays)
        rows = np.empty((n, 5), np.int64)
        rows[:, :2] = np.fromiter(shapes, np.int64, 2 * n).reshape(n, 2)
        rows[:, 2:] = np.frombuffer(self.sizes, np.int64).reshape(n, 3)
        if n and (rows == rows[0]).all():  # most shards: one kind, its grays the list as is
            return {_kind(rows[0]): (grays, np.arange(n))}
        kinds, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        order = np.argsort(inverse.reshape(-1), kind="stable")
        members = np.split(order, np.cumsum(np.bincount(inverse.reshape(-1)))[:-1])
        return {
            _kind(kinds[k]): ([grays[i] for i in members[k].tolist()], members[k])
            for k in np.argsort(first)
        }


def _keys(grays: list, seed: int) -> np.ndarray:
    """The keys (uint64) of 2-D uint8 arrays of one shape, from their pixels (``_key``'s),
    each hashed from its own buffer where its bytes are in row-major order."""
    digest = xxhash.xxh3_64_intdigest
    try:
        return np.array([digest(gray, seed=seed) for gray in grays], np.uint64)
    except ValueError:  # one of them strided (xxhash reads contiguous buffers only)
        return np.array([digest(_contiguous(gray), seed=seed) for gray in grays], np.uint64)


def _kind(row: np.ndarray) -> tuple:
    """A view's kind, (gray shape, original size, step), from its row of five numbers."""
    height, width, full_height, full_width, step = row.tolist()
    return (height, width), (full_height, full_width), step


def summaries(views: list) -> tuple[np.ndarray, np.ndarray]:
    """(the pHash's 8x8 DCT coefficients (N, 64) float32, the 16x16 uint8 thumbnails) of
    ``views``, as ``phashes`` and ``small`` would make them of ``thumbnails``."""
    collector = Collector()
    for view in views:
        collector.add(0, view, 0, "", 0)
    return columns.summaries(collector._arrays(), len(views))


def thumbnail(image: Image.Image, step: int = 1) -> np.ndarray:
    """The 32x32 float32 thumbnail of one PIL image (``view``, ``thumbnails``)."""
    return columns.thumbnails([view(image, step)])[0]


def phashes(thumbs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pHash, mirror pHash) as uint64 arrays for thumbnails (N, 32, 32); bit 63 is the DC
    coefficient's, in imagehash's row-major order."""
    dct = columns.dct_rows()
    # The stack times a matrix first: numpy makes that one product, not one per thumbnail.
    return hashes((dct @ (thumbs.astype(np.float64) @ dct.T)).reshape(len(thumbs), 64))


def hashes(coeffs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pHash, mirror pHash) of 8x8 DCT coefficients (N, 64): a flip negates the odd
    horizontal frequencies."""
    # In the coefficients' own type (exact): float32 ones sort in half float64's memory.
    signs = np.tile((-1.0) ** np.arange(8), 8).astype(coeffs.dtype)
    direct, mirror = np.empty(len(coeffs), np.uint64), np.empty(len(coeffs), np.uint64)
    # A chunk at a time: its copies and sorts reuse memory, where the shard's whole (five
    # times the coefficients) would be new pages each shard (~0.03 CPU s a 60,000 shard).
    for start in range(0, len(coeffs), _CHUNK):
        part = coeffs[start : start + _CHUNK]
        direct[start : start + len(part)] = _bits(part)
        mirror[start : start + len(part)] = _bits(part * signs)
    return direct, mirror


def _bits(coeffs: np.ndarray) -> np.ndarray:
    ordered = np.sort(coeffs, axis=1)  # numpy's median of 64 numbers a row: 10x slower
    # The median in float64 whatever the type: imagehash's (``phashes``' coefficients).
    median = (ordered[:, 31:32].astype(np.float64) + ordered[:, 32:33]) / 2
    above = coeffs > median
    return np.packbits(above, axis=1).view(">u8").reshape(-1).astype(np.uint64)


def small(thumbs: np.ndarray) -> np.ndarray:
    """16x16 uint8 thumbnails (N, 16, 16) from 32x32 ones: the mean of each 2x2 block."""
    n = len(thumbs)
    blocks = thumbs.reshape(n, columns.SMALL, 2, columns.SMALL, 2).mean(axis=(2, 4))
    return np.clip(np.rint(blocks), 0, 255).astype(np.uint8)


def shard_record(keys: list, views: list, labels: list, files: list, sides: list) -> dict:
    """What the check keeps of a shard (``Collector`` gathers it as the shard is written):
    its records' exact keys (None: made of the view, ``of_array``), pHashes and mirror
    pHashes (uint64), 16x16 thumbnails (uint8, made of their ``views``), labels,
    short-side buckets (int64) and file names, in record order, with the key's kind."""
    collector = Collector()
    for record in zip(keys, views, labels, files, sides):
        collector.add(*record)
    return collector.record()


def _record(keys, kinds: dict, labels, files, sides) -> dict:
    coeffs, smalls = columns.summaries(kinds, len(keys))
    direct, mirror = hashes(coeffs)
    return {
        "key": KEY,
        "exact": np.asarray(keys, dtype=np.uint64),
        "phash": direct,
        "mirror": mirror,
        "thumbs": smalls,
        "labels": np.asarray(labels, dtype=np.int64),
        "sides": np.asarray(sides, dtype=np.int64),
        "files": list(files),
    }


# The record's arrays, stored as the fields of one structured array (no zip, no CRC).
_FIELDS = np.dtype(
    [
        ("exact", "<u8"),
        ("phash", "<u8"),
        ("mirror", "<u8"),
        ("thumbs", "u1", (columns.SMALL, columns.SMALL)),
        ("labels", "<i8"),
        ("sides", "<i8"),
    ]
)


def save(path: str, record: dict) -> dict:
    """Writes ``record``'s arrays to ``path`` (.npy, atomically) and returns the rest: what
    a done marker keeps in its JSON (arrays in JSON cost the converter's worker ~30% of
    the check's time, in base64 and in json's escaping of it)."""
    table = np.empty(len(record["files"]), _FIELDS)
    for name in _FIELDS.names:
        table[name] = record[name]
    with replacing(path) as f:
        np.save(f, table)
    return {k: v for k, v in record.items() if k not in _FIELDS.names}


def load(path: str, rest: dict) -> dict | None:
    """The record ``save`` split into ``path`` and ``rest``, or None when the file is
    missing, damaged, not a regular file, of another length than ``rest["files"]``, or its
    keys of another kind (an older tfgpu's): the shard is then written again."""
    if rest.get("key") != KEY:
        return None
    n = len(rest.get("files", ()))
    try:
        # Non-blocking, and regular files only: a FIFO planted there would block for ever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(fd)
            # No more than n records and a header (a few hundred bytes): nothing huge is read.
            if not stat.S_ISREG(info.st_mode) or info.st_size > n * _FIELDS.itemsize + 4096:
                return None
            table = np.load(f, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if table.dtype != _FIELDS or table.shape != (n,):
        return None
    return {**rest, **{name: table[name] for name in _FIELDS.names}}
