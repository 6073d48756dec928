"""``--verify``: re-read a converted dataset the way the trainer reads it."""

import os

import numpy as np
import tensorflow as tf

from tfgpu.errors import ConvertError
from tfgpu.files import read_json
from tfgpu.data.recordformat import INFO_FILE, parse_example


def verify(output_dir: str) -> dict:
    """Re-reads a finished dataset: every record must parse (``recordformat.parse_example``, as
    the trainer parses), decode, and carry a label below ``num_classes``, and each shard must
    hold the count its info entry says. Returns ``{split: records read}``; raises ConvertError
    naming the fault."""
    try:
        info = read_json(os.path.join(output_dir, INFO_FILE))
    except ValueError:
        info = {}
    if not info.get("splits"):
        raise ConvertError(f"--output_dir={output_dir} has no readable {INFO_FILE}")
    shards = [s for split in info["splits"].values() for s in split["shards"]]
    files = [os.path.join(output_dir, s["file"]) for s in shards]
    try:
        counts, low, high = _read_all(files)
    except tf.errors.OpError:
        counts, low, high = _read_one_by_one(files)  # slower, but names the broken shard
    for shard, count in zip(shards, counts):
        if count != shard["num_examples"]:
            raise ConvertError(
                f"{shard['file']} holds {count} records, {INFO_FILE} says {shard['num_examples']}"
            )
    if low < 0 or high >= info["num_classes"]:
        raise ConvertError(f"labels run {low}..{high}, outside 0..{info['num_classes'] - 1}")
    return {k: v["num_examples"] for k, v in info["splits"].items()}


def _read_all(files: list) -> tuple:
    """Per-file record counts and the label range, reading all files in parallel."""
    import tensorflow as tf

    def check(index, serialized):
        example = parse_example(serialized)
        image = tf.io.decode_image(example["encoded"], channels=3, expand_animations=False)
        return index, example["label"], tf.size(image) > 0

    autotune = tf.data.AUTOTUNE
    data = tf.data.Dataset.from_tensor_slices((files, tf.range(len(files))))
    data = data.interleave(
        lambda f, i: tf.data.TFRecordDataset(f).map(lambda r: (i, r)),
        cycle_length=min(len(files), 8),
        num_parallel_calls=autotune,
        deterministic=False,
    )
    data = data.map(check, num_parallel_calls=autotune, deterministic=False).batch(1024)
    counts, low, high = np.zeros(len(files), np.int64), 0, -1
    for index, labels, _ in data.as_numpy_iterator():
        counts += np.bincount(index, minlength=len(files))
        low, high = min(low, labels.min()), max(high, labels.max())
    return counts, int(low), int(high)


def _read_one_by_one(files: list) -> tuple:
    import tensorflow as tf

    counts, low, high = [], 0, -1
    for path in files:
        try:
            shard_counts, shard_low, shard_high = _read_all([path])
        except tf.errors.OpError as err:
            raise ConvertError(
                f"{os.path.basename(path)} does not read back: {err.message.splitlines()[0]}"
            ) from None
        counts.append(shard_counts[0])
        low, high = min(low, shard_low), max(high, shard_high)
    return counts, low, high
