"""The converter's other sources: HDF5 arrays and a tensorflow-datasets dataset on disk."""

import io
import json
import os

import h5py
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tfgpu.data import recordformat
from tfgpu.cli import convert as cli
from tfgpu.convert import encode
from tfgpu.convert.manifest import BadImage
from tfgpu.data import spec as data_spec


def _run_cli(*args) -> int:
    return cli.main(["to_tfrecord", "--noprogress", *args])


def _records(files) -> dict:
    """filename -> (label, decoded uint8 image) of every record in ``files``."""
    spec = {"image/filename": tf.io.FixedLenFeature([], tf.string)}
    out = {}
    for serialized in tf.data.TFRecordDataset(list(files)):
        example = recordformat.parse_example(serialized)
        name = tf.io.parse_single_example(serialized, spec)["image/filename"].numpy().decode()
        image = tf.io.decode_image(example["encoded"], channels=3, expand_animations=False)
        out[name] = (int(example["label"]), image.numpy())
    return out


def test_hdf5_lossless_round_trip_is_exact(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (70, 9, 7, 3), dtype=np.uint8)
    labels = np.arange(70) % 3
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=images, chunks=(8, 9, 7, 3))
        f.create_dataset("y", data=labels).attrs["class_names"] = ["ant", "bee", "cat"]
    out = tmp_path / "out"
    args = ["--hdf5_images=x", "--hdf5_labels=y", "--lossless", "--num_workers=2", "--verify"]
    assert _run_cli(f"--input={path}", f"--output_dir={out}", "--num_shards=2", *args) == 0
    spec = data_spec.load_data_spec(str(out))
    assert (spec.num_classes, spec.num_train, spec.num_eval) == (
        3,
        64,
        6,
    )  # 10% of each class, rounded
    rows = _records(spec.train_files + spec.eval_files)
    assert len(rows) == 70
    for name, (label, image) in rows.items():
        i = int(name[name.index("[") + 1 : -1])  # "/x[12]"
        assert label == labels[i] and np.array_equal(image, images[i])
    info = json.loads((out / recordformat.INFO_FILE).read_text())
    assert info["class_names"] == ["ant", "bee", "cat"]


def test_hdf5_train_and_validation_groups_grayscale(tmp_path):
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        for split, n in (("train", 10), ("validation", 4)):
            f.create_dataset(f"{split}/images", data=np.full((n, 5, 5), 200, np.uint8))
            f.create_dataset(f"{split}/labels", data=np.arange(n) % 2)
    out = tmp_path / "out"
    assert _run_cli(f"--input={path}", f"--output_dir={out}", "--num_workers=0") == 0
    info = json.loads((out / recordformat.INFO_FILE).read_text())
    assert info["num_examples"] == {"train": 10, "validation": 4}
    assert info["class_names"] == ["0", "1"]


@pytest.mark.parametrize(
    "make, flags, message",
    [
        (
            lambda f: f.create_dataset("images", data=np.zeros((2, 3, 3))),
            [],
            "--hdf5_labels=labels: no dataset",
        ),
        (
            lambda f: (
                f.create_dataset("images", data=np.zeros((2, 3, 3))),
                f.create_dataset("labels", data=[0, 1]),
            ),
            [],
            "--hdf5_images=images: ",
        ),
        (
            lambda f: (
                f.create_dataset("images", data=np.zeros((2, 3, 3), np.uint8)),
                f.create_dataset("labels", data=[0]),
            ),
            [],
            "expected 2 integer labels",
        ),
        (lambda f: None, ["--hdf5_images=pix"], "--hdf5_images=pix: no dataset pix"),
    ],
)
def test_hdf5_errors_name_the_flag(tmp_path, capsys, make, flags, message):
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        make(f)
    assert _run_cli(f"--input={path}", f"--output_dir={tmp_path / 'o'}", *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("to_tfrecord: error: ") and message in err


def _prepared_tfds_dataset(data_dir: str) -> dict:
    """Writes a tiny tensorflow-datasets dataset (train 12, test 5 PNGs) as `tfds build`
    would leave it, without a builder class or any download; returns the train images."""
    import tensorflow_datasets as tfds

    features = tfds.features.FeaturesDict(
        {
            "image": tfds.features.Image(shape=(None, None, 3)),
            "label": tfds.features.ClassLabel(names=["zero", "one", "two"]),
        }
    )
    folder = os.path.join(data_dir, "tiny_images", "1.0.0")
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    infos, train = [], {}
    for split, n in (("train", 12), ("test", 5)):
        path = os.path.join(folder, f"tiny_images-{split}.tfrecord-00000-of-00001")
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(n):
                image = rng.integers(0, 256, (8 + i, 6, 3), dtype=np.uint8)
                writer.write(features.serialize_example({"image": image, "label": i % 3}))
                if split == "train":
                    train[f"tiny_images/train[{i}]"] = (i % 3, image)
        infos.append(
            tfds.core.SplitInfo(name=split, shard_lengths=[n], num_bytes=os.path.getsize(path))
        )
    tfds.folder_dataset.write_metadata(data_dir=folder, features=features, split_infos=infos)
    return train


def test_tfds_dataset_from_a_local_data_dir(tmp_path):
    data_dir = str(tmp_path / "tfds")
    train = _prepared_tfds_dataset(data_dir)
    out = tmp_path / "out"
    flags = [
        "--tfds_name=tiny_images",
        f"--tfds_data_dir={data_dir}",
        "--num_shards=3",
        "--lossless",
    ]
    assert _run_cli(*flags, f"--output_dir={out}", "--num_workers=2", "--verify") == 0
    info = json.loads((out / recordformat.INFO_FILE).read_text())
    assert info["class_names"] == ["zero", "one", "two"]
    assert info["num_examples"] == {"train": 12, "validation": 5}  # test serves as validation
    assert [s["num_examples"] for s in info["splits"]["train"]["shards"]] == [4, 4, 4]
    spec = data_spec.load_data_spec(str(out))
    rows = _records(spec.train_files)
    assert rows.keys() == train.keys()
    for name, (label, image) in rows.items():
        assert label == train[name][0] and np.array_equal(image, train[name][1])
    assert _run_cli("--tfds_name=nope", f"--tfds_data_dir={data_dir}", f"--output_dir={out}2") == 2


def test_png_bytes_from_any_source_are_checked_like_files():
    assert encode.encode_image(_png(np.zeros((3, 3, 3), np.uint8)))[1] == "JPEG"
    with pytest.raises(BadImage):
        encode.encode_image(_png(np.zeros((3, 3, 3), np.uint8))[:20])


def _png(array) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()
