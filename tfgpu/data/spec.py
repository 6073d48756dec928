"""Where training data comes from: converted TFRecords, TF's official ImageNet records, a
tensorflow-datasets dataset read from its own files, or nothing (synthetic batches). Each
becomes a ``DataSpec``: shard lists, counts, and ``parse(serialized) -> {"encoded": string,
"label": int32}``, so the one pipeline of ``pipeline.py`` (file shuffle, interleave, sharding)
serves them all. ``load_spec(config.data)`` picks the source.
"""

import logging
import os
from dataclasses import dataclass, replace
from typing import Callable, Optional

import tensorflow as tf

from tfgpu.errors import DataError
from tfgpu.data import broken
from tfgpu.data.dataset_info import read_info
from tfgpu.data.recordformat import INFO_FILE, parse_example, scan_shard, tfds_keys


# Marks the runtime errors of bad records, so tfgpu.main can print them as one line.
LABEL_ERROR = "tfgpu-data-error:"


@dataclass(frozen=True)
class DataSpec:
    """What the pipeline needs to know about a dataset."""

    data_dir: str
    num_classes: int
    label_offset: int
    train_files: tuple
    eval_files: tuple
    num_train: int
    num_eval: int
    # one serialized record -> {"encoded", "label"}; None = tfgpu/TF-ImageNet schema.
    parser: Optional[Callable] = None
    # The stored images' shorter sides {bucket edge px: count} per split, as the converter
    # counted them (dataset_info.json); None: not known. For --dct_scaled_decode=auto.
    train_sides: Optional[dict] = None
    eval_sides: Optional[dict] = None

    def summary(self) -> dict:
        """What workers of one run must agree on: classes, counts and shard names (not the
        directory, which may differ between machines)."""
        return {
            "num_classes": self.num_classes,
            "label_offset": self.label_offset,
            "num_train": self.num_train,
            "num_eval": self.num_eval,
            "train_shards": [os.path.basename(f) for f in self.train_files],
            "eval_shards": [os.path.basename(f) for f in self.eval_files],
            # --dct_scaled_decode=auto decides from them: one decision on every worker
            "train_sides": self.train_sides,
            "eval_sides": self.eval_sides,
        }

    def parse(self, serialized: tf.Tensor, origin=None, files=()) -> dict:
        """A record (scalar) or a vector of them -> {"encoded", "label"} of that shape; a label
        outside [0, num_classes) fails the run (it means a wrong --num_classes or
        --label_offset, which no skipping would fix) with an InvalidArgumentError naming the
        first such record: its index and shard when ``origin`` (``broken.origin``, the shape
        of ``serialized``) and ``files`` (the shards its file indices point into) are given."""
        if self.parser is None:
            example = parse_example(serialized, self.label_offset)
        elif serialized.shape.rank == 0:
            example = self.parser(serialized)
        else:  # a custom parser (tfds') takes one record at a time
            signature = {
                "encoded": tf.TensorSpec([], tf.string),
                "label": tf.TensorSpec([], tf.int32),
            }
            example = tf.map_fn(self.parser, serialized, fn_output_signature=signature)
        label = example["label"]
        with tf.control_dependencies([self._check_labels(label, origin, files)]):
            return dict(example, label=tf.identity(label))

    def _check_labels(self, label: tf.Tensor, origin, files) -> tf.Operation:
        """An op that fails (InvalidArgumentError, ``LABEL_ERROR``) when a label of ``label``
        is outside [0, num_classes), naming the first such record (``parse``). The message is
        made only then, in a ``tf.cond``: the check costs a comparison per record."""
        flat = tf.reshape(label, [-1])
        bad = tf.logical_or(flat < 0, flat >= self.num_classes)
        wrong = tf.reduce_any(bad)

        def named():
            k = tf.argmax(tf.cast(bad, tf.int32))
            where = tf.constant("a record")
            if origin is not None and files:
                at = tf.reshape(tf.cast(origin, tf.int64), [-1])[k]
                shard = tf.gather(
                    tf.constant([str(f) for f in files]), tf.bitwise.right_shift(at, 32)
                )
                index = tf.strings.as_string(tf.bitwise.bitwise_and(at, 0xFFFFFFFF))
                where = tf.strings.join(["record ", index, " of ", shard])
            text = tf.strings.join(
                [
                    f"{LABEL_ERROR} ",
                    where,
                    " has label ",
                    tf.strings.as_string(flat[k]),
                    f" (after --label_offset={self.label_offset}), outside [0, {self.num_classes})",
                ]
            )
            with tf.control_dependencies([tf.debugging.Assert(tf.logical_not(wrong), [text])]):
                return tf.constant(True)

        return tf.cond(wrong, named, lambda: tf.constant(True))


