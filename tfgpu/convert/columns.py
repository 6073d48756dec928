"""The duplicate check's column products: the 32x32 thumbnail a pHash is made of and the
16x16 one the check keeps, of a shard's images at once (``fingerprint.py`` gathers them).

Each image's view (its grayscale pixels, each standing for ``step`` x ``step`` pixels of an
original of some size) is resampled by area (each output pixel the mean of the input it
covers) with one matrix per axis; the pHash's DCT rows and the 2x2 means are folded into those
matrices, so the 32x32 thumbnails are never made. Images whose sides round up to one multiple
of ``_PAD`` share a stack, padded with zeros, and are multiplied at once.
"""

import functools

import numpy as np

THUMB = 32  # the pHash's thumbnail side (imagehash: hash_size 8 x highfreq_factor 4)
SMALL = 16  # the stored thumbnail's side
_AT_ONCE = 1 << 21  # pixels multiplied at once: their floats fit in a cache, not new pages
_PAD = 8  # views whose sides round up to one multiple of this share a stack (``_buckets``)


def thumbnails(views: list) -> np.ndarray:
    """The 32x32 float32 area-average thumbnails (N, 32, 32) of ``views``
    (``fingerprint.view``), one by one: the reference ``summaries`` is tested against."""
    out = np.zeros((len(views), THUMB, THUMB), np.float32)
    for i, (gray, full, step) in enumerate(views):
        rows, cols = (area_matrix(size, f, step) for size, f in zip(gray.shape, full))
        out[i] = rows @ gray.astype(np.float32) @ cols.T
    return out


