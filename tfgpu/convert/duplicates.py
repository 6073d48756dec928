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
  have no meaningful pHash (all share one) and are grouped only when exactly equal.

Groups are the connected components of both relations. The search is not over all pairs:
multi-index hashing (Norouzi et al., 2012) cuts the 64 bits into ``m`` bands; two hashes
within ``RADIUS`` bits agree to within ``RADIUS // m`` bits on at least one band (the
pigeonhole), so only the records whose band lies that close to a query's are compared, found
by a sorted search (``m`` chosen for the number of hashes, ``_plan_bands``). The thumbnails
narrow it further, losing nothing: two thumbnails within ``THUMB_RMS`` have means and standard
deviations within ``THUMB_RMS`` of each other (Cauchy-Schwarz, the triangle inequality), so
each band's key also carries the cell of a (mean, deviation) grid of that step, and a query
looks in the (at most 4) cells within reach. Small centred images (Fashion-MNIST) have pHashes
so alike that the bands alone leave 170 million candidate pairs for 70,000 images; the cells
leave a few million. Exact copies collapse to one record first, so 100,000 copies of one
image cost what one does.
"""

import itertools
import time
from dataclasses import dataclass

import numpy as np

from tfgpu.convert import fingerprint

RADIUS = 6  # pHash bits (of 64); JPEG q95->60, a 90% resize, a 2-px crop: 0-4 on photos
THUMB_RMS = 4.0  # grey levels; distinct garments of Fashion-MNIST: >= 5 (docs/data.md)
FLAT_STD = 2.0  # grey levels of the 16x16 thumbnail
MAX_LISTED = 100  # members listed per group in quality.json (its size is always given)
_PROBES_AT_ONCE = 1 << 21  # queries x probes searched per numpy call (bounds memory)
_PLAN_SAMPLE = 500  # queries the band plans are tried on
_MAX_PROBES = 1000  # band plans that probe more patterns per band are not tried


@dataclass
class Records:
    """Every record's fingerprint, in one array per field; ``where[i]`` = (split, shard,
    position in the shard)."""

    where: list
    exact: np.ndarray
    phash: np.ndarray
    mirror: np.ndarray
    thumbs: np.ndarray
    labels: np.ndarray
    files: list
    sides: list


def gather(shards: list) -> Records:
    """``shards``: (split, shard name, its worker result holding ``fingerprints``)."""
    parts = [(split, name, fingerprint.unpack(r["fingerprints"])) for split, name, r in shards]
    where = [(s, n, i) for s, n, p in parts for i in range(len(p["files"]))]

    def cat(field, dtype, shape=()):
        arrays = [np.asarray(p[field], dtype=dtype).reshape((-1, *shape)) for _, _, p in parts]
        return np.concatenate(arrays) if arrays else np.zeros((0, *shape), dtype)

    side = fingerprint.SMALL
    return Records(
        where,
        cat("exact", np.uint64),
        cat("phash", np.uint64),
        cat("mirror", np.uint64),
        cat("thumbs", np.uint8, (side, side)),
        cat("labels", np.int64),
        [f for _, _, p in parts for f in p["files"]],
        [s for _, _, p in parts for s in p["sides"]],
    )


def find_groups(records: Records) -> tuple[list, dict]:
    """(groups, stats): each group an index array of >= 2 records (exact or near copies),
    largest first; stats counts flat images and the search's work."""
    keys, first, inverse = np.unique(records.exact, return_index=True, return_inverse=True)
    thumbs = records.thumbs[first].astype(np.float32)
    flat = thumbs.reshape(len(first), fingerprint.SMALL**2).std(axis=1) < FLAT_STD
    live = np.nonzero(~flat)[0]  # exact classes that take part in the near search
    pairs, search = near_pairs(
        records.phash[first[live]], records.mirror[first[live]], thumbs[live]
    )
    root = np.arange(len(keys))
    for a, b in live[pairs]:
        ra, rb = _find(root, a), _find(root, b)
        root[max(ra, rb)] = min(ra, rb)
    component = np.array([_find(root, i) for i in range(len(keys))])[inverse.reshape(-1)]
    order = np.argsort(component, kind="stable")
    bounds = np.flatnonzero(np.diff(component[order])) + 1
    groups = [g for g in np.split(order, bounds) if len(g) > 1]
    groups.sort(key=len, reverse=True)
    flat_images = int(np.isin(inverse.reshape(-1), np.nonzero(flat)[0]).sum())
    return groups, dict(search, flat_images=flat_images, near_pairs=len(pairs))


