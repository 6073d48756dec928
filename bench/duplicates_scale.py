"""The duplicate check's grouping at ImageNet's scale, on synthetic fingerprints.

    python bench/duplicates_scale.py [--num_images=1281167] [--kind=smooth|noise]

No set of 1.28M photos fits this machine, so the records the converter's workers would hand
over are made here: 16x16 thumbnails and pHashes of random images (``smooth``: 4x4 random
grey levels blown up, with grain, like the low frequencies photos keep in a thumbnail;
``noise``: every thumbnail pixel random), 1% of them planted near-copies (grain of 2 grey
levels, half of them mirrored) of another. It times ``duplicates.check`` on them (gathering
the shards' records, the exact keys, the search, the groups, the report), prints its peak
resident memory above what the records take, and checks that every planted copy was found.
"""

import argparse
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from calibration import calibration  # noqa: E402

from tfgpu.convert import columns, duplicates, fingerprint  # noqa: E402

SHARD = 1250  # images a shard, as ImageNet's 1024 training shards hold


def make_records(n: int, kind: str, seed: int = 0) -> tuple[list, np.ndarray]:
    """(the check's shards of ``n`` synthetic records, the planted (copy, original) pairs);
    made a shard at a time, so that only the records stay in memory."""
    rng = np.random.default_rng(seed)
    copies = max(1, n // 100)
    originals = np.sort(rng.choice(n - copies, size=copies, replace=False))
    shards, kept = [], []
    for start in range(0, n - copies, SHARD):
        thumbs = _thumbs(rng, min(SHARD, n - copies - start), kind)
        chosen = originals[(originals >= start) & (originals < start + len(thumbs))]
        kept.append(thumbs[chosen - start])
        shards.append(_shard(thumbs, start))
    side = columns.THUMB
    planted = np.concatenate(kept) + rng.normal(0, 2, (copies, side, side))
    planted[::2] = planted[::2, :, ::-1]  # half of them mirrored
    for start in range(0, copies, SHARD):
        part = np.clip(planted[start : start + SHARD], 0, 255).astype(np.float32)
        shards.append(_shard(part, n - copies + start))
    return shards, np.stack([np.arange(n - copies, n), originals], axis=1)


def _thumbs(rng, m: int, kind: str) -> np.ndarray:
    side = columns.THUMB
    if kind == "smooth":
        thumbs = np.kron(rng.uniform(0, 255, (m, 4, 4)), np.ones((side // 4, side // 4)))
        thumbs += rng.normal(0, 12, thumbs.shape)
    else:
        thumbs = rng.uniform(0, 255, (m, side, side))
    return np.clip(thumbs, 0, 255).astype(np.float32)


def _shard(thumbs: np.ndarray, start: int) -> tuple:
    """One shard's (split, name, worker result) for records ``start``, ``start + 1``, ..."""
    direct, mirror = fingerprint.phashes(thumbs)
    record = {
        "exact": np.arange(start, start + len(thumbs), dtype=np.uint64),
        "phash": direct,
        "mirror": mirror,
        "thumbs": fingerprint.small(thumbs),
        "labels": np.zeros(len(thumbs), np.int64),
        "files": [f"img_{i}" for i in range(start, start + len(thumbs))],
        "sides": np.full(len(thumbs), 256, np.int64),
    }
    return "train", f"train-{start // SHARD:05d}", {"fingerprints": record}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_images", type=int, default=1_281_167)
    parser.add_argument("--kind", choices=["smooth", "noise"], default="smooth")
    args = parser.parse_args()
    print("calibration:", calibration())
    shards, planted = make_records(args.num_images, args.kind)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu, wall = time.process_time(), time.perf_counter()
    records, groups, report = duplicates.check(shards, ["c"])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    together = np.zeros(len(records.files), np.int64) - 1
    for g, members in enumerate(groups):
        together[members] = g
    found = (together[planted[:, 0]] >= 0) & (together[planted[:, 0]] == together[planted[:, 1]])
    print(
        f"{args.num_images:,} records ({args.kind}): the check took {cpu:.1f} CPU s, "
        f"{wall:.1f} s wall; peak memory {peak / 1024:,.0f} MB "
        f"(+{(peak - before) / 1024:,.0f} MB over the records as handed over)"
    )
    print(f"search: {report['method']['search']}; {report['search']}")
    print(f"planted copies found: {int(found.sum())} of {len(planted)}")


if __name__ == "__main__":
    main()
