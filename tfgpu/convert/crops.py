"""The duplicate check's second relation: copies cropped (each side by up to 5%), or small
enough that their pHash is unsteady, found by comparing each image with its nearest ones after
the crop that best aligns them.

Why a second relation: the first (``duplicates.py``) compares whole frames pixel by pixel. A
crop of 5% on one side moves the picture by 0.8 of a 16x16 thumbnail's pixel, which changes a
photo's thumbnail by 7-10 grey levels RMS and its pHash by 6-8 bits at every image size, over
both thresholds; and the pHash of a 28-48 px image, its 64 bits thresholded at their median,
flips 4-6 bits on a mere JPEG re-encoding. A search over all crops of all pairs is out of reach
(in Fashion-MNIST a 5% crop moves a garment farther than the next garment of its kind), so:

- candidates: each image's ``NEIGHBOURS`` nearest in the k-d tree's coordinates
  (``near_search``: read off the pairs its range search found within reach where there are
  that many, asked of the tree otherwise), ranked by the RMS of their 8x8 thumbnails (the
  better of mirrored or not); the two nearest are aligned where the nearest stands out
  (``STANDOUT``);
- alignment: the crop of one image (each side 0, 1.25, ... 5%) that best matches the other,
  chosen per axis from their column and row means, then the 8x8 thumbnails compared: the 16x16
  ones upsampled (linearly, 4x) and area-averaged over the crop, so that a crop that splits a
  pixel weighs it by what it covers;
- a pair is near when, aligned, its 8x8 thumbnails differ by at most ``CROP_RMS`` grey levels,
  at most the smoother image's detail (``fine``: gradients, bokeh and sky, whose crops all
  look alike, have little) or ``NOISE_RMS``, and at most ``NEAREST_RATIO`` of the distance
  from either image to its next nearest (Lowe's ratio test: a copy is alone that close, a
  look-alike has others as close; Fashion-MNIST's cuts of garment in many prints make pairs
  that stand out from one side only, and 8x8 or even 16x16 thumbnails cannot see the prints
  that tell them apart, docs/data.md#data-quality).

Measured (bench/near_copies.py, docs/data.md#data-quality): 97-100% of copies found at 28-500
px as JPEG, PNG and arrays; on Fashion-MNIST this costs ~0.28 CPU s (~4% of its conversion).
The tree's coordinates are the mirror-symmetric parts' (one search for both orientations);
where the data is noise-like at thumbnail scale (the pHash index, ``near_search``), there is no
tree and this relation is not searched.
"""

import functools

import numpy as np

from tfgpu.convert.columns import SMALL
from tfgpu.convert.near_search import kd_tree

MAX_CROP = 0.05  # a side cropped by up to this fraction of it
CROP_RMS = 6.0  # grey levels between the aligned 8x8 thumbnails, at most
DETAIL_RATIO = 1.0  # ... and at most this times the smoother image's detail (``fine``)
NOISE_RMS = 1.5  # ... or this many grey levels, a JPEG re-encoding's noise on small images
NEAREST_RATIO = 0.3  # ... and of either image's distance to its next nearest image
NEIGHBOURS = 5  # the nearest in the tree's coordinates that are ranked by their thumbnails
ALIGNED = 2  # ... of which the nearest by their thumbnails are aligned
STANDOUT = 0.6  # ... when the nearest is at most this fraction of the next one's distance
QUERY_EPS = 1.0  # the neighbours asked of the tree: within (1 + this) times the k-th distance
_SIDE = 8  # the aligned thumbnails' side
_UP = 4  # the 16x16 thumbnails are upsampled this much before a crop is averaged
_FRACTIONS = np.linspace(0, MAX_CROP, 5)  # the crops tried, per side
_CHUNK = 8192  # images ranked at once: their float arrays stay small
# Pairs aligned at once: their crops' profiles (25 a pair) stay in the cache. Fashion-MNIST's
# 11,344 aligned: 0.079 CPU s 8,192 at once, 0.059 at 2,048 (1,024: the same).
_PAIRS_AT_ONCE = 2048
_MEAN = np.full(SMALL, 1 / SMALL, np.float32)  # a thumbnail's row or column mean, as a product


