"""What the duplicate check keeps of each image, computed by the converter's workers as they
decode it: an exact key, a perceptual hash of the image and of its mirror, a 16x16 thumbnail.

- exact key: the first 8 bytes of SHA-1 over the decoded pixels (mode, size, bytes); for a
  JPEG the converter stores as it is (and so decodes at 1/8 scale only, ``worker.py``), over
  its image data with the metadata segments (APPn, COM) removed: equal data decodes to equal
  pixels, and the full decode it would take costs more than the rest of the conversion.
- pHash: imagehash's ``phash`` (a 32x32 grayscale thumbnail, its 2-D DCT-II, the 8x8 lowest
  frequencies thresholded at their median: 64 bits), computed here in numpy for a whole shard
  at once: a 32x32 DCT is two small matrix products, and imagehash's call per image (scipy's
  FFT twice, a PIL resize) would cost about as much as the rest of converting a small image
  (tests compare both on the same thumbnails). The thumbnail is an area average (PIL's
  ``reduce`` for large images, then a matrix product), where imagehash takes Lanczos.
- mirror pHash: the pHash of the horizontally flipped image, from the same coefficients (a
  flip negates the odd horizontal frequencies of a DCT-II), so flipped copies are found too.
- thumbnail: 16x16 grayscale, uint8, which confirms a perceptual match (``duplicates.py``).

No TensorFlow (workers stay light).
"""

import base64
import functools
import hashlib

import numpy as np
from PIL import Image

THUMB = 32  # the pHash's thumbnail side (imagehash: hash_size 8 x highfreq_factor 4)
SMALL = 16  # the stored thumbnail's side
_AT_ONCE = 2048  # images multiplied at once: their floats fit in a cache, not in new pages
_JPEG_METADATA = set(range(0xE0, 0xF0)) | {0xFE}  # APP0..APP15, COM


def exact_key(image: Image.Image) -> int:
    """The exact key of a decoded image: its mode, size and pixels."""
    return _key(image.mode, image.size, image.tobytes())


def _key(mode: str, size: tuple, pixels) -> int:
    digest = _prefix(mode, size).copy()
    digest.update(pixels)
    return int.from_bytes(digest.digest()[:8], "little")


def _gray_key(gray: np.ndarray) -> int:
    """``exact_key`` of the mode "L" image of the 2-D uint8 array ``gray``."""
    return _key("L", gray.shape[::-1], _pixels(gray))


def _pixels(array: np.ndarray):
    """``array``'s bytes in row-major order: its own buffer when it is contiguous."""
    return array.data if array.flags.c_contiguous else array.tobytes()


@functools.lru_cache(maxsize=64)
def _prefix(mode: str, size: tuple):
    return hashlib.sha1(f"{mode}{size}".encode())


def jpeg_key(data: bytes) -> int:
    """The exact key of JPEG bytes stored as they are: their image data, metadata removed."""
    digest = hashlib.sha1(b"JPEG")
    for part in _jpeg_image_parts(data):
        digest.update(part)
    return int.from_bytes(digest.digest()[:8], "little")


def _jpeg_image_parts(data: bytes):
    """The segments of a JPEG that make its pixels (tables, frame, scans), without APPn and
    COM; the whole of ``data`` when its markers do not parse."""
    view, at = memoryview(data), 2
    parts = []
    while at + 4 <= len(data) and data[at] == 0xFF:
        marker = data[at + 1]
        if marker == 0xDA:  # start of scan: the entropy-coded rest
            return parts + [view[at:]]
        end = at + 2 + int.from_bytes(data[at + 2 : at + 4], "big")
        if marker not in _JPEG_METADATA:
            parts.append(view[at:end])
        at = end
    return [view]


def view(image: Image.Image, step: int = 1) -> tuple:
    """What a 32x32 thumbnail is made from (``thumbnails``): (the image's grayscale pixels,
    uint8 2-D, each standing for ``step`` x ``step`` pixels of the original, a JPEG draft's
    8, the last ones for what is left; the original's (height, width), from
    ``image.info["size"]`` for a draft; the step)."""
    full = image.info.get("size", image.size) if step > 1 else image.size
    gray = image if image.mode == "L" else image.convert("L")
    factor = min(gray.size) // (2 * THUMB)
    if factor > 1:  # PIL's box reduction in C first: a large photo costs ~1 ms less
        gray, step = gray.reduce(factor), step * factor
    return np.asarray(gray), tuple(full[::-1]), step