def summaries(kinds: dict, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(the pHash's 8x8 DCT coefficients (N, 64) float32, the 16x16 uint8 thumbnails) of
    ``n`` images given by ``kinds`` ({(gray shape, original size, step): (their grays
    (M, h, w) uint8, their indices)}, ``fingerprint.Collector``), as the pHash and the 2x2
    means would make them of ``thumbnails``, without the 32x32 thumbnails: their matrices
    are folded into the ones that make them, and images of about one size are multiplied
    at once, each by its own matrices, padded with zeros to the largest (a shard of 28x28
    images: a hundredth of what one call per image costs; of JPEG drafts, whose sizes
    differ by a few pixels: a tenth)."""
    coeffs = np.zeros((n, 64), np.float32)
    smalls = np.zeros((n, SMALL, SMALL), np.uint8)
    for shape, group in _buckets(kinds).items():
        members, runs = _runs(group)
        sides = [_matrices(group, axis, size) for axis, size in enumerate(shape)]
        at_once = max(1, _AT_ONCE // (shape[0] * shape[1]))
        for start in range(0, len(members), at_once):
            part = members[start : start + at_once]
            # float32: the coefficients' rounding (~1e-7 of them) flips no bit of a real
            # image's hash (tests: equal to ``phashes`` of the thumbnails, in float64)
            grays = _chunk(runs, shape, start, len(part))
            (dct_left, half_left), cols = (_pick(*side, start, len(part)) for side in sides)
            dct_cols, half_cols = (np.swapaxes(m, -1, -2) for m in cols)
            coeffs[part] = (dct_left @ _times(grays, dct_cols)).reshape(len(part), 64)
            blocks = half_left @ _times(grays, half_cols)
            smalls[part] = np.clip(np.rint(blocks), 0, 255).astype(np.uint8)
    return coeffs, smalls


def _times(grays: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """``grays`` (M, h, w) times ``matrix``: (w, c) shared by all, or (M, w, c) one each.
    A shared one as one product of M * h rows: faster than numpy's matmul of the stack
    (a shard of 70,000 28x28 images: ~0.02 CPU s less, the same floats; other sizes:
    within float32's rounding, a 16x16 thumbnail pixel one grey level off at most)."""
    if matrix.ndim == 2:
        return (grays.reshape(-1, grays.shape[-1]) @ matrix).reshape(*grays.shape[:2], -1)
    return grays @ matrix


def _buckets(kinds: dict) -> dict:
    """{stack shape: {kind: its (grays, indices)}}: the kinds whose sides round up to the
    same multiple of _PAD share a stack, as large as the largest of them."""
    rounded: dict = {}
    for kind in kinds:
        rounded.setdefault(tuple(-(-side // _PAD) for side in kind[0]), []).append(kind)
    return {
        tuple(max(kind[0][axis] for kind in group) for axis in (0, 1)): {
            kind: kinds[kind] for kind in group
        }
        for group in rounded.values()
    }


def _runs(group: dict) -> tuple:
    """(the indices of the ``group``'s images, its kinds one after another; the runs
    (first, end, grays) of each kind in that order)."""
    runs, at = [], 0
    for grays, _ in group.values():
        runs.append((at, at + len(grays), grays))
        at += len(grays)
    return np.concatenate([np.asarray(m) for _, m in group.values()]), runs


def _chunk(runs: list, shape: tuple, start: int, count: int) -> np.ndarray:
    """The float32 (count, *shape) stack of the images ``start`` to ``start + count`` of
    ``runs`` (``_runs``; their grays (M, h, w) uint8, or a list of (h, w) ones), zero-padded:
    made a chunk at a time from the views, the shard's whole stack is never made (its pages,
    new memory each shard, cost more than copying the views: ~0.03 CPU s a 60,000-image
    shard of 28x28 images)."""
    out, stop = None, start + count
    for first, end, grays in runs:
        a, b = max(first, start), min(end, stop)
        if a >= b:
            continue
        block = _floats(grays[a - first : b - first])
        if block.shape[1:] == shape and b - a == count:
            return block  # one kind fills the chunk: no copy into a padded one
        if out is None:
            out = np.zeros((count, *shape), np.float32)
        out[a - start : b - start, : block.shape[1], : block.shape[2]] = block
    return out


def _floats(grays) -> np.ndarray:
    """(M, h, w) float32 of ``grays``: (M, h, w) uint8, or a list of M (h, w) uint8 arrays
    of one kind. A list's bytes are joined first where each array's are in row-major order:
    numpy's conversion of a list of arrays takes a third longer (60,000 28x28 images: 0.050
    against 0.036 CPU s, the join and the conversion)."""
    if isinstance(grays, list) and grays:
        try:
            joined = b"".join(grays)
        except TypeError:  # an array whose bytes are strided: numpy gathers it
            joined = None
        shape = grays[0].shape
        if joined is not None and len(joined) == len(grays) * shape[0] * shape[1]:
            return np.frombuffer(joined, np.uint8).reshape(-1, *shape).astype(np.float32)
    return np.asarray(grays, np.float32)


def _matrices(kinds: dict, axis: int, padded: int) -> tuple:
    """(DCT rows x area matrix, 2x2 means x area matrix) along ``axis``, zero-padded to
    ``padded`` columns, of the images of ``kinds`` (a ``_buckets`` group), in order: (the
    pair, None) where they all share one, else (a pair of stacks of the distinct ones,
    each image's index into them)."""
    pairs = [_folded(shape[axis], full[axis], step, padded) for shape, full, step in kinds]
    distinct = list({id(pair): pair for pair in pairs}.values())  # the cache's objects
    if len(distinct) == 1:
        return distinct[0], None
    index = {id(pair): n for n, pair in enumerate(distinct)}
    which = np.repeat([index[id(pair)] for pair in pairs], [len(m) for _, m in kinds.values()])
    return tuple(np.stack(matrices) for matrices in zip(*distinct)), which


def _pick(matrices: tuple, which, start: int, count: int) -> tuple:
    """The ``matrices`` (``_matrices``) of the images ``start`` to ``start + count``: the
    pair itself when it is one (numpy multiplies every image by it), else the stacks'."""
    if which is None:
        return matrices
    return tuple(m[which[start : start + count]] for m in matrices)


_HALF = np.kron(np.eye(SMALL), [0.5, 0.5])  # (16, 32): the mean of each pair


@functools.lru_cache(maxsize=4096)
def _folded(size: int, full: int, step: int, padded: int) -> tuple:
    """(DCT rows x area matrix, 2x2 means x area matrix), float32, zero-padded to
    ``padded`` columns, for a side of ``size`` pixels standing for ``full`` at ``step``."""
    area = np.zeros((THUMB, padded))
    area[:, :size] = area_matrix(size, full, step)
    return (dct_rows() @ area).astype(np.float32), (_HALF @ area).astype(np.float32)


@functools.lru_cache(maxsize=256)
def area_matrix(size: int, full: int, step: int) -> np.ndarray:
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
def dct_rows() -> np.ndarray:
    """The first 8 rows of the unnormalized DCT-II matrix of size 32 (scipy's default)."""
    k, n = np.arange(8)[:, None], np.arange(THUMB)[None, :]
    return 2 * np.cos(np.pi * k * (2 * n + 1) / (2 * THUMB))