def crop_pairs(thumbs: np.ndarray, which, coordinates: np.ndarray, close, reach: float):
    """(pairs (K, 2) of indices i < j into ``which`` that are near by this relation, stats)
    of the records ``which`` (indices into the 16x16 uint8 ``thumbs``, gathered a chunk at
    a time: no copy of them all) placed at ``coordinates`` (``near_search.embedding``),
    given pairs of them (``close``, (M, 2)) among which is every pair within ``reach``."""
    n = len(which)
    if n < 3:
        return np.zeros((0, 2), np.int64), {"crop_candidates": 0}
    others = _nearest(coordinates, close, reach, min(NEIGHBOURS, n - 1))
    neighbours, distances, flipped = _ranked(_halves(thumbs, which), others)
    ranked, nearest = neighbours, distances  # every image's, for its partner's ratio test
    # Only an image whose nearest stands out as they are is aligned with its nearest ones:
    # a copy's does (photos: 99% of the copies found), a look-alike's rarely (Fashion-
    # MNIST: 15% of its images), and aligning is most of what this search costs.
    rows = np.nonzero(distances[:, 0] <= STANDOUT * distances[:, 1])[0]
    if not len(rows):
        return np.zeros((0, 2), np.int64), {"crop_candidates": 0}
    neighbours, distances, flipped = neighbours[rows], distances[rows], flipped[rows]
    i = np.repeat(rows, neighbours.shape[1])
    j, flip = neighbours.reshape(-1), flipped.reshape(-1)
    # The identity is among the crops, but the one the means pick may be worse than it.
    apart = np.minimum(distances.reshape(-1), aligned(thumbs, which[i], which[j], flip))
    apart = apart.reshape(neighbours.shape)
    order = np.argsort(apart, axis=1, kind="stable")
    at = np.arange(len(rows))
    best, runner_up = apart[at, order[:, 0]], apart[at, order[:, 1]]
    partner = neighbours[at, order[:, 0]]
    # The partner's own next nearest (as they are: at least as far as aligned) counts too:
    # a look-alike (Fashion-MNIST: one cut of garment in many prints) has others near
    # either side, a copy has none near both.
    others_near = np.where(ranked[partner, 0] == rows, nearest[partner, 1], nearest[partner, 0])
    runner_up = np.minimum(runner_up, others_near)
    near = np.nonzero((best <= CROP_RMS) & (best <= NEAREST_RATIO * runner_up))[0]
    # The detail only of the pairs left (Fashion-MNIST: ~200 of ~5,700): the same pairs.
    ends = (rows[near], partner[near])
    detail = np.minimum(*(fine(_eighths(np.take(thumbs, which[k], axis=0))) for k in ends))
    near = near[best[near] <= np.maximum(DETAIL_RATIO * detail, NOISE_RMS)]
    pairs = np.sort(np.stack([rows[near], partner[near]], axis=1), axis=1)
    pairs = np.unique(pairs, axis=0) if len(pairs) else pairs
    return pairs.astype(np.int64), {"crop_candidates": int(len(i))}