def of_array(array: np.ndarray, image: Image.Image) -> tuple:
    """(exact key, view) of ``image``, the PIL image made of the uint8 ``array`` (H x W or
    H x W x C), from the array where that is cheaper than PIL's copy of its pixels: a small
    grayscale array is its own view, and its key (None here) is computed with the shard's
    others (``shard_record``); a large one is reduced first, as ``view`` does."""
    if array.ndim == 2 and min(array.shape) < 4 * THUMB:
        return None, (array, array.shape, 1)
    return _key(image.mode, image.size, _pixels(array)), view(image)


def thumbnails(views: list) -> np.ndarray:
    """The 32x32 float32 area-average thumbnails (N, 32, 32) of ``views`` (``view``)."""
    out = np.zeros((len(views), THUMB, THUMB), np.float32)
    for key, members in _same_sizes(views).items():
        rows, cols = (_area_matrix(size, full, key[2]) for size, full in zip(*key[:2]))
        # (N, h, w) @ (w, 32) first: numpy multiplies a stack by one matrix as one product
        out[members] = rows @ (_stack(views, members, np.float32) @ cols.T)
    return out


def summaries(views: list) -> tuple[np.ndarray, np.ndarray]:
    """(the pHash's 8x8 DCT coefficients (N, 64) float32, the 16x16 uint8 thumbnails) of
    ``views``, as ``phashes`` and ``small`` would make them of ``thumbnails``, without the
    32x32 thumbnails: their matrices are folded into the ones that make them, and each
    size's images are multiplied at once (over a shard of 28x28 images, a hundredth of
    what one call per image costs)."""
    coeffs = np.zeros((len(views), 64), np.float32)
    smalls = np.zeros((len(views), SMALL, SMALL), np.uint8)
    for key, same in _same_sizes(views).items():
        dct_rows, dct_cols, half_rows, half_cols = _folded(*key)
        for start in range(0, len(same), _AT_ONCE):
            members = same[start : start + _AT_ONCE]
            # float32: the coefficients' rounding (~1e-7 of them) flips no bit of a real
            # image's hash (tests: equal to ``phashes`` of the thumbnails, in float64)
            grays = _stack(views, members, np.float32)
            coeffs[members] = (dct_rows @ (grays @ dct_cols.T)).reshape(len(members), 64)
            blocks = half_rows @ (grays @ half_cols.T)
            smalls[members] = np.clip(np.rint(blocks), 0, 255).astype(np.uint8)
    return coeffs, smalls


def _same_sizes(views: list) -> dict:
    """{(gray shape, full size, step): indices of the ``views`` with those}."""
    sizes: dict = {}
    for i, (gray, full, step) in enumerate(views):
        sizes.setdefault((gray.shape, tuple(full), step), []).append(i)
    return sizes


def _stack(views: list, members: list, dtype) -> np.ndarray:
    return np.stack([views[i][0] for i in members]).astype(dtype)  # uint8 stacked: 1/4 the bytes


_HALF = np.kron(np.eye(SMALL), [0.5, 0.5])  # (16, 32): the mean of each pair


@functools.lru_cache(maxsize=256)
def _folded(shape: tuple, full: tuple, step: int) -> tuple:
    """(DCT rows x area rows, the same for columns, 2x2 means x area rows, columns) for
    images of ``shape`` standing for ``full`` at ``step``."""
    rows, cols = (_area_matrix(size, f, step).astype(np.float64) for size, f in zip(shape, full))
    return tuple(
        m.astype(np.float32)
        for m in (_dct_rows() @ rows, _dct_rows() @ cols, _HALF @ rows, _HALF @ cols)
    )


def thumbnail(image: Image.Image, step: int = 1) -> np.ndarray:
    """The 32x32 float32 thumbnail of one PIL image (``view``, ``thumbnails``)."""
    return thumbnails([view(image, step)])[0]