def _split_files(data_dir: str, info: dict, split: str) -> tuple:
    if info and split in info.get("splits", {}):
        names = [s["file"] for s in info["splits"][split]["shards"]]
        files = [os.path.join(data_dir, n) for n in names]
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            raise DataError(f"{missing[0]} is listed in {INFO_FILE} but does not exist")
        return tuple(files)
    return tuple(sorted(tf.io.gfile.glob(os.path.join(data_dir, f"{split}-*"))))


def load_data_spec(
    data_dir: str, num_classes: int = 0, label_offset: int = -1, skip_truncated: bool = False
) -> DataSpec:
    """Reads ``dataset_info.json`` (optional) and lists the shards of ``data_dir``.

    ``num_classes`` > 0 and ``label_offset`` >= 0 override the info file; without an info file
    (e.g. TensorFlow's official ImageNet records) ``num_classes`` is required. Truncated local
    shards are a DataError naming the file, or a warning when ``skip_truncated``.
    """
    if not os.path.isdir(data_dir):
        raise DataError(f"--data_dir={data_dir} is not a directory")
    info = read_info(data_dir)
    train = _split_files(data_dir, info, "train")
    evaluation = _split_files(data_dir, info, "validation")
    if not train:
        raise DataError(
            f"--data_dir={data_dir} holds no train-* shards (write them with tools/to_tfrecord.py)"
        )
    classes = num_classes or int(info.get("num_classes", 0))
    if classes <= 0:
        raise DataError(f"--data_dir={data_dir} has no {INFO_FILE}: set --num_classes")
    check_shards(train + evaluation, skip_truncated, _shard_counts(info))
    broken.reading(train + evaluation)
    counts = {k: v.get("num_examples", 0) for k, v in info.get("splits", {}).items()}
    spec = DataSpec(
        data_dir=data_dir,
        num_classes=classes,
        label_offset=label_offset if label_offset >= 0 else int(info.get("label_offset", 0)),
        train_files=train,
        eval_files=evaluation,
        num_train=counts.get("train") or count_records(train, skip_truncated),
        num_eval=counts.get("validation") or count_records(evaluation, skip_truncated),
        train_sides=_short_sides(info, "train"),
        eval_sides=_short_sides(info, "validation"),
    )
    if spec.num_train == 0:
        raise DataError(f"--data_dir={data_dir}: the train split holds no examples")
    if spec.num_eval == 0:
        logging.warning("%s has no validation examples: evaluation is skipped", data_dir)
    return spec


def _short_sides(info: dict, split: str):
    """The converter's histogram of ``split``'s shorter sides {px: count}, or None; a
    DataError when it is not one (a hand-edited info file)."""
    sides = info.get("splits", {}).get(split, {}).get("short_sides")
    if sides is None:
        return None
    try:
        if all(int(k) >= 0 and int(v) >= 0 for k, v in sides.items()):
            return sides
    except (AttributeError, TypeError, ValueError):
        pass
    raise DataError(
        f"{INFO_FILE}: splits.{split}.short_sides must map shorter sides in px to image "
        "counts, like the converter writes it"
    )


def count_records(files, skip_truncated: bool = False) -> int:
    """Counts records by reading them: only for datasets without a dataset_info.json."""
    if not files:
        return 0
    ds = tf.data.TFRecordDataset(list(files))
    ds = ds.ignore_errors() if skip_truncated else ds
    return int(ds.reduce(0, lambda n, _: n + 1))


def check_shards(files, skip_truncated: bool, expected: dict | None = None) -> tuple:
    """Raises a DataError naming the first truncated local shard, or (``skip_truncated``) logs
    a warning per such shard (the reader then stops at the break). A whole shard holding
    another number of records than ``expected[file name]`` (from dataset_info.json) is a
    DataError too. Remote paths (gs://, ...) are not checked: seeking them costs a request
    per record; nor are special files (pipes, devices)."""
    bad = []
    for path in files:
        if "://" in path or not os.path.isfile(path):
            continue  # remote or special (a pipe): scanning would cost or consume the data
        count, offset = scan_shard(path)
        want = (expected or {}).get(os.path.basename(path))
        if offset < 0 and want is not None and count != want:
            raise DataError(
                f"{path} holds {count} records but {INFO_FILE} says {want}: the info file "
                "belongs to another conversion; re-run tools/to_tfrecord.py"
            )
        if offset < 0:
            continue
        if not skip_truncated:
            raise DataError(
                f"{path} is truncated (its record at byte {offset} is cut short): re-copy or "
                "re-convert it, or pass --skip_truncated_shards to read what it holds"
            )
        logging.warning("%s is truncated at byte %d: reading its records before that", path, offset)
        bad.append(path)
    return tuple(bad)


