"""The duplicate check's search for near pairs, not over all pairs: the candidates among
which every pair within both of the check's distances is (``duplicates.py`` says which pairs
are near), by whichever of two indexes the data suits.

- **thumbnails** (most data): two 16x16 thumbnails within ``reach`` of each other as
  256-vectors (one of them mirrored or not) have mirror-symmetric parts within ``reach``
  too, and so do those parts' coordinates on any orthonormal basis, with the norm of what
  the basis leaves and that of the antisymmetric parts (the triangle inequality): their
  first principal components and those two norms go in a k-d tree (scipy's), whose range
  search returns every pair that close, each a candidate as it is and mirrored: one search
  for both. Data puts most of its variance in a few components (Fashion-MNIST's garments:
  3 and the norms keep the candidates under 10 an image; without the norms 6 left 15);
- **pHashes** (thumbnails that spread their variance over more than ``MAX_TREE_DIMS``
  components, like noise, where a k-d tree visits nearly every pair): multi-index hashing
  (Norouzi et al., 2012) cuts the 64 bits into ``m`` bands; two hashes within ``radius``
  bits agree to within ``radius // m`` bits on at least one band (the pigeonhole), so only
  the records whose band lies that close to a query's are compared, found by a sorted search.
  Small centred images have pHashes so alike that this leaves 22 million candidates for
  Fashion-MNIST's 70,000: hence the thumbnails first.

Both return (i, j, flipped) triples whose pHashes are within ``radius`` bits (j's mirror's
when flipped); the caller compares their thumbnails.
"""

import itertools
from dataclasses import dataclass

import numpy as np

MAX_TREE_DIMS = 8  # a k-d tree over more components nears a search over all pairs
_CANDIDATES_PER_IMAGE = 20  # what the tree's components are chosen for (``_dims``)
_COUNTED_UP = 3  # components tried one by one before a bisection (``_dims``)
_SAMPLE = 4000  # thumbnails the components (and how many) are chosen on
_CHUNK = 4096  # rows converted to float at once: they stay in a cache, memory stays bounded
_PROBES_AT_ONCE = 1 << 21  # queries x probes searched per numpy call (bounds memory)
_PLAN_SAMPLE = 500  # queries the band plans are tried on
_MAX_PROBES = 1000  # band plans that probe more patterns per band are not tried
_TABLE_BITS = 20  # bands up to this wide are looked up in a table (8 MB at most)


def candidates(direct, mirror, thumbs, radius: int, reach: float) -> tuple:
    """((K, 3) int64 triples (i, j, flipped), i != j, with direct[i] within ``radius`` bits
    of direct[j] or, flipped, of mirror[j]; stats; the k-d tree's ``Space``, None when the
    pHashes were searched) among which is every such pair whose 16x16 uint8 ``thumbs``
    (j's mirrored) are within ``reach`` (L2 over their pixels)."""
    if len(direct) < 2:
        return np.zeros((0, 3), np.int64), {"index": "none", "candidates": 0}, None
    coordinates = embedding(thumbs, reach)
    if coordinates is not None:
        return _tree_candidates(direct, mirror, radius, reach, coordinates)
    return (*_hash_candidates(direct, mirror, radius), None)


# --- the thumbnails' k-d tree -------------------------------------------------------------


@dataclass
class Space:
    """What the k-d tree search leaves for the cropped-copy search (``crops.py``): the
    thumbnails' ``coordinates``, every pair of them within ``reach`` of each other
    (``close``, (K, 2)), and the tree's ``order`` of them (neighbours next to each other)."""

    coordinates: np.ndarray
    close: np.ndarray
    reach: float
    order: np.ndarray


def embedding(thumbs: np.ndarray, reach: float):
    """(N, d + 2) coordinates of 16x16 ``thumbs`` whose distances are at most theirs, one
    of them mirrored or not (``_with_norms``), on as few principal components as keep pairs
    within ``reach`` rare (``_dims``); None for noise-like thumbnails (``_components``)."""
    basis, mean = _components(thumbs, reach)
    if basis is None:
        return None
    return _with_norms(*_coordinates(thumbs, basis, mean), basis.shape[1])