def _find(root: np.ndarray, i: int) -> int:
    while root[i] != i:
        root[i] = root[root[i]]  # path halving
        i = root[i]
    return int(i)


def near_pairs(direct: np.ndarray, mirror: np.ndarray, thumbs: np.ndarray) -> tuple:
    """(pairs (K, 2) of indices i < j that are near-duplicates, search stats)."""
    n = len(direct)
    if n < 2:
        return np.zeros((0, 2), np.int64), {"bands": [], "probe_bits": 0, "candidates": 0}
    entries = np.concatenate([direct, mirror])
    owner = np.concatenate([np.arange(n), np.arange(n)])
    flipped = np.repeat([False, True], n)
    cell, reach = _cells(thumbs)
    widths, per_band = _plan_bands(direct, entries, cell[owner], reach)
    found, candidates = [], 0
    for shift, width in _bands(widths):
        masks = _probe_masks(width, per_band)
        for a, e in _band_matches(direct, entries, cell[owner], reach, shift, width, masks):
            candidates += len(a)
            b = owner[e]
            keep = (a != b) & (np.bitwise_count(direct[a] ^ entries[e]) <= RADIUS)
            low, high = np.minimum(a[keep], b[keep]), np.maximum(a[keep], b[keep])
            found.append((low * n + high) * 2 + flipped[e][keep])
    codes = np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)
    triples = np.stack([codes // 2 // n, codes // 2 % n, codes % 2], axis=1)
    near = _thumbs_close(thumbs, triples)
    pairs = np.unique(triples[near, :2], axis=0) if len(triples) else np.zeros((0, 2), np.int64)
    stats = {"bands": list(widths), "probe_bits": per_band, "candidates": int(candidates)}
    return pairs, stats


def _cells(thumbs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each thumbnail's cell, the (N, 4) cells a query must look in): a grid of step
    2 x THUMB_RMS on (mean, standard deviation), cells numbered mean_bin << 6 | std_bin;
    a cell looked in twice is replaced by _NO_CELL."""
    flat = thumbs.reshape(len(thumbs), -1)
    mean, std = flat.mean(axis=1), flat.std(axis=1)
    step = 2 * THUMB_RMS

    def bins(x):
        return np.floor(x / step).astype(np.int64)

    low_m, high_m = bins(mean - THUMB_RMS), bins(mean + THUMB_RMS)
    low_s, high_s = bins(std - THUMB_RMS), bins(std + THUMB_RMS)
    reach = np.stack(
        [
            low_m << 6 | low_s,
            np.where(high_s != low_s, low_m << 6 | high_s, _NO_CELL),
            np.where(high_m != low_m, high_m << 6 | low_s, _NO_CELL),
            np.where((high_m != low_m) & (high_s != low_s), high_m << 6 | high_s, _NO_CELL),
        ],
        axis=1,
    )
    return (bins(mean) << 6 | bins(std)).astype(np.uint64), (reach & 0xFFF).astype(np.uint64)


_NO_CELL = 0xFFF  # a cell no thumbnail is in (mean bins stop at 255 / 8 < 63)


def _band_matches(direct, entries, entry_cells, reach, shift, width, masks):
    """Yields (query indices, entry indices) whose band ``[shift, shift + width)`` lies
    within the ``masks``' bit patterns of each other, in cells the query ``reach``es: a
    sorted search per probe."""
    keys = _band(entries, shift, width) << np.uint64(12) | entry_cells
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    fan = len(masks) * reach.shape[1]
    step = max(1, _PROBES_AT_ONCE // fan)
    for start in range(0, len(direct), step):
        index = np.arange(start, min(start + step, len(direct)))
        lo, count = _lookup(sorted_keys, direct[index], reach[index], shift, width, masks)
        total = int(count.sum())
        if total:
            queries = np.repeat(np.repeat(index, fan), count)
            offsets = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
            yield queries, order[np.repeat(lo, count) + offsets]


def _band(hashes: np.ndarray, shift: int, width: int) -> np.ndarray:
    return (hashes >> np.uint64(shift)) & np.uint64((1 << width) - 1)


def _bands(widths: list) -> list:
    """[(shift, width)] of bands of ``widths`` bits, from the top bit down."""
    tops = 64 - np.cumsum(widths)
    return [(int(t), int(w)) for t, w in zip(tops, widths)]


def _lookup(sorted_keys, queries, reach, shift, width, masks) -> tuple:
    """(first match, number of matches) in ``sorted_keys`` of every probe of ``queries``:
    their band XOR each mask, in each cell of their ``reach``."""
    bands = (_band(queries, shift, width)[:, None] ^ masks[None, :]) << np.uint64(12)
    probes = (bands[:, :, None] | reach[:, None, :]).reshape(-1)
    real = np.broadcast_to(reach[:, None, :] != _NO_CELL, (len(queries), *bands.shape[1:], 4))
    real = real.reshape(-1)
    lo = np.zeros(len(probes), np.int64)
    count = np.zeros(len(probes), np.int64)
    lo[real] = np.searchsorted(sorted_keys, probes[real], "left")
    count[real] = np.searchsorted(sorted_keys, probes[real], "right") - lo[real]
    return lo, count


def _thumbs_close(thumbs: np.ndarray, triples: np.ndarray) -> np.ndarray:
    """For each (i, j, flipped): whether the thumbnails (j's mirrored if flipped) differ by
    at most THUMB_RMS grey levels (root mean square)."""
    # First on 4x4 block means, whose RMS difference is never larger (a mean of squares is
    # at least the square of the mean): 16 numbers a pair, not 256, for most pairs.
    side = thumbs.shape[1] // 4
    coarse = thumbs.reshape(len(thumbs), 4, side, 4, side).mean(axis=(2, 4))
    close = np.zeros(len(triples), bool)
    for start in range(0, len(triples), 1 << 16):
        i, j, flip = triples[start : start + (1 << 16)].T
        flip = flip.astype(bool)[:, None, None]
        near = np.nonzero(_rms(coarse[i], coarse[j], flip) <= THUMB_RMS)[0]
        i, j, flip = i[near], j[near], flip[near]
        close[start + near] = _rms(thumbs[i], thumbs[j], flip) <= THUMB_RMS
    return close


def _rms(a: np.ndarray, b: np.ndarray, flip: np.ndarray) -> np.ndarray:
    """Root mean square difference of images ``a`` and ``b`` (mirrored where ``flip``)."""
    other = np.where(flip, b[:, :, ::-1], b)
    return np.sqrt(((a - other) ** 2).mean(axis=(1, 2)))


def _plan_bands(direct, entries, entry_cells, reach) -> tuple[list, int]:
    """(band widths, bits within which a band is probed): of the splits of 64 bits that
    find every pair within RADIUS, the one with the least work (probes plus candidates)
    counted for a sample of the queries: real hashes are far from uniform."""
    rng = np.random.default_rng(0)
    sample = rng.choice(len(direct), size=min(len(direct), _PLAN_SAMPLE), replace=False)
    best = None
    for m in range(2, 9):
        widths, per_band = [64 // m + (i < 64 % m) for i in range(m)], RADIUS // m
        masks = _probe_masks(min(widths), per_band)
        if len(masks) > _MAX_PROBES:
            continue
        work = 0
        for shift, width in _bands(widths):
            keys = np.sort(_band(entries, shift, width) << np.uint64(12) | entry_cells)
            _, count = _lookup(keys, direct[sample], reach[sample], shift, width, masks)
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


def check(shards: list, class_names: list) -> tuple[Records, list, dict]:
    """Runs the check over ``shards`` (see ``gather``); returns (records, groups, report)."""
    start = time.perf_counter()
    records = gather(shards)
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
            "exact": "SHA-1 of the decoded pixels (a JPEG stored as it is: of its image data "
            "without metadata segments)",
            "near": f"pHash (imagehash's: 32x32 grayscale, DCT, 8x8 low frequencies) within "
            f"{RADIUS} of 64 bits, of the image or its mirror, confirmed by 16x16 thumbnails "
            f"within {THUMB_RMS} grey levels RMS",
            "flat": f"images with a 16x16 thumbnail deviation under {FLAT_STD} grey levels: "
            "grouped only when exactly equal",
            "search": "multi-index hashing: every pair within the radius is found; "
            f"bands {stats['bands']} bits, probed within {stats['probe_bits']} bits",
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
        "search": {"candidates": stats["candidates"], "near_pairs": stats["near_pairs"]},
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
