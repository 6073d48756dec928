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
_JPEG_METADATA = set(range(0xE0, 0xF0)) | {0xFE}  # APP0..APP15, COM


def exact_key(image: Image.Image) -> int:
    """The exact key of a decoded image: its mode, size and pixels."""
    digest = hashlib.sha1(f"{image.mode}{image.size}".encode())
    digest.update(image.tobytes())
    return int.from_bytes(digest.digest()[:8], "little")


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


def thumbnail(image: Image.Image, step: int = 1) -> np.ndarray:
    """The 32x32 float32 grayscale area-average thumbnail of a PIL image; ``step``: each of
    its pixels stands for step x step pixels of the original (a JPEG draft's 8), the last
    ones for what is left (the original's size is ``image.info["size"]``)."""
    full = image.info.get("size", image.size) if step > 1 else image.size
    gray = image if image.mode == "L" else image.convert("L")
    factor = min(gray.size) // (2 * THUMB)
    if factor > 1:  # PIL's box reduction in C first: a large photo costs ~1 ms less
        gray, step = gray.reduce(factor), step * factor
    return thumbnail_of_array(np.asarray(gray), full[::-1], step)


def thumbnail_of_array(gray: np.ndarray, full=None, step: int = 1) -> np.ndarray:
    """The 32x32 float32 area-average thumbnail of a 2-D uint8 array whose pixels each stand
    for ``step`` x ``step`` pixels of an original of ``full`` (height, width)."""
    full = full or gray.shape
    rows = _area_matrix(gray.shape[0], full[0], step)
    cols = _area_matrix(gray.shape[1], full[1], step)
    return rows @ gray.astype(np.float32) @ cols.T


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
    coeffs = (dct @ thumbs.astype(np.float64) @ dct.T).reshape(len(thumbs), 64)
    mirrored = coeffs * np.tile((-1.0) ** np.arange(8), 8)
    return _bits(coeffs), _bits(mirrored)


def _bits(coeffs: np.ndarray) -> np.ndarray:
    above = coeffs > np.median(coeffs, axis=1, keepdims=True)
    return np.packbits(above, axis=1).view(">u8").reshape(-1).astype(np.uint64)


def small(thumbs: np.ndarray) -> np.ndarray:
    """16x16 uint8 thumbnails (N, 16, 16) from 32x32 ones: the mean of each 2x2 block."""
    n = len(thumbs)
    blocks = thumbs.reshape(n, SMALL, 2, SMALL, 2).mean(axis=(2, 4))
    return np.clip(np.rint(blocks), 0, 255).astype(np.uint8)


def shard_record(keys: list, thumbs: list, labels: list, files: list, sides: list) -> dict:
    """What a shard's done marker keeps for the check: its records' keys, hashes,
    thumbnails, labels, file names and short-side buckets, in record order (arrays
    base64-packed)."""
    stack = np.stack(thumbs) if thumbs else np.zeros((0, THUMB, THUMB), np.float32)
    direct, mirror = phashes(stack)
    return {
        "exact": pack(np.asarray(keys, dtype=np.uint64)),
        "phash": pack(direct),
        "mirror": pack(mirror),
        "thumbs": pack(small(stack)),
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