def _shard_counts(info: dict) -> dict:
    """{shard file name: records} as dataset_info.json lists them."""
    return {
        shard["file"]: shard["num_examples"]
        for split in info.get("splits", {}).values()
        for shard in split.get("shards", [])
        if "num_examples" in shard
    }


def load_tfds_spec(name: str, data_dir: str = "", num_classes: int = 0) -> DataSpec:
    """A prepared tensorflow-datasets dataset, read from its own record files.

    Images stay encoded (tfds' ``SkipDecoding``), so they go through the same fused
    decode-and-crop as tfgpu's records. Nothing is downloaded: prepare the dataset first
    (``tfds build NAME --data_dir=DIR``). Needs tfrecord files (tfds' default format).
    """
    import tensorflow_datasets as tfds  # optional dependency: only for --tfds_name

    builder = tfds.builder(name, data_dir=data_dir or None)
    if not tf.io.gfile.exists(builder.data_dir):
        raise DataError(f"--tfds_name={name} is not prepared under {builder.data_dir}")
    info = builder.info
    try:
        image_key, label_key = tfds_keys(info)
    except ValueError as err:
        raise DataError(f"--tfds_name={name}: {err}") from None
    splits = info.splits
    eval_split = next((s for s in ("validation", "test") if s in splits), None)
    features = info.features

    def parse(serialized):
        example = features.deserialize_example(
            serialized, decoders={image_key: tfds.decode.SkipDecoding()}
        )
        return {"encoded": example[image_key], "label": tf.cast(example[label_key], tf.int32)}

    classes = num_classes or features[label_key].num_classes
    return DataSpec(
        data_dir=builder.data_dir,
        num_classes=classes,
        label_offset=0,
        train_files=tuple(str(p) for p in splits["train"].filepaths),
        eval_files=tuple(str(p) for p in splits[eval_split].filepaths) if eval_split else (),
        num_train=splits["train"].num_examples,
        num_eval=splits[eval_split].num_examples if eval_split else 0,
        parser=parse,
    )


def split_spec(spec: DataSpec, split: str) -> DataSpec:
    """``spec`` with ``split`` (train, validation, test, ...) as the files it evaluates: what
    ``tfgpu.evaluate`` and ``tfgpu.predict`` read with the evaluation's pipeline."""
    if split == "validation":
        files, count, sides = spec.eval_files, spec.num_eval, spec.eval_sides
    elif split == "train":
        files, count, sides = spec.train_files, spec.num_train, spec.train_sides
    elif spec.parser is not None or not spec.data_dir:
        raise DataError(f"--split={split}: only train and validation of this dataset are known")
    else:
        info = read_info(spec.data_dir)
        files = _split_files(spec.data_dir, info, split)
        broken.reading(files)
        count = info.get("splits", {}).get(split, {}).get("num_examples", 0)
        count = count or count_records(files)
        sides = _short_sides(info, split)
    if not files or not count:
        raise DataError(f"--split={split}: {spec.data_dir or 'the dataset'} holds no such examples")
    return replace(spec, eval_files=tuple(files), num_eval=count, eval_sides=sides)


def class_names(spec: DataSpec) -> list[str]:
    """The dataset's class names (dataset_info.json), else "0", "1", ..."""
    info = read_info(spec.data_dir) if spec.data_dir and os.path.isdir(spec.data_dir) else {}
    names = list(info.get("class_names", []))
    return names if len(names) == spec.num_classes else [str(i) for i in range(spec.num_classes)]


SYNTHETIC_TRAIN_EXAMPLES = 1_281_167  # ImageNet's: epochs of synthetic data mean something


def load_spec(data) -> DataSpec:
    """The DataSpec ``data`` (a config.DataConfig) names: synthetic, --tfds_name or --data_dir
    (``tfgpu.main`` sets --data_dir to the built-in demo dataset's when none is given)."""
    if data.synthetic_data:
        classes = data.num_classes or 1000
        return DataSpec("", classes, 0, (), (), SYNTHETIC_TRAIN_EXAMPLES, 0)
    if data.tfds_name:
        return load_tfds_spec(data.tfds_name, data.tfds_data_dir, data.num_classes)
    if not data.data_dir:
        raise DataError(
            "no --data_dir (nor --tfds_name or --synthetic_data): for the built-in demo dataset, "
            "run tfgpu.main, or pass data_dir=tfgpu.demo.build_demo_dataset()"
        )
    data_dir = os.path.expanduser(data.data_dir)
    return load_data_spec(data_dir, data.num_classes, data.label_offset, data.skip_truncated_shards)
