"""What a ``dataset_info.json`` may say, checked once when a dataset is opened.

The info file comes with the data, often from someone else: its shard names are joined to
``--data_dir``, its counts decide the number of steps and whether a split fits in memory, its
class count sizes the model. So every field the reader uses is checked before anything is
read: shard names are plain file names (no folders, no ``..``, nothing absolute), counts are
bounded whole numbers and a split's count is its shards' sum, ``num_classes`` fits
``class_names``. A field that is wrong is a DataError naming the file and the field. No
TensorFlow here, and nothing per record: the checks run once, when the dataset is opened.
"""

import os

from tfgpu.errors import DataError
from tfgpu.files import read_json
from tfgpu.data.recordformat import INFO_FILE, QUALITY_FILE

MAX_CLASSES = 1_000_000  # more is no classifier's head: a typo or a hostile file
MAX_EXAMPLES = 1 << 40  # a trillion examples per shard or split
MAX_LABEL_OFFSET = 1 << 20


def read_info(data_dir: str) -> dict:
    """``data_dir``'s dataset_info.json, checked (``check_info``); {} when there is none."""
    path = os.path.join(data_dir, INFO_FILE)
    try:
        info = read_json(path)
    except ValueError as err:
        raise DataError(str(err)) from None
    return check_info(info, path)


def check_info(info: dict, path: str) -> dict:
    """Returns ``info`` (the JSON object read from ``path``) when every field the reader uses
    is what the converter writes; else raises a DataError naming ``path`` and the field."""
    where = _Where(path)
    classes = info.get("num_classes")
    if "num_classes" in info:  # present, it must be right (null too is wrong)
        where.count("num_classes", classes, low=1, high=MAX_CLASSES)
    names = info.get("class_names")
    if "class_names" in info:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            where.fail("class_names", names, "a list of class names (strings)")
        if classes is not None and len(names) != classes:
            where.fail("class_names", f"{len(names)} names", f"num_classes = {classes} names")
        if len(names) > MAX_CLASSES:
            where.fail("class_names", f"{len(names)} names", f"at most {MAX_CLASSES}")
    if "label_offset" in info:
        where.count("label_offset", info["label_offset"], high=MAX_LABEL_OFFSET)
    splits = info.get("splits", {})
    if not isinstance(splits, dict):
        where.fail("splits", splits, "an object {split: {shards, num_examples, ...}}")
    for name, split in splits.items():
        _check_split(where, f"splits.{name}", split)
    return info


def _check_split(where: "_Where", field: str, split) -> None:
    if not isinstance(split, dict) or "shards" not in split:
        where.fail(field, split, "an object {shards, num_examples, ...}")
    shards = split["shards"]
    if not isinstance(shards, list):
        where.fail(f"{field}.shards", shards, "a list of {file, num_examples}")
    counts = []
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict):
            where.fail(f"{field}.shards[{i}]", shard, "an object {file, num_examples}")
        check_shard_name(where, f"{field}.shards[{i}].file", shard.get("file"))
        if "num_examples" in shard:
            counts.append(where.count(f"{field}.shards[{i}].num_examples", shard["num_examples"]))
    total = split.get("num_examples")
    if "num_examples" in split:
        where.count(f"{field}.num_examples", total)
        if shards and len(counts) == len(shards) and sum(counts) != total:
            where.fail(f"{field}.num_examples", total, f"its shards' sum, {sum(counts)}")
    per_class = split.get("per_class")
    if "per_class" in split:
        if not isinstance(per_class, dict):
            where.fail(f"{field}.per_class", per_class, "an object {class name: count}")
        for name, count in per_class.items():
            where.count(f"{field}.per_class[{name!r}]", count)


def check_shard_name(where: "_Where", field: str, name) -> None:
    """A shard's name must be a plain file name: joined to --data_dir, it must stay there."""
    plain = (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\0")
        and not os.path.isabs(name)
    )
    if not plain:
        where.fail(field, name, "a file name inside --data_dir (no folders, no '..')")


class _Where:
    """Raises the DataErrors of one info file."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, field: str, value, expected: str):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise DataError(f"{self.path}: {field} is {shown}, expected {expected}")

    def count(self, field: str, value, low: int = 0, high: int = MAX_EXAMPLES) -> int:
        """``value`` when it is a whole number in [low, high]; a DataError otherwise."""
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(field, value, f"a whole number in {low}..{high}")
        return value


def leak_line(data_dir: str, split: str) -> str:
    """One line on ``split``'s leaks into train, from the converter's quality.json in
    ``data_dir``: how many of its images have a copy (exact or near) in train, or what
    --dedupe dropped; "" when there is no such file (not checked) or the split is train."""
    path = os.path.join(data_dir, QUALITY_FILE)
    if not data_dir or split == "train" or not os.path.isfile(path):
        return ""
    try:
        quality = read_json(path)
        leaked = int(quality.get("leaked_images", {}).get(split, 0))
        dropped = quality.get("dedupe", {}).get("dropped", {}).get(split, 0)
    except (ValueError, AttributeError, TypeError) as err:
        return f"data: {path} is unreadable ({err}); leaks not known"
    if leaked and dropped >= leaked:
        return f"data: the {leaked} {split} images with a copy in train were dropped (--dedupe)"
    if leaked:
        return (
            f"data: {leaked} {split} images have an exact or near copy in train ({path}): "
            f"this {split} score is optimistic; convert with --dedupe=validation to drop them"
        )
    return f"data: checked for duplicates, no {split} image has a copy in train"
