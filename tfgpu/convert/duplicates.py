"""The duplicate check, run once when every shard is written: exact and near-duplicate
groups, within and across splits, and the groups whose images carry different labels.

Each record comes with its fingerprint (``fingerprint.py``, computed by the workers).

- exact: records with the same exact key (the same decoded pixels) form a group;
- near: two records are near-duplicates when their pHashes differ in at most ``RADIUS`` of
  64 bits, the image's against the other's or its mirror's (a flipped copy), AND their
  16x16 thumbnails differ by at most ``THUMB_RMS`` grey levels (root mean square, the
  mirrored one for a flipped match). The pHash alone is too coarse for small, centred
  images: on Fashion-MNIST a third of the test images have a training image within 6 bits,
  most of them merely the same kind of garment; the thumbnail tells copies from look-alikes;
- flat images (thumbnail deviation under ``FLAT_STD`` grey levels: one colour, or nearly)
  have no meaningful pHash (all share one) and are grouped only when exactly equal;
- a frame that is one level but for a few pixels (a photo's black surround with a sliver of
  the picture in a corner) carries too little information at thumbnail size to tell copies
  from other slivers: where either thumbnail's deviation from its median level lies in fewer
  than ``SPREAD_PIXELS`` of its 256 pixels (``_spread``), the pair is not near by either
  relation (exact copies are still grouped). Two corners of a retina photo, 3-7 such pixels
  each, made a false group; bench/near_copies.py's planted copies have 11.8 or more (a
  cropped copy of such a corner), Fashion-MNIST's grouped images 38 or more.

Groups are the connected components of both relations. The search is not over all pairs
(``near_search.py``: a k-d tree over the thumbnails' principal components, or multi-index
hashing of the pHashes where the thumbnails are noise-like); exact copies collapse to one
record first, so 100,000 copies of one image cost what one does.
"""

import itertools
import time
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from tfgpu import compat
from tfgpu.convert import columns, crops, near_search

RADIUS = 6  # pHash bits (of 64); JPEG q95->60, a 90% resize, a 2-px crop: 0-4 on photos
THUMB_RMS = 4.0  # grey levels; distinct garments of Fashion-MNIST: >= 5 (docs/data.md)
FLAT_STD = 2.0  # grey levels of the 16x16 thumbnail
SPREAD_PIXELS = 8.0  # of the thumbnail's 256: a deviation in fewer is grouped only if exact
MAX_LISTED = 100  # members listed per group in quality.json (its size is always given)
_CHUNK = 4096  # rows converted to float at once: they stay in a cache, memory stays bounded


@dataclass
class Records:
    """Every record's fingerprint, in one array per field; ``where[i]`` = (split, shard,
    position in the shard)."""

    where: "Where"
    exact: np.ndarray
    phash: np.ndarray
    mirror: np.ndarray
    thumbs: np.ndarray
    labels: np.ndarray
    files: list
    sides: np.ndarray


class Where:
    """``where[i]`` = (split, shard, position in the shard) of record i, made when asked:
    a tuple per record would cost a conversion of 70,000 small images ~0.05 CPU s, with
    the garbage collector's passes over them, for the few records that are in groups."""

    def __init__(self, parts: list):
        self._shards = [(split, name) for split, name, _ in parts]
        self._starts = np.cumsum([0] + [len(p["files"]) for _, _, p in parts])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, i) -> tuple:
        if not 0 <= i < len(self):
            raise IndexError(i)
        shard = int(np.searchsorted(self._starts, i, side="right")) - 1
        return (*self._shards[shard], int(i - self._starts[shard]))


def gather(shards: list) -> Records:
    """``shards``: (split, shard name, its worker result holding ``fingerprints``)."""
    parts = [(split, name, r["fingerprints"]) for split, name, r in shards]
    where = Where(parts)

    def cat(field, dtype, shape=()):
        arrays = [np.asarray(p[field], dtype=dtype).reshape((-1, *shape)) for _, _, p in parts]
        return np.concatenate(arrays) if arrays else np.zeros((0, *shape), dtype)

    side = columns.SMALL
    return Records(
        where,
        cat("exact", np.uint64),
        cat("phash", np.uint64),
        cat("mirror", np.uint64),
        cat("thumbs", np.uint8, (side, side)),
        cat("labels", np.int64),
        list(itertools.chain.from_iterable(p["files"] for _, _, p in parts)),
        cat("sides", np.int64),
    )


