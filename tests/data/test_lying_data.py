"""Data that lies (issue 48): labels outside [0, num_classes) from a foreign converter's
off-by-one, or 1-based ImageNet labels read as 0-based, each named in one line by shard and
record; what changed in a dataset said shard by shard (a run that meets it:
tests/e2e/test_data_faults.py); a dataset_info.json that disagrees with its shards, an empty
train split."""

import dataclasses
import io
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from conftest import eval_ds, make_image_arrays, train_ds
from PIL import Image

from tfgpu.convert import plan
from tfgpu.data import identity
from tfgpu.data import spec as data_spec
from tfgpu.data.config import DataConfig
from tfgpu.distribute import InputShard
from tfgpu.errors import DataError
from tfgpu.data.recordformat import INFO_FILE, encode_example, parse_example
from tfgpu.train.op_errors import translate

CFG = DataConfig(image_size=32, shuffle_buffer=16)


def _jpeg(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _write_shards(folder, labels: dict, info_classes: int = 0) -> None:
    """Shards named as TF's ImageNet converter names them, {file name: labels}; with
    ``info_classes`` a dataset_info.json as a foreign converter would write it (no offset)."""
    os.makedirs(folder, exist_ok=True)
    images, _ = make_image_arrays(sum(map(len, labels.values())), size=36)
    n = 0
    for name, shard_labels in labels.items():
        with tf.io.TFRecordWriter(os.path.join(folder, name)) as w:
            for label in shard_labels:
                w.write(encode_example(_jpeg(images[n]), label, 36, 36, "JPEG", f"{n}.jpg"))
                n += 1
    if info_classes:
        splits = {}
        for name, shard_labels in labels.items():
            split = splits.setdefault(name.split("-")[0], {"shards": [], "num_examples": 0})
            split["shards"].append({"file": name, "num_examples": len(shard_labels)})
            split["num_examples"] += len(shard_labels)
        info = {"num_classes": info_classes, "splits": splits}
        with open(os.path.join(folder, INFO_FILE), "w") as f:
            json.dump(info, f)


def _label_error(ds) -> str:
    """The one line tfgpu makes of the error that reading ``ds`` ends with."""
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        for _ in ds.take(50):
            pass
    error = translate(caught.value)
    assert isinstance(error, DataError), caught.value
    assert "\n" not in error.message
    return error.message


def _stored_label(line: str) -> int:
    """The label stored in the record ``line`` names ("record I of PATH has label ...")."""
    index, rest = line.split("record ", 1)[1].split(" of ", 1)
    path = rest.split(" has label ", 1)[0]
    record = list(tf.data.TFRecordDataset(path).skip(int(index)).take(1))[0]
    return int(parse_example(record)["label"])


@pytest.mark.fast
def test_a_foreign_converters_off_by_one_is_named_by_shard_and_record(tmp_path):
    """Labels 1..4 for 4 classes (a converter counting from 1): the first record met with
    label 4 is named, its shard and index in it, before a batch holds it."""
    labels = {f"train-0000{i}-of-00002": [1 + (3 * i + k) % 4 for k in range(12)] for i in (0, 1)}
    labels |= {"validation-00000-of-00001": [2, 1, 3, 4, 1]}
    _write_shards(tmp_path, labels, info_classes=4)
    spec = data_spec.load_data_spec(str(tmp_path))
    line = _label_error(train_ds(spec, CFG, InputShard(1, 0), 8, 8, deterministic=True))
    assert f"of {tmp_path}/train-0000" in line and "has label 4" in line, line
    assert "outside [0, 4)" in line and "--label_offset" in line, line
    assert _stored_label(line) == 4  # the record named is one that holds it
    line = _label_error(eval_ds(spec, CFG, InputShard(1, 0), 5, 5))
    assert f"record 3 of {tmp_path}/validation-00000-of-00001 has label 4" in line, line


@pytest.mark.fast
def test_one_based_imagenet_labels_read_as_zero_based_are_named_and_offset_1_reads_them(
    tmp_path,
):
    """TF's official ImageNet records (no dataset_info.json) count classes from 1: read with
    --label_offset=0 the one record of the last class is named; with 1 every batch reads."""
    labels = {"train-00000-of-00002": [1, 2, 3, 1, 2, 3, 1, 2], "train-00001-of-00002": [3] * 8}
    labels["train-00001-of-00002"][5] = 4
    _write_shards(tmp_path, labels)
    spec = data_spec.load_data_spec(str(tmp_path), num_classes=4, label_offset=0)
    line = _label_error(train_ds(spec, CFG, InputShard(1, 0), 4, 4, deterministic=True))
    assert line.startswith(f"record 5 of {tmp_path}/train-00001-of-00002 has label 4 "), line
    spec = data_spec.load_data_spec(str(tmp_path), num_classes=4, label_offset=1)
    batches = list(train_ds(spec, CFG, InputShard(1, 0), 4, 4, deterministic=True).take(8))
    seen = np.concatenate([b["label"].numpy() for b in batches])
    assert sorted(set(seen.tolist())) == [0, 1, 2, 3]


@pytest.mark.fast
def test_what_changed_in_a_dataset_is_said_shard_by_shard(small_dataset, tmp_path):
    data = shutil.copytree(small_dataset, tmp_path / "data")
    spec = data_spec.load_data_spec(str(data))
    before = identity.identity(spec)
    moved = data_spec.load_data_spec(shutil.copytree(data, tmp_path / "moved"))
    assert identity.differences(before, identity.identity(moved)) == []  # a copy: the same
    with open(spec.train_files[1], "r+b") as f:  # rewritten in place, the same size
        f.seek(20)
        f.write(b"\xff")
    fewer = dataclasses.replace(spec, train_files=spec.train_files[:3], num_train=72)
    name = os.path.basename
    assert identity.differences(before, identity.identity(fewer)) == [
        "the train split holds 72 examples, was 96",
        f"{name(spec.train_files[3])} is gone",
        f"{name(spec.train_files[1])} was rewritten (same size, other first bytes)",
    ]
    assert identity.differences(
        before, identity.identity(dataclasses.replace(moved, num_classes=5))
    ) == ["num_classes 5, was 4"]


@pytest.mark.fast
def test_dataset_info_that_disagrees_with_the_shards_is_named(small_dataset, tmp_path):
    data = str(shutil.copytree(small_dataset, tmp_path / "data"))
    info_path = os.path.join(data, "dataset_info.json")
    info = json.load(open(info_path))
    info["splits"]["train"]["shards"][1]["num_examples"] += 3
    info["splits"]["train"]["num_examples"] += 3  # the file adds up; the shard on disk does not
    json.dump(info, open(info_path, "w"))
    with pytest.raises(DataError, match=r"train-00001-of-00004.tfrecord holds \d+ records but"):
        data_spec.load_data_spec(data)


@pytest.mark.fast
def test_empty_train_split_is_an_error(tmp_path):
    plan.write_dataset(
        {"train": [], "validation": []}, ["a"], str(tmp_path), "t", {"train": 1, "validation": 1}
    )
    with pytest.raises(DataError, match="the train split holds no examples"):
        data_spec.load_data_spec(str(tmp_path))