def kd_tree(coordinates: np.ndarray, **options):
    """scipy's ``cKDTree`` over the rows of ``coordinates``, built with ``options``."""
    # scipy.spatial imported here, not at the top: every training run imports the converter
    # (the demo dataset), which searches only when it converts.
    from scipy.spatial import cKDTree  # noqa: PLC0415

    return cKDTree(coordinates, **options)


def _tree_candidates(direct, mirror, radius, reach, coordinates) -> tuple:
    # Built by sliding midpoints, not medians: half the build, and a range search is exact
    # whatever the tree (the pairs are the same), ~8% faster here (Fashion-MNIST).
    tree = kd_tree(coordinates, leafsize=16, balanced_tree=False)
    close = tree.query_pairs(reach, output_type="ndarray")
    a, b = close.T
    # Each pair close in the mirror-symmetric part is a candidate as it is and mirrored,
    # either way round: a mirror's pHash is not its image's bits mirrored (the median moves).
    kept = [
        (np.bitwise_count(direct[i] ^ hashes[j]) <= radius, i, j, flipped)
        for i, j, hashes, flipped in ((a, b, direct, 0), (a, b, mirror, 1), (b, a, mirror, 1))
    ]
    triples = np.concatenate(
        [np.stack([i[k], j[k], np.full(k.sum(), f)], axis=1) for k, i, j, f in kept]
    ).astype(np.int64)
    index = f"thumbnails, {coordinates.shape[1] - 2} components and 2 norms"
    space = Space(coordinates, close, reach, tree.indices)
    return triples, {"index": index, "candidates": 3 * len(a)}, space