def _nearest(coordinates: np.ndarray, close: np.ndarray, reach: float, k: int) -> np.ndarray:
    """(N, k): each point's k nearest others in ``coordinates``, read off ``close`` (every
    pair within ``reach`` is there) for a point with k of them within reach (Fashion-
    MNIST's look-alikes: 32% of its points; a query costs twice the range search's time a
    point), asked of a k-d tree for the others."""
    n = len(coordinates)
    out = np.empty((n, k), np.int64)
    asked = _read_off(coordinates, close, reach, out)
    if len(asked):
        # Built by sliding midpoints (half a balanced build's time), as the whole-frame one.
        tree = kd_tree(coordinates, leafsize=16, balanced_tree=False)
        # Asked in the tree's own order, neighbours after neighbours: the same answers, a
        # quarter cheaper (the nodes a query visits are still in the cache for the next).
        # Read off the tree's order (a mask), not sorted into it.
        wanted = np.zeros(n, bool)
        wanted[asked] = True
        asked = tree.indices[wanted[tree.indices]]
        # Approximate (within twice the k-th distance): half an exact query's time, and
        # the neighbours are ranked by their thumbnails next. Judged end to end
        # (bench/near_copies.py): two planted copies more found than within 1.5 times,
        # none fewer, no false group; Fashion-MNIST: 96 groups (94), none mixing labels.
        _, found = tree.query(np.take(coordinates, asked, axis=0), k=k + 1, eps=QUERY_EPS)
        # Each row without the point itself (an equal point may come first; where the
        # approximate query missed it, without the last).
        own = found == asked[:, None]
        drop = np.where(own.any(axis=1), own.argmax(axis=1), k)
        out[asked] = found[np.arange(k + 1) != drop[:, None]].reshape(-1, k)
    return out


def _read_off(coordinates: np.ndarray, close: np.ndarray, reach: float, out: np.ndarray):
    """Fills the rows of ``out`` (N, k) of the points with k others within ``reach``
    among the pairs ``close`` with those k, nearest first; returns the other points."""
    n, k = out.shape
    # Rows gathered by np.take throughout: numpy's indexing takes 1.5-7 times as long
    # for rows this short (the same arrays).
    ends = (np.take(coordinates, close[:, e], axis=0) for e in (0, 1))
    apart = np.sqrt(((next(ends) - next(ends)) ** 2).sum(axis=1))
    within = apart <= reach
    close, apart = close[within], apart[within]
    # Each pair both ways round as one integer (point, distance, other), sorted as values:
    # by point, then distance, then other (an argsort and a gather take a third longer).
    # The distance in the bits the indices leave: steps of reach / 2^29 for 70,000 points,
    # of reach / 2^21 for ImageNet's 1.28M.
    bits = max(1, (n - 1).bit_length())
    steps = (apart * (((1 << (63 - 2 * bits)) - 1) / reach)).astype(np.int64) << bits
    a, b = close[:, 0], close[:, 1]
    keys = np.concatenate([(a << (63 - bits)) | steps | b, (b << (63 - bits)) | steps | a])
    keys.sort()
    counts = np.bincount(keys >> (63 - bits), minlength=n)
    starts = np.cumsum(counts) - counts
    read = np.nonzero(counts >= k)[0]
    out[read] = np.take(keys, starts[read, None] + np.arange(k)) & ((1 << bits) - 1)
    return np.nonzero(counts < k)[0]


def _ranked(halves: tuple, others: np.ndarray) -> tuple:
    """(neighbours, distances, flipped), each (N, k): of each image's ``others`` (N, m),
    the ALIGNED nearest by the RMS of their 8x8 thumbnails (given by their ``halves``), in
    that order (the other's mirrored where ``flipped``, whichever is closer)."""
    symmetric, anti = halves
    n = len(symmetric)
    # Mirroring negates an image's antisymmetric part and keeps its symmetric one, so both
    # distances come from two dot products of half the size: |a|^2 + |b|^2 - 2 (s +- t).
    s, t = np.empty(others.shape, np.float32), np.empty(others.shape, np.float32)
    for start in range(0, n, _CHUNK):  # the gathered neighbours stay small (a few MB)
        part = slice(start, start + _CHUNK)
        near = others[part]
        s[part] = np.einsum("nd,nkd->nk", symmetric[part], np.take(symmetric, near, axis=0))
        t[part] = np.einsum("nd,nkd->nk", anti[part], np.take(anti, near, axis=0))
    norms = 2 * (np.einsum("nd,nd->n", symmetric, symmetric) + np.einsum("nd,nd->n", anti, anti))
    base = norms[:, None] + norms[others]
    direct, mirror = base - 4 * (s + t), base - 4 * (s - t)
    flipped = mirror < direct
    distances = np.sqrt(np.maximum(np.minimum(direct, mirror), 0) / _SIDE**2)
    order = np.argsort(distances, axis=1, kind="stable")[:, :ALIGNED]
    at = np.arange(n)[:, None]
    return others[at, order], distances[at, order], flipped[at, order]


