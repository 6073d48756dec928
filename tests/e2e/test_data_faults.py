"""Data that vanishes or lies (issue 48): a shard deleted or made unreadable while a run trains,
labels outside [0, num_classes) from a foreign converter's off-by-one or 1-based ImageNet
labels read as 0-based, and a dataset rewritten between a run and its resume. Each is one line
naming what is wrong; nothing trained before it is lost."""

import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import cli_flags, eval_ds, final_weights, make_image_arrays, train_ds
from weights import assert_same_weights
from PIL import Image

from tfgpu import train
from tfgpu.config import config_from, validate
from tfgpu.convert import plan
from tfgpu.convert.manifest import items_from_arrays
from tfgpu.data import identity
from tfgpu.data import spec as data_spec
from tfgpu.data.config import DataConfig
from tfgpu.distribute import InputShard
from tfgpu.errors import DataError
from tfgpu.recordformat import INFO_FILE, encode_example, parse_example
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


RUN = dict(
    model="tiny_cnn",
    image_size=32,
    global_batch_size=16,
    train_steps=36,
    optimizer="adam",
    learning_rate=0.001,
    weight_decay=0.0,
    deterministic=True,
    seed=7,
    steps_per_loop=2,
    log_every_steps=2,
    checkpoint_every_steps=4,
    export=False,
    shuffle_buffer=32,
    in_memory="off",  # read from the shards all along (a small set is otherwise read once)
)


@pytest.fixture(scope="module")
def uninterrupted(small_dataset, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("uninterrupted")
    flags = dict(data_dir=small_dataset, model_dir=str(model_dir), strategy="default")
    train.run(validate(config_from(**flags, **RUN)))
    return final_weights(model_dir)


# Started without the capability that overrides file permissions: as root too, a shard
# made chmod 000 is unreadable to the run.
NO_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
NO_OVERRIDE += ["--inh-caps", "-dac_override,-dac_read_search"]


def _start(data_dir, model_dir):
    flags = cli_flags(RUN, data_dir=data_dir, model_dir=model_dir, strategy="default")
    return subprocess.Popen(
        [*NO_OVERRIDE, sys.executable, "-m", "tfgpu.main", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


def _rows(model_dir) -> int:
    path = os.path.join(model_dir, "metrics.jsonl")
    return len(open(path).read().splitlines()) if os.path.exists(path) else 0


def _wait_for_rows(model_dir, rows: int, proc, timeout: float = 600) -> None:
    """Waits until ``model_dir``'s metrics.jsonl holds ``rows`` rows (2 steps each)."""
    deadline = time.time() + timeout
    while _rows(model_dir) < rows:
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no progress"
        time.sleep(0.05)


def _stopped_naming(proc, shard: str, why: str, model_dir) -> int:
    """Asserts the run stopped with one line naming ``shard`` and ``why``; returns the step
    of its newest checkpoint (kept)."""
    _, err = proc.communicate(timeout=600)
    lines = [line for line in err.splitlines() if line.startswith("tfgpu: error:")]
    assert proc.returncode == 2 and len(lines) == 1, err[-3000:]
    assert f"{shard}: {why}" in lines[0] and "run the same command again" in lines[0], lines
    assert "Traceback" not in err
    kept = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
    return int(kept.rsplit("-", 1)[1])


@pytest.mark.timeout(1200)  # three runs of 36 updates: 191 s on 2 cores at load ~17, more at ~21
def test_a_shard_unreadable_or_deleted_mid_run_is_named_and_the_run_resumes_once_it_is_back(
    small_dataset, uninterrupted, tmp_path
):
    """A network file system going away: a shard made unreadable (chmod 000) while the run
    reads it, then, in the resumed run, deleted. Each stops the run in one line naming it,
    the checkpoints kept; with the shard back the run ends with the uninterrupted weights."""
    data, run = shutil.copytree(small_dataset, tmp_path / "data"), tmp_path / "run"
    shard = str(data / [n for n in sorted(os.listdir(data)) if n.startswith("train-")][-1])
    proc = _start(data, run)
    _wait_for_rows(run, 2, proc)
    os.chmod(shard, 0)  # the next epoch opens it again
    kept = _stopped_naming(proc, shard, "it cannot be read (Permission denied)", run)
    assert 4 <= kept < RUN["train_steps"]
    os.chmod(shard, 0o644)
    proc = _start(data, run)
    _wait_for_rows(run, _rows(run) + 2, proc)
    os.rename(shard, shard + ".away")
    kept = _stopped_naming(proc, shard, "it is gone (No such file or directory)", run)
    os.rename(shard + ".away", shard)
    resumed = _start(data, run)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    assert f"resumed from {run}/checkpoints/ckpt-{kept}" in out + err
    assert_same_weights(run, uninterrupted, atol=1e-6)


def _config(data_dir, model_dir, **overrides):
    values = {**RUN, "train_steps": 8, **overrides}
    return validate(
        config_from(data_dir=str(data_dir), model_dir=str(model_dir), strategy="default", **values)
    )


@pytest.mark.timeout(900)  # two short runs in-process: 86 s on 2 cores shared at load ~17
def test_a_dataset_rewritten_between_a_run_and_its_resume_is_said_in_one_line(
    small_dataset, tmp_path
):
    data = shutil.copytree(small_dataset, tmp_path / "data")
    run = tmp_path / "run"
    train.run(_config(data, run))
    recorded = json.loads((run / identity.IDENTITY_FILE).read_text())
    assert recorded["train"]["examples"] == 96
    # Re-converted from other images: the same names, other records, other counts.
    shutil.rmtree(data)
    images, labels = make_image_arrays(100, seed=9)
    items = items_from_arrays(images, labels, prefix="other")
    plan.write_dataset(
        {"train": items[:80], "validation": items[80:]},
        class_names=["a", "b", "c", "d"],
        output_dir=str(data),
        source="tests",
        num_shards={"train": 4, "validation": 2},
    )
    config_before = (run / "config.json").read_bytes()
    with pytest.raises(DataError) as caught:
        train.run(_config(data, run, train_steps=12))
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"the data changed since the run in {run}")
    assert "the train split holds 80 examples, was 96" in line, line
    assert "another --model_dir" in line and f"move {run}/data.json away" in line, line
    assert (run / "config.json").read_bytes() == config_before  # nothing written
    # A copy of the same data elsewhere is the same data: moved, it resumes.
    (run / identity.IDENTITY_FILE).unlink()  # the user accepts the new data
    summary = train.run(_config(data, run, train_steps=12))
    assert summary["steps"] == 12
    assert json.loads((run / identity.IDENTITY_FILE).read_text())["train"]["examples"] == 80


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