def _components(thumbs: np.ndarray, reach: float) -> tuple:
    """(the principal components to search on, (128, d), the mean they are about), or
    (None, None) when more than MAX_TREE_DIMS would be needed (``_dims``): of the
    thumbnails' mirror-symmetric parts, (t + mirror(t)) / 2, an orthogonal projection that
    an image and its mirror share, so that one search finds the pairs of both
    orientations; in the space of those parts' left halves (``_halves``)."""
    n = len(thumbs)
    sample = thumbs[:: max(1, n // _SAMPLE)]
    # Components fitted on half the sample, counted on the other half: on the half they
    # were fitted to they would look more spread than the data (and promise too few pairs).
    fit, held_out = sample[::2], sample[1::2] if len(sample) > 1 else sample
    symmetric = _halves(fit)[0]
    mean = symmetric.mean(axis=0)
    values, vectors = np.linalg.eigh((symmetric - mean).T @ (symmetric - mean))
    components = vectors[:, ::-1][:, :MAX_TREE_DIMS]
    dims = _dims(_coordinates(held_out, components, mean), n, reach)
    return (components[:, :dims], mean) if dims else (None, None)


def _dims(coordinates: tuple, n: int, reach: float) -> int:
    """How many principal components to search on: the fewest (up to MAX_TREE_DIMS) on
    which, with the two norms (``_with_norms``), the pairs of a sample (its
    ``_coordinates``) within ``reach`` of each other, counted up to the whole ``n`` records
    (each pair three candidates: as it is, and mirrored either way round), are at most
    _CANDIDATES_PER_IMAGE an image; 0 when not even MAX_TREE_DIMS are enough."""
    m = len(coordinates[0])

    def enough(dims: int) -> bool:
        tree = kd_tree(_with_norms(*coordinates, dims))
        pairs = (tree.count_neighbors(tree, reach) - m) / 2  # without each with itself
        return 3 * pairs * (n / m) ** 2 <= _CANDIDATES_PER_IMAGE * n

    # More components only part pairs further. Counted up while the trees are cheap (few
    # dimensions: Fashion-MNIST's 1, 2, 3 take half the time of a bisection's 8, 4, 2, 3);
    # past that, the most first (noise fails there, once), then a bisection for the fewest.
    low, high = min(_COUNTED_UP, coordinates[0].shape[1]), coordinates[0].shape[1]
    fewest = next((d for d in range(1, low + 1) if enough(d)), 0)
    if fewest or low == high or not enough(high):
        return fewest
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def _halves(thumbs: np.ndarray) -> tuple:
    """(the thumbnails' mirror-symmetric parts, their antisymmetric parts' norms), the
    first as vectors of 128 whose distances are those of the 16x16 parts: each part is its
    left half mirrored, so sqrt(2) times the left half keeps the distances; float64."""
    part = thumbs.astype(np.int32)
    half = part.shape[-1] // 2
    left, right = part[:, :, :half], part[:, :, : half - 1 : -1]
    # Twice the halves are small integers: exact, whatever the order of the sums.
    anti = np.sqrt(((left - right) ** 2).reshape(len(part), -1).sum(axis=1) / 2)
    return (left + right).reshape(len(part), -1) * (np.sqrt(2) / 2), anti


def _coordinates(thumbs: np.ndarray, basis: np.ndarray, mean: np.ndarray) -> tuple:
    """(the coordinates (N, d) of the thumbnails' mirror-symmetric parts (``_halves``) on
    ``basis`` about ``mean``; those parts' squared distances from ``mean``; the norms of
    their antisymmetric parts, (t - mirror(t)) / 2), float64. The symmetric part is the
    same for an image and its mirror, the antisymmetric one's norm too."""
    out = np.empty((len(thumbs), basis.shape[1])), np.empty(len(thumbs)), np.empty(len(thumbs))
    # One product gives the coordinates and each part's product with the mean, and the
    # squared distance from the mean is |x|^2 - 2 x.mean + |mean|^2 (|x|^2 in integers):
    # no centred copy of the parts (a third of the embedding's time on Fashion-MNIST).
    scale = np.sqrt(2) / 2
    weights = np.column_stack([basis, mean]) * scale
    shift = mean @ basis
    for start in range(0, len(thumbs), _CHUNK):  # as floats, 1.28M would take 1.3 GB
        twice, anti = _sums(thumbs[start : start + _CHUNK])
        rows = slice(start, start + len(twice))
        products = twice @ weights
        out[0][rows] = products[:, :-1] - shift
        squares = np.einsum("ij,ij->i", twice, twice) / 2  # whole numbers: exact
        out[1][rows] = squares - 2 * products[:, -1] + mean @ mean
        out[2][rows] = anti
    return out


def _sums(thumbs: np.ndarray) -> tuple:
    """(each thumbnail's left half plus its mirrored right half, float64 (N, 128): sqrt(2)
    times its mirror-symmetric part (``_halves``); its antisymmetric part's norm)."""
    half = thumbs.shape[-1] // 2
    # In int16 (two grey levels' sum or difference fits), each half copied from the bytes
    # once: half the cost of int32 arithmetic on a mirrored view. The squares summed in
    # float32 are exact (128 x 255^2 < 2^24).
    left = thumbs[:, :, :half].astype(np.int16)
    right = thumbs[:, :, : half - 1 : -1].astype(np.int16)
    difference = (left - right).reshape(len(thumbs), -1).astype(np.float32)
    anti = np.sqrt(np.einsum("ij,ij->i", difference, difference).astype(np.float64) / 2)
    return (left + right).reshape(len(thumbs), -1).astype(np.float64), anti


def _with_norms(projected: np.ndarray, centred: np.ndarray, anti: np.ndarray, dims: int):
    """(N, dims + 2): the first ``dims`` coordinates, the norm of the rest of the symmetric
    part (what the basis leaves of it), the antisymmetric part's norm. An orthogonal split
    and the triangle inequality (| |x| - |y| | <= |x - y|) make the distance of two of them
    at most that of the thumbnails, one mirrored or not: a pair within reach is found."""
    kept = projected[:, :dims]
    rest = np.sqrt(np.maximum(centred - np.einsum("ij,ij->i", kept, kept), 0))
    return np.column_stack([kept, rest, anti])


# --- the pHashes' multi-index hashing -----------------------------------------------------


def _hash_candidates(direct, mirror, radius) -> tuple:
    n = len(direct)
    entries = np.concatenate([direct, mirror])
    owner = np.concatenate([np.arange(n), np.arange(n)])
    flipped = np.repeat([False, True], n)
    widths, per_band = _plan_bands(direct, entries, radius)
    found, looked = [], 0
    for shift, width in _bands(widths):
        for a, e in _band_matches(direct, entries, shift, width, _probe_masks(width, per_band)):
            looked += len(a)
            b = owner[e]
            keep = (a != b) & (np.bitwise_count(direct[a] ^ entries[e]) <= radius)
            found.append((a[keep] * n + b[keep]) * 2 + flipped[e][keep])
    codes = np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)
    triples = np.stack([codes // 2 // n, codes // 2 % n, codes % 2], axis=1).astype(np.int64)
    index = f"pHashes, bands {list(widths)} probed within {per_band} bits"
    return triples, {"index": index, "candidates": looked}


def _band_matches(direct, entries, shift, width, masks):
    """Yields (query indices, entry indices) whose band ``[shift, shift + width)`` lies
    within the ``masks``' bit patterns of each other: a look-up per probe."""
    keys = _band(entries, shift, width)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = _starts(sorted_keys, width)
    step = max(1, _PROBES_AT_ONCE // len(masks))
    for start in range(0, len(direct), step):
        index = np.arange(start, min(start + step, len(direct)))
        lo, count = _lookup(sorted_keys, direct[index], shift, width, masks, starts)
        total = int(count.sum())
        if total:
            queries = np.repeat(np.repeat(index, len(masks)), count)
            offsets = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
            yield queries, order[np.repeat(lo, count) + offsets]


def _band(hashes: np.ndarray, shift: int, width: int) -> np.ndarray:
    return (hashes >> np.uint64(shift)) & np.uint64((1 << width) - 1)


def _bands(widths: list) -> list:
    """[(shift, width)] of bands of ``widths`` bits, from the top bit down."""
    tops = 64 - np.cumsum(widths)
    return [(int(t), int(w)) for t, w in zip(tops, widths)]


def _lookup(sorted_keys, queries, shift, width, masks, starts=None) -> tuple:
    """(first match, number of matches) in ``sorted_keys`` of every probe of ``queries``:
    their band XOR each mask; by ``starts`` (``_starts``) when there is one."""
    probes = (_band(queries, shift, width)[:, None] ^ masks[None, :]).reshape(-1)
    if starts is not None:
        lo = starts[probes]
        return lo, starts[probes + np.uint64(1)] - lo
    lo = np.searchsorted(sorted_keys, probes, "left")
    return lo, np.searchsorted(sorted_keys, probes, "right") - lo


def _starts(sorted_keys: np.ndarray, width: int):
    """Where each ``width``-bit value starts in ``sorted_keys`` (one more: the end), for
    bands up to _TABLE_BITS wide: a look-up instead of two binary searches (~10x faster
    over 20,000 images' 16-bit bands); None for wider ones."""
    if width > _TABLE_BITS:
        return None
    counts = np.bincount(sorted_keys.astype(np.intp), minlength=1 << width)
    return np.concatenate([[0], np.cumsum(counts)])


def _plan_bands(direct, entries, radius: int) -> tuple[list, int]:
    """(band widths, bits within which a band is probed): of the splits of 64 bits that
    find every pair within ``radius``, the one with the least work (probes plus candidates)
    counted for a sample of the queries: real hashes are far from uniform."""
    rng = np.random.default_rng(0)
    sample = rng.choice(len(direct), size=min(len(direct), _PLAN_SAMPLE), replace=False)
    best = None
    for m in range(2, 9):
        widths, per_band = [64 // m + (i < 64 % m) for i in range(m)], radius // m
        masks = _probe_masks(min(widths), per_band)
        if len(masks) > _MAX_PROBES:
            continue
        work = 0
        for shift, width in _bands(widths):
            keys = np.sort(_band(entries, shift, width))
            _, count = _lookup(keys, direct[sample], shift, width, masks, _starts(keys, width))
            work += count.sum() + count.size
        if best is None or work < best[0]:
            best = (work, widths, per_band)
    return best[1], best[2]


def _probe_masks(width: int, bits: int) -> np.ndarray:
    """Every ``width``-bit pattern with at most ``bits`` ones, as uint64."""
    masks = [
        sum(1 << b for b in combo)
        for k in range(bits + 1)
        for combo in itertools.combinations(range(width), k)
    ]
    return np.array(masks, dtype=np.uint64)