def _halves(thumbs: np.ndarray, which: np.ndarray) -> tuple:
    """(the mirror-symmetric parts, the antisymmetric parts) of the uncropped 8x8
    thumbnails (``_eighths``) of ``thumbs[which]``, each as (N, 32) float32 vectors of
    their left halves, made a chunk at a time (the 8x8 thumbnails of all and their sums
    would be ~50 MB of new memory for 70,000 images)."""
    crops, _ = _banks()
    fold, half = _folds(), _SIDE // 2
    out = np.empty((2, len(which), _SIDE * half), np.float32)
    for start in range(0, len(which), _CHUNK):
        part = np.take(thumbs, which[start : start + _CHUNK], axis=0).astype(np.float32)
        # Both halves in the 8x8 thumbnail's right-hand product (``_folds``), the left one
        # a single product over the chunk's rows: the same floats, a quarter cheaper.
        both = crops[0] @ (part.reshape(-1, SMALL) @ fold).reshape(len(part), SMALL, _SIDE)
        rows = slice(start, start + len(part))
        out[0, rows] = both[:, :, :half].reshape(len(part), -1)
        out[1, rows] = both[:, :, half:].reshape(len(part), -1)
    return out[0], out[1]


@functools.cache
def _folds() -> np.ndarray:
    """(16, 8) float32: the 8x8 thumbnail's right-hand matrix (``_eighths``) folded so that
    its first 4 columns give the left half of the mirror-symmetric part, (t + mirror(t)) /
    2, and its last 4 that of the antisymmetric part, (t - mirror(t)) / 2."""
    right = _banks()[0][0].T.astype(np.float64)
    half = _SIDE // 2
    direct, mirrored = right[:, :half], right[:, : half - 1 : -1]
    return np.hstack([(direct + mirrored) / 2, (direct - mirrored) / 2]).astype(np.float32)


def _rms(difference: np.ndarray) -> np.ndarray:
    return np.sqrt((difference * difference).mean(axis=-1))


def aligned(thumbs: np.ndarray, i, j, flip) -> np.ndarray:
    """For each pair: the least RMS between the 8x8 thumbnails of image j (mirrored where
    ``flip``) and a crop of image i, or of i and a crop of j."""
    out = np.empty(len(i))
    for start in range(0, len(i), _PAIRS_AT_ONCE):
        part = slice(start, start + _PAIRS_AT_ONCE)
        y = np.take(thumbs, j[part], axis=0)
        y = np.where(flip[part][:, None, None], y[:, :, ::-1], y)  # mirrored as bytes
        x, y = np.take(thumbs, i[part], axis=0).astype(np.float32), y.astype(np.float32)
        # Each thumbnail's column and row means, from which the crops are chosen: as
        # products (sums of whole grey levels, exact in float32: numpy's mean, the same
        # floats, took a quarter of the alignment's time).
        a, b = ((t, _MEAN @ t, t @ _MEAN) for t in (x, y))
        out[part] = np.minimum(_cropped_rms(*a, *b), _cropped_rms(*b, *a))
    return out


def _cropped_rms(x, x_columns, x_rows, y, y_columns, y_rows) -> np.ndarray:
    """RMS between each y's 8x8 thumbnail and that of the crop of x (each side 0-5%) whose
    column and row means best match y's (one axis at a time: a crop is one per axis)."""
    crops, _ = _banks()
    columns = _best_crop(x_columns, y_columns)
    rows = _best_crop(x_rows, y_rows)
    cropped = crops[rows] @ x @ np.swapaxes(crops[columns], 1, 2)
    target = crops[0] @ y @ crops[0].T
    return _rms((cropped - target).reshape(len(x), -1))


