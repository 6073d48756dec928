"""The duplicate check's end of a conversion: ``quality.json`` and, with ``--dedupe``, clean
splits.

The check (``duplicates.py``) runs once every shard is written, on the fingerprints the
workers kept in their done markers. ``dedupe`` then drops records from the shards that hold
them: each such shard is copied without those records (framing and bytes as they were, no
re-encoding) and renamed over the old one, and the shard's counts are corrected before
``dataset_info.json`` is written. The done markers keep the counts and fingerprints of the
shards as first written, so a run interrupted half-way finds the same groups again, and a
shard already cut (its record count says so) is left as it is.

- ``validation``: a group that holds a train image loses its images of every other split;
- ``all``: each group keeps one image (its first train image, else its first), in every split.
"""

import os
import struct

from tfgpu.convert import duplicates
from tfgpu.errors import ConvertError
from tfgpu.files import open_new, write_json
from tfgpu.data.recordformat import FOOTER_BYTES, HEADER_BYTES, QUALITY_FILE, scan_shard

MODES = ("none", "validation", "all")


def check_and_dedupe(output_dir, jobs, results: dict, class_names, mode: str) -> dict:
    """Checks the shards of ``jobs`` (their worker ``results`` by shard name, which hold
    the fingerprints), writes quality.json, and with ``mode`` != "none" drops the chosen
    records: ``results`` is corrected in place. Returns the report."""
    shards = [(job.split, job.name, results[job.name]) for job in jobs]
    records, groups, report = duplicates.check(shards, list(class_names))
    dropped = choose_drops(records, groups, mode)
    by_shard: dict = {}
    for i in dropped:
        split, shard, position = records.where[i]
        by_shard.setdefault(shard, []).append(i)
    for shard, indices in by_shard.items():
        positions = {records.where[i][2] for i in indices}
        before = results[shard]["num_examples"]
        drop_records(os.path.join(output_dir, shard), positions, before)
        results[shard] = _without(results[shard], records, indices)
    counts: dict = {}
    for i in dropped:
        counts[records.where[i][0]] = counts.get(records.where[i][0], 0) + 1
    report["dedupe"] = {"mode": mode, "dropped": counts}
    write_json(os.path.join(output_dir, QUALITY_FILE), report)
    return report


def choose_drops(records, groups: list, mode: str) -> list:
    """The record indices ``mode`` drops from ``groups`` (see the module's docstring)."""
    if mode == "none":
        return []
    drops = []
    for group in groups:
        train = [i for i in group if records.where[i][0] == "train"]
        if mode == "validation":
            drops += [i for i in group if train and records.where[i][0] != "train"]
        else:
            keep = train[0] if train else group[0]
            drops += [i for i in group if i != keep]
    return sorted(int(i) for i in drops)


def drop_records(path: str, positions: set, before: int) -> None:
    """Rewrites the shard ``path`` (``before`` records) without the records at
    ``positions``; a shard that already has that many fewer is left alone."""
    count, broken = scan_shard(path)
    if count == before - len(positions) and broken < 0:
        return
    if count != before or broken >= 0:
        raise ConvertError(
            f"{path} holds {count} records, its conversion wrote {before}: "
            "pass --overwrite to convert again"
        )
    with open(path, "rb") as source, open_new(path + ".tmp") as out:
        for position in range(before):
            header = source.read(HEADER_BYTES)
            (length,) = struct.unpack("<Q", header[:8])
            body = source.read(length + FOOTER_BYTES)
            if position not in positions:
                out.write(header + body)
        out.flush()
        os.fsync(out.fileno())
    os.replace(path + ".tmp", path)


def _without(result: dict, records, indices: list) -> dict:
    """A shard's worker result with the records ``indices`` taken out of its counts."""
    per_class = dict(result["per_class"])
    sides = dict(result["short_sides"])
    for i in indices:
        label = type(next(iter(per_class)))(int(records.labels[i]))  # int, or str from JSON
        per_class[label] -= 1
        side = str(records.sides[i])
        sides[side] -= 1
    return dict(
        result,
        num_examples=result["num_examples"] - len(indices),
        per_class=per_class,
        short_sides={k: v for k, v in sides.items() if v},
    )