@functools.lru_cache(maxsize=256)
def _area_matrix(size: int, full: int, step: int) -> np.ndarray:
    """(THUMB, size): each output pixel the mean of the input it covers (area resampling),
    input pixel j covering [j * step, (j + 1) * step) of ``full`` original pixels: a block
    cut by the edge counts for what it covers, so a mirrored image gives the mirrored
    thumbnail whatever its size."""
    edges = np.arange(THUMB + 1) * (full / THUMB)
    starts, ends = edges[:-1, None], edges[1:, None]
    left = np.arange(size)[None, :] * step
    right = np.minimum(left + step, full)
    overlap = np.clip(np.minimum(ends, right) - np.maximum(starts, left), 0, None)
    return (overlap / np.maximum(overlap.sum(axis=1, keepdims=True), 1e-9)).astype(np.float32)


@functools.lru_cache(maxsize=1)
def _dct_rows() -> np.ndarray:
    """The first 8 rows of the unnormalized DCT-II matrix of size 32 (scipy's default)."""
    k, n = np.arange(8)[:, None], np.arange(THUMB)[None, :]
    return 2 * np.cos(np.pi * k * (2 * n + 1) / (2 * THUMB))


def phashes(thumbs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pHash, mirror pHash) as uint64 arrays for thumbnails (N, 32, 32); bit 63 is the DC
    coefficient's, in imagehash's row-major order."""
    dct = _dct_rows()
    # The stack times a matrix first: numpy makes that one product, not one per thumbnail.
    return hashes((dct @ (thumbs.astype(np.float64) @ dct.T)).reshape(len(thumbs), 64))


def hashes(coeffs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pHash, mirror pHash) of 8x8 DCT coefficients (N, 64): a flip negates the odd
    horizontal frequencies."""
    mirrored = coeffs * np.tile((-1.0) ** np.arange(8), 8)
    return _bits(coeffs), _bits(mirrored)


def _bits(coeffs: np.ndarray) -> np.ndarray:
    ordered = np.sort(coeffs, axis=1)  # numpy's median of 64 numbers a row: 10x slower
    above = coeffs > (ordered[:, 31:32] + ordered[:, 32:33]) / 2
    return np.packbits(above, axis=1).view(">u8").reshape(-1).astype(np.uint64)


def small(thumbs: np.ndarray) -> np.ndarray:
    """16x16 uint8 thumbnails (N, 16, 16) from 32x32 ones: the mean of each 2x2 block."""
    n = len(thumbs)
    blocks = thumbs.reshape(n, SMALL, 2, SMALL, 2).mean(axis=(2, 4))
    return np.clip(np.rint(blocks), 0, 255).astype(np.uint8)


def shard_record(keys: list, views: list, labels: list, files: list, sides: list) -> dict:
    """What a shard's done marker keeps for the check: its records' keys (None: that of a
    grayscale view, ``of_array``), hashes, thumbnails (made of their ``views``), labels, file
    names and short-side buckets, in record order (arrays base64-packed)."""
    keys = [_gray_key(v[0]) if k is None else k for k, v in zip(keys, views)]
    coeffs, smalls = summaries(views)
    direct, mirror = hashes(coeffs)
    return {
        "exact": pack(np.asarray(keys, dtype=np.uint64)),
        "phash": pack(direct),
        "mirror": pack(mirror),
        "thumbs": pack(smalls),
        "labels": labels,
        "files": files,
        "sides": sides,
    }


def unpack(record: dict) -> dict:
    """A shard's check record with its arrays back: exact, phash, mirror (uint64), thumbs
    (N, 16, 16 uint8), labels, files, sides."""
    out = dict(record)
    for name in ("exact", "phash", "mirror"):
        out[name] = np.frombuffer(base64.b64decode(record[name]), dtype="<u8").astype(np.uint64)
    thumbs = np.frombuffer(base64.b64decode(record["thumbs"]), dtype=np.uint8)
    out["thumbs"] = thumbs.reshape(-1, SMALL, SMALL)
    return out


def pack(array: np.ndarray) -> str:
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return base64.b64encode(np.ascontiguousarray(little).tobytes()).decode("ascii")