def _best_crop(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The index of the crop (``_banks``) of each 16-vector of means in ``x`` closest to the
    uncropped one in ``y``."""
    tried = (np.hstack([x, y]) @ _differences()).reshape(len(x), -1, SMALL)
    return np.einsum("ncs,ncs->nc", tried, tried).argmin(axis=1)


@functools.cache
def _differences() -> np.ndarray:
    """(32, C * 16) float32: [x, y] times it is each crop's profile of x minus the uncropped
    one of y (``_best_crop``): one product, where the difference after it took as long."""
    _, profiles = _banks()
    tiled = np.tile(profiles[0].T, (1, len(profiles)))
    return np.vstack([profiles.reshape(-1, SMALL).T, -tiled]).astype(np.float32)


@functools.cache
def _banks() -> tuple:
    """(C, 8, 16) and (C, 16, 16) float32 matrices: a side of 16 upsampled, cropped (each
    end by one of _FRACTIONS, C = 25 ways) and area-averaged to 8 and to 16; index 0 is
    the uncropped one."""
    up = _upsample(SMALL, _UP)
    cuts = [(a, b) for a in _FRACTIONS for b in _FRACTIONS]
    return tuple(
        np.stack([_area(a, b, SMALL * _UP, side) @ up for a, b in cuts]).astype(np.float32)
        for side in (_SIDE, SMALL)
    )


def _upsample(size: int, factor: int) -> np.ndarray:
    """(size * factor, size): linear interpolation between pixel centres."""
    at = np.clip((np.arange(size * factor) + 0.5) / factor - 0.5, 0, size - 1)
    low = np.floor(at).astype(int)
    high, weight = np.minimum(low + 1, size - 1), at - low
    out = np.zeros((size * factor, size))
    np.add.at(out, (np.arange(size * factor), low), 1 - weight)
    np.add.at(out, (np.arange(size * factor), high), weight)
    return out


def _area(start: float, end: float, size: int, side: int) -> np.ndarray:
    """(side, size): each output pixel the mean of the input it covers, the input's first
    ``start`` and last ``end`` fractions cut off."""
    edges = (start + (1 - start - end) * np.arange(side + 1) / side) * size
    pixels = np.arange(size)[None, :]
    overlap = np.minimum(edges[1:, None], pixels + 1) - np.maximum(edges[:-1, None], pixels)
    overlap = np.clip(overlap, 0, None)
    return overlap / overlap.sum(axis=1, keepdims=True)


def _eighths(thumbs: np.ndarray) -> np.ndarray:
    """(N, 8, 8) float32: the uncropped 8x8 thumbnails ``_cropped_rms`` compares."""
    crops, _ = _banks()
    out = np.empty((len(thumbs), _SIDE, _SIDE), np.float32)
    for start in range(0, len(thumbs), _CHUNK):
        part = thumbs[start : start + _CHUNK].astype(np.float32)
        out[start : start + len(part)] = crops[0] @ part @ crops[0].T
    return out


def fine(eighths: np.ndarray) -> np.ndarray:
    """Each 8x8 thumbnail's detail: the RMS of what it has beyond its 3x3 local means
    (edges repeated), in grey levels. A crop misaligns a picture by a fraction of a pixel,
    which costs in proportion to this; smooth pictures (gradients, bokeh, sky) have little,
    and a crop of one looks like any other."""
    # scipy.ndimage imported here, not at the top: every training run imports the converter
    # (the demo dataset), which looks for crops only when it converts.
    from scipy.ndimage import uniform_filter  # noqa: PLC0415

    local = uniform_filter(eighths.astype(np.float64), size=(1, 3, 3), mode="nearest")
    return _rms((eighths - local).reshape(len(eighths), _SIDE * _SIDE))