def find_groups(records: Records) -> tuple[list, dict]:
    """(groups, stats): each group an index array of >= 2 records (exact or near copies),
    largest first; stats counts flat images and the search's work."""
    keys, first, inverse = np.unique(records.exact, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    flat = _row_std(records.thumbs)[first] < FLAT_STD
    live = np.nonzero(~flat)[0]  # exact classes that take part in the near search
    # Gathered once (an array the size of the thumbnails, each copy ~0.01 CPU s a 70,000),
    # by np.take here and wherever rows are gathered: numpy's indexing takes 1.5-7 times as
    # long for rows this short (the same arrays).
    at = first[live]
    thumbs = np.take(records.thumbs, at, axis=0)
    pairs, search, space = near_pairs(records.phash[at], records.mirror[at], thumbs)
    cropped, crop_search = _cropped(pairs, thumbs, space)
    cropped = cropped[_informative(thumbs, cropped)]
    search.update(crop_search, crop_pairs=len(cropped))
    pairs = np.concatenate([pairs, cropped])
    component = _connected(live[pairs[:, 0]], live[pairs[:, 1]], len(keys))[inverse]
    grouped = np.nonzero(np.bincount(component)[component] > 1)[0]  # most records: alone
    order = grouped[np.argsort(component[grouped], kind="stable")]
    bounds = np.flatnonzero(np.diff(component[order])) + 1
    groups = np.split(order, bounds) if len(order) else []
    groups.sort(key=len, reverse=True)
    flat_images = int(flat[inverse].sum())
    return groups, dict(search, flat_images=flat_images, near_pairs=len(pairs))


def _connected(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """The connected component (an int array of ``n``) of each of ``n`` nodes that the
    edges ``a[k]``-``b[k]`` join."""
    # scipy imported here (and in near_search.kd_tree, crops.fine), not at the top: every
    # training run imports the converter (the demo dataset) and never searches; with
    # quiet.HIDDEN_WHILE_IMPORTING's scipy, a 6-update tiny_cnn run 4.38 -> 4.05 CPU-s.
    from scipy.sparse import coo_matrix  # noqa: PLC0415
    from scipy.sparse.csgraph import connected_components  # noqa: PLC0415

    graph = coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def near_pairs(direct: np.ndarray, mirror: np.ndarray, thumbs: np.ndarray) -> tuple:
    """(pairs (K, 2) of indices i < j that are near-duplicates as whole frames, search
    stats, the k-d tree's ``near_search.Space`` or None) of records with pHashes
    ``direct``, mirror pHashes ``mirror`` and 16x16 uint8 ``thumbs``."""
    # + 0.05: more than float32's rounding of the coordinates (< 0.005): no pair is missed
    reach = THUMB_RMS * np.sqrt(thumbs[0].size) + 0.05 if len(thumbs) else 0.0
    triples, stats, space = near_search.candidates(direct, mirror, thumbs, RADIUS, reach)
    near = triples[_thumbs_close(thumbs, triples), :2]
    near = near[_informative(thumbs, near)]
    pairs = np.unique(np.sort(near, axis=1), axis=0) if len(near) else np.zeros((0, 2), np.int64)
    return pairs, stats, space


def _cropped(pairs: np.ndarray, thumbs: np.ndarray, space) -> tuple:
    """(pairs (K, 2) near by the cropped-copy relation (``crops.py``), its stats) among
    one image of each group that ``pairs`` make: copies of one image would otherwise be
    each other's nearest, and a copy would not be alone that close. Not searched without
    a k-d tree (``space`` None: noise-like thumbnails)."""
    if space is None:
        said = "not searched: the thumbnails are noise-like (no k-d tree)"
        return np.zeros((0, 2), np.int64), {"crop_candidates": 0, "crops": said}
    group = _connected(pairs[:, 0], pairs[:, 1], len(thumbs))
    # Each group's first image, the groups in the tree's order (neighbours next to each
    # other in memory): the same pairs, ~15% cheaper on Fashion-MNIST (the neighbours'
    # thumbnails gathered from cache). Read off the tree's order, not sorted into it.
    count = group.max() + 1 if len(group) else 0
    first_of = np.full(count, len(group))
    np.minimum.at(first_of, group, np.arange(len(group)))
    first = space.order[first_of[group[space.order]] == space.order]
    slot = np.empty(count, np.int64)
    slot[group[first]] = np.arange(count)  # group g's place among them
    close = slot[group[space.close]]
    close = close[close[:, 0] != close[:, 1]]
    coordinates = np.take(space.coordinates, first, axis=0)
    found, stats = crops.crop_pairs(thumbs, first, coordinates, close, space.reach)
    return first[found], stats


def _row_std(thumbs: np.ndarray) -> np.ndarray:
    """Each thumbnail's standard deviation (grey levels), from its sums of whole grey levels
    and their squares (a third of numpy's std), in chunks. In float32, as products: exact
    (every partial sum a whole number under 2^24: 256 x 255^2 is), a third cheaper than
    in int32."""
    flat, out = thumbs.reshape(len(thumbs), -1), np.zeros(len(thumbs))
    ones = np.ones(flat.shape[1], np.float32)
    for start in range(0, len(flat), _CHUNK):
        part = flat[start : start + _CHUNK].astype(np.float32)
        mean = (part @ ones).astype(np.float64) / part.shape[1]
        out[start : start + len(part)] = np.einsum("ij,ij->i", part, part) / part.shape[1]
        out[start : start + len(part)] -= mean * mean
    return np.sqrt(np.maximum(out, 0))


def _thumbs_close(thumbs: np.ndarray, triples: np.ndarray) -> np.ndarray:
    """For each (i, j, flipped): whether the thumbnails (j's mirrored if flipped) differ by
    at most THUMB_RMS grey levels (root mean square)."""
    close = np.zeros(len(triples), bool)
    # The sum of squared differences in whole grey levels against THUMB_RMS^2 a pixel:
    # exact in float32 (256 x 255^2 < 2^24), the decisions of the RMS in float32 (its
    # mean and square root round nothing across 4.0), in a third of its time.
    limit = THUMB_RMS**2 * np.prod(thumbs.shape[1:])
    for start in range(0, len(triples), _CHUNK):
        i, j, flip = triples[start : start + _CHUNK].T
        a, b = (np.take(thumbs, k, axis=0) for k in (i, j))
        b = np.where(flip.astype(bool)[:, None, None], b[:, :, ::-1], b)  # mirrored as bytes
        difference = (a.astype(np.int16) - b).reshape(len(i), -1).astype(np.float32)
        close[start : start + len(i)] = np.einsum("ij,ij->i", difference, difference) <= limit
    return close


def _informative(thumbs: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """For each pair (i, j) (few: the pairs found near), whether both thumbnails' deviation
    from their median level is spread over at least SPREAD_PIXELS pixels (``_spread``)."""
    if not len(pairs):
        return np.zeros(0, bool)
    ends = np.unique(pairs)
    spread = np.zeros(len(thumbs))
    spread[ends] = _spread(thumbs[ends].reshape(len(ends), -1).astype(np.float64))
    return np.minimum(spread[pairs[:, 0]], spread[pairs[:, 1]]) >= SPREAD_PIXELS


def _spread(pixels: np.ndarray) -> np.ndarray:
    """Over how many pixels each row's deviation from its median lies: the participation
    ratio (sum |d|)^2 / sum d^2, from 1 (one pixel off a flat frame) to the row's length
    (all off by as much); a mirror's is its image's."""
    deviation = np.abs(pixels - np.median(pixels, axis=1, keepdims=True))
    energy = (deviation * deviation).sum(axis=1)
    return deviation.sum(axis=1) ** 2 / np.maximum(energy, 1e-9)


def check(shards: list, class_names: list) -> tuple[Records, list, dict]:
    """Runs the check over ``shards`` (see ``gather``); returns (records, groups, report)."""
    start = time.perf_counter()
    with compat.numpy_small_pages():  # short-lived arrays: ordinary pages
        records = gather(shards)
        with threadpool_limits(1, "blas"):  # small products: more BLAS threads only spin
            groups, stats = find_groups(records)
    report = build_report(records, groups, class_names, stats)
    report["seconds"] = round(time.perf_counter() - start, 3)
    return records, groups, report


def build_report(records: Records, groups: list, class_names: list, stats: dict) -> dict:
    """quality.json's content (without the dedupe part)."""
    entries = [_group_entry(records, g, class_names) for g in groups]
    entries.sort(key=lambda e: (not e["leak"], not e["label_conflict"], -e["size"]))
    leaks = [e for e in entries if e["leak"]]
    return {
        "method": {
            "exact": "XXH3 (64 bits) of the decoded pixels (a JPEG stored as it is: of its "
            "image data without its leading metadata segments)",
            "near": f"pHash (imagehash's: 32x32 grayscale, DCT, 8x8 low frequencies) within "
            f"{RADIUS} of 64 bits, of the image or its mirror, confirmed by 16x16 thumbnails "
            f"within {THUMB_RMS} grey levels RMS",
            "flat": f"images with a 16x16 thumbnail deviation under {FLAT_STD} grey levels, "
            f"or one spread over fewer than {SPREAD_PIXELS:g} of its pixels (a sliver of "
            "picture in a flat frame): grouped only when exactly equal",
            "search": f"indexed by {stats['index']}: every pair within both distances is "
            "found, not every pair is compared",
            "cropped": "each image against its nearest ones (k-d tree), after the crop of one "
            f"(each side 0-{crops.MAX_CROP:.0%}) that best aligns them: 8x8 thumbnails within "
            f"{crops.CROP_RMS} grey levels RMS, within the smoother one's detail (or "
            f"{crops.NOISE_RMS}), and within {crops.NEAREST_RATIO} of either's distance to "
            "its next nearest" + (f"; {stats['crops']}" if "crops" in stats else ""),
            "radius_bits": RADIUS,
            "thumb_rms": THUMB_RMS,
            "members_listed": MAX_LISTED,
        },
        "num_images": len(records.files),
        "num_groups": len(entries),
        "num_exact_groups": sum(e["kind"] == "exact" for e in entries),
        "num_near_groups": sum(e["kind"] == "near" for e in entries),
        "num_images_in_groups": sum(e["size"] for e in entries),
        "num_leak_groups": len(leaks),
        "leaked_images": _leaked(leaks),
        "num_label_conflicts": sum(e["label_conflict"] for e in entries),
        "flat_images": stats["flat_images"],
        "search": {
            "candidates": stats["candidates"],
            "near_pairs": stats["near_pairs"],
            "crop_candidates": stats["crop_candidates"],
            "crop_pairs": stats["crop_pairs"],
        },
        "groups": entries,
    }


def _leaked(leaks: list) -> dict:
    """{split: images of that split in a group that also holds a train image} (not train)."""
    out: dict = {}
    for entry in leaks:
        for split, n in entry["splits"].items():
            if split != "train":
                out[split] = out.get(split, 0) + n
    return out


def _group_entry(records: Records, group: np.ndarray, class_names: list) -> dict:
    splits: dict = {}
    labels: dict = {}
    for i in group:
        splits[records.where[i][0]] = splits.get(records.where[i][0], 0) + 1
        label = int(records.labels[i])
        name = class_names[label] if 0 <= label < len(class_names) else str(label)
        labels[name] = labels.get(name, 0) + 1
    exact = len(set(records.exact[group].tolist())) == 1
    members = [
        {
            "split": records.where[i][0],
            "shard": records.where[i][1],
            "position": records.where[i][2],
            "file": records.files[i],
            "label": int(records.labels[i]),
        }
        for i in group[:MAX_LISTED]
    ]
    return {
        "kind": "exact" if exact else "near",
        "size": len(group),
        "splits": splits,
        "labels": labels,
        "leak": "train" in splits and len(splits) > 1,
        "label_conflict": len(labels) > 1,
        "members": members,
    }


def summary(report: dict) -> str:
    """The check in one line, e.g. "duplicates: 12 groups (3 exact, 9 near) of 25 images;
    7 validation images also in train; 1 group with different labels; quality.json"."""
    if not report["num_groups"]:
        return f"duplicates: none among {report['num_images']} images"
    leaked = ", ".join(f"{n} {s}" for s, n in report["leaked_images"].items())
    return (
        f"duplicates: {report['num_groups']} groups ({report['num_exact_groups']} exact, "
        f"{report['num_near_groups']} near) of {report['num_images_in_groups']} images; "
        + (f"{leaked} images also in train" if leaked else "no split leaks into train")
        + f"; {report['num_label_conflicts']} groups with different labels"
    )
