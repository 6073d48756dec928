"""The converter on small generated image folders, bad inputs included."""

import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tfgpu import files
from tfgpu.data import recordformat
from tfgpu.cli import convert as cli
from tfgpu.convert import encode, plan, verify, worker
from tfgpu.errors import ConvertError
from tfgpu.convert.manifest import BadImage, EncodeOptions, Item
from tfgpu.data import spec as data_spec

RNG = np.random.default_rng(0)


def _image(mode: str = "RGB", size=(24, 18)) -> Image.Image:
    channels = {"L": 1, "RGB": 3, "RGBA": 4, "CMYK": 4}[mode]
    array = RNG.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(array[..., 0] if channels == 1 else array, mode)


def _encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **kwargs)
    return out.getvalue()


# The inputs of a realistic messy folder: (file name, bytes, expected reason or None).
def _bad_and_odd_files() -> list:
    jpeg = _encoded(_image(), "JPEG")
    return [
        ("cmyk.jpg", _encoded(_image("CMYK"), "JPEG"), None),
        ("gray.jpg", _encoded(_image("L"), "JPEG"), None),
        ("alpha.png", _encoded(_image("RGBA"), "PNG"), None),
        ("bitmap.bmp", _encoded(_image(), "BMP"), None),
        ("anim.gif", _encoded(_image().convert("P"), "GIF"), None),
        ("ünïcødé 猫.jpg", jpeg, None),
        ("truncated.jpg", jpeg[: len(jpeg) // 2], "cannot decode"),
        (
            "garbage.jpg",
            b"\xff\xd8\xff" + bytes(RNG.integers(0, 256, 500, dtype=np.uint8)),
            "not an image",
        ),
        ("zero.jpg", b"", "empty file"),
        ("readme.txt", b"not an image at all\n", "not an image"),
    ]


@pytest.fixture
def image_tree(tmp_path) -> str:
    """ROOT/<class>/... with 3 classes of 10 plain JPEGs, nested folders, hidden files and
    the bad and odd files of ``_bad_and_odd_files`` in class ``b``."""
    root = tmp_path / "in"
    for name in ["a", "b", "çlass ç"]:
        for i in range(10):
            folder = root / name / ("deep/er" if i % 3 == 0 else "")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i}.JPEG").write_bytes(_encoded(_image(), "JPEG", quality=90))
    for name, data, _ in _bad_and_odd_files():
        (root / "b" / name).write_bytes(data)
    (root / "a" / ".DS_Store").write_bytes(b"\0\0")
    (root / "LICENSE").write_bytes(b"text")
    return str(root)


def _run_cli(*args) -> int:
    return cli.main(["to_tfrecord", "--noprogress", *args])


def _read_split(data_dir: str, files) -> list:
    """(label, decoded image, filename) of every record, read as the trainer reads them."""
    out = []
    for serialized in tf.data.TFRecordDataset(list(files)):
        example = recordformat.parse_example(serialized)
        image = tf.io.decode_image(example["encoded"], channels=3, expand_animations=False)
        name = tf.io.parse_single_example(
            serialized, {"image/filename": tf.io.FixedLenFeature([], tf.string)}
        )["image/filename"]
        out.append((int(example["label"]), image.numpy(), name.numpy().decode()))
    return out


# --- end to end -----------------------------------------------------------------------------


@pytest.mark.fast
def test_folder_round_trip_through_the_input_pipeline(image_tree, tmp_path):
    out = str(tmp_path / "out")
    args = ["--num_workers=2", "--num_shards=3", "--validation_fraction=0.2", "--verify"]
    assert _run_cli(f"--input={image_tree}", f"--output_dir={out}", *args) == 0
    with open(os.path.join(out, recordformat.INFO_FILE), encoding="utf-8") as f:
        info = json.load(f)
    assert info["class_names"] == ["a", "b", "çlass ç"] and info["label_map"]["b"] == 1
    assert info["schema_version"] == recordformat.SCHEMA_VERSION
    reasons = {
        s["file"]: s["reason"] for split in info["splits"].values() for s in split["skipped"]
    }
    expected = {f"b/{n}": why for n, _, why in _bad_and_odd_files() if why}
    assert set(reasons) == set(expected)
    assert all(reasons[f].startswith(why) for f, why in expected.items())
    assert info["skipped"] == [{"file": "LICENSE", "reason": "not inside a class folder"}]
    assert info["num_skipped"] == len(expected) + 1
    assert sorted(os.listdir(out)) == sorted(
        [recordformat.INFO_FILE, recordformat.QUALITY_FILE]
        + plan.shard_names("train", 3)
        + plan.shard_names("validation", 1)
    )

    spec = data_spec.load_data_spec(out)
    assert spec.num_classes == 3 and spec.label_offset == 0
    train = _read_split(out, spec.train_files)
    validation = _read_split(out, spec.eval_files)
    assert len(train) == spec.num_train and len(validation) == spec.num_eval
    assert len(train) + len(validation) == 30 + len(_bad_and_odd_files()) - len(expected)
    for split, rows in (("train", train), ("validation", validation)):
        per_class = [sum(1 for label, _, _ in rows if label == c) for c in range(3)]
        assert list(info["splits"][split]["per_class"].values()) == per_class
    names = {name: image for _, image, name in train + validation}
    assert "b/ünïcødé 猫.jpg" in names and "a/deep/er/0.JPEG" in names
    assert all(image.shape[2] == 3 for image in names.values())


@pytest.mark.fast
def test_shards_are_balanced_and_mixed(tmp_path):
    """A class-sorted input must not become class-sorted shards."""
    items = [
        Item(np.full((8, 8, 3), c * 50, np.uint8), c, f"{c}/{i}")
        for c in range(4)
        for i in range(25)
    ]
    info = plan.write_dataset(
        {"train": items}, list("abcd"), str(tmp_path), "test", {"train": 4}, seed=3
    )
    counts = [s["num_examples"] for s in info["splits"]["train"]["shards"]]
    assert counts == [25, 25, 25, 25]
    for shard in plan.shard_names("train", 4):
        labels = [label for label, _, _ in _read_split(str(tmp_path), [tmp_path / shard])]
        assert len(set(labels)) == 4 and labels != sorted(labels)


@pytest.mark.fast
def test_split_layout_train_and_val_folders(tmp_path):
    root = tmp_path / "in"
    for split, n in (("train", 6), ("val", 2)):
        for name in ("x", "y"):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                (root / split / name / f"{i}.png").write_bytes(_encoded(_image(), "PNG"))
    out = str(tmp_path / "out")
    assert _run_cli(f"--input={root}", f"--output_dir={out}", "--num_workers=0", "--lossless") == 0
    info = json.loads((tmp_path / "out" / recordformat.INFO_FILE).read_text())
    assert info["num_examples"] == {"train": 12, "validation": 4}
    assert info["class_names"] == ["x", "y"] and info["options"]["lossless"] is True


# --- records and images ---------------------------------------------------------------------


def _tf_example(encoded, label, height, width, image_format, filename) -> tf.train.Example:
    """The Example TensorFlow's own protos make of one image: what encode_example must match."""
    bytes_ = lambda v: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))  # noqa: E731
    int64 = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))  # noqa: E731
    feature = {
        "image/encoded": bytes_(encoded),
        "image/class/label": int64(int(label)),
        "image/format": bytes_(image_format.upper().encode()),
        "image/height": int64(int(height)),
        "image/width": int64(int(width)),
        "image/filename": bytes_(filename.encode("utf-8", "surrogateescape")),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature))


@pytest.mark.fast
def test_encode_example_writes_exactly_what_tensorflow_writes():
    for args in [
        (b"\xff\xd8\xffdata", 7, 375, 500, "jpeg", "n01/ünï 猫.JPEG"),
        (b"", 0, 0, 0, "PNG", "bad-\udcff-bytes"),  # an undecodable file name byte
        (b"x" * 300, 2**40, 1, 2, "png", ""),
        (b"y", -1, 1, 1, "JPEG", "negative label"),
    ]:
        expected = _tf_example(*args)
        assert recordformat.encode_example(*args) == expected.SerializeToString(deterministic=True)


@pytest.mark.fast
def test_encode_image_converts_and_passes_through():
    jpeg = _encoded(_image(), "JPEG")
    assert encode.encode_image(jpeg) == (jpeg, "JPEG", 18, 24)  # untouched bytes
    for mode, fmt in (("CMYK", "JPEG"), ("L", "JPEG"), ("RGBA", "PNG"), ("RGB", "BMP")):
        encoded, out_fmt, height, width = encode.encode_image(_encoded(_image(mode), fmt))
        decoded = Image.open(io.BytesIO(encoded))
        assert (out_fmt, decoded.format, decoded.mode, height, width) == (
            "JPEG",
            "JPEG",
            "RGB",
            18,
            24,
        )
    transparent = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    encoded, fmt, _, _ = encode.encode_image(_encoded(transparent, "PNG"), lossless=True)
    assert fmt == "PNG" and Image.open(io.BytesIO(encoded)).getpixel((0, 0)) == (255, 255, 255)
    big = _encoded(_image(size=(300, 120)), "JPEG")
    encoded, _, height, width = encode.encode_image(big, max_side=100)
    assert (height, width) == (40, 100) == Image.open(io.BytesIO(encoded)).size[::-1]
    array = RNG.integers(0, 256, (5, 6), dtype=np.uint8)
    encoded, _, _, _ = encode.encode_image(array, lossless=True)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(encoded)))[..., 0], array)
    with pytest.raises(BadImage, match="expected a uint8"):
        encode.encode_image(np.zeros((4, 4), np.float32))


def _decodes_fully(data: bytes) -> bool:
    try:
        Image.open(io.BytesIO(data)).load()
        return True
    except Exception:  # noqa: BLE001 - PIL raises many types for bad data
        return False


@pytest.mark.fast
@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("progressive", [False, True])
def test_the_scaled_jpeg_check_refuses_what_a_full_decode_refuses(mode, progressive):
    """The converter's 1/8-scale (luma-only for colour) decode against a full decode, on
    truncated, cut and overwritten copies of one smooth photo-like JPEG: the same verdicts,
    both kinds among them."""
    rng = np.random.default_rng(3)
    coarse = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8))
    photo = coarse.resize((160, 120), Image.Resampling.BICUBIC).convert(mode)
    jpeg = _encoded(photo, "JPEG", quality=90, progressive=progressive)
    verdicts = set()
    for trial in range(60):
        data = bytearray(jpeg)
        at = int(rng.integers(2, len(data)))
        if trial % 3 == 0:
            data = data[:at]
        elif trial % 3 == 1:
            data = data[:at] + data[at + int(rng.integers(1, 300)) :]
        else:
            data[at : at + 8] = rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
        try:
            encode.encode_image(bytes(data))
            ours = True
        except BadImage:
            ours = False
        assert ours == _decodes_fully(bytes(data)), (trial, at)
        verdicts.add(ours)
    assert verdicts == {True, False}


# --- interruption, refusal, safety ----------------------------------------------------------


def _items(n: int = 40) -> list:
    return [Item(_encoded(_image(), "PNG"), i % 4, f"{i % 4}/{i}.png") for i in range(n)]


def _write(out, items, **kwargs) -> dict:
    return plan.write_dataset(
        {"train": items}, list("abcd"), str(out), "test", {"train": 5}, seed=1, **kwargs
    )


def _shard_bytes(out) -> dict:
    return {n: (out / n).read_bytes() for n in sorted(os.listdir(out)) if n.endswith(".tfrecord")}


@pytest.mark.fast
def test_interrupted_run_keeps_finished_shards_and_finishes_the_rest(tmp_path, monkeypatch):
    items = _items()
    _write(tmp_path / "clean", items)
    calls = []
    real = worker.write_shard

    def dies_on_third_shard(output_dir, name, shard_items, options):
        calls.append(name)
        if len(calls) == 3:
            with files.open_new(os.path.join(output_dir, name + ".tmp")) as f:
                f.write(b"half a shard")  # what a killed worker leaves
            raise KeyboardInterrupt
        return real(output_dir, name, shard_items, options)

    monkeypatch.setattr(plan, "write_shard", dies_on_third_shard)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        _write(out, items)
    assert not (out / recordformat.INFO_FILE).exists()
    kept = {n: os.stat(out / n).st_ino for n in calls[:2]}
    monkeypatch.setattr(plan, "write_shard", real)
    with pytest.raises(ConvertError, match="another conversion"):
        _write(out, items[:-1])  # other inputs must not be mixed with these shards
    info = _write(out, items, num_workers=2)
    assert {n: os.stat(out / n).st_ino for n in kept} == kept  # not rewritten
    assert _shard_bytes(out) == _shard_bytes(tmp_path / "clean")  # same as never interrupted
    assert info["num_examples"] == {"train": 40}
    names = [recordformat.INFO_FILE, *plan.shard_names("train", 5)]
    assert sorted(os.listdir(out)) == sorted(names)


def test_a_shard_whose_fingerprints_are_lost_or_older_is_written_again(tmp_path, monkeypatch):
    """A finished shard whose duplicate-check arrays are damaged, replaced by a FIFO (which
    must not block the run) or by a huge file, or whose exact keys are of another kind (an
    older tfgpu's, SHA-1), is converted again when the run resumes; the others are kept,
    and the check sees every record."""
    items, options = _items(), {"check_duplicates": True}
    real, calls = worker.write_shard, []

    def dies_on_fourth_shard(output_dir, name, shard_items, options):
        calls.append(name)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(output_dir, name, shard_items, options)

    monkeypatch.setattr(plan, "write_shard", dies_on_fourth_shard)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        _write(out, items, **options)
    older, damaged, fifo, kept = calls[:4]
    marker = out / worker.done_marker(older)
    marker.write_text(marker.read_text().replace('"key": "xxh3-64"', '"key": "sha1"'))
    arrays = out / worker.fingerprints_file(damaged)
    arrays.write_bytes(arrays.read_bytes()[:100] + bytes(1 << 20))  # cut, and too long
    (out / worker.fingerprints_file(fifo)).unlink()
    os.mkfifo(out / worker.fingerprints_file(fifo))
    inodes = {n: os.stat(out / n).st_ino for n in calls[:4]}
    monkeypatch.setattr(plan, "write_shard", real)
    info = _write(out, items, **options)
    assert os.stat(out / kept).st_ino == inodes[kept]
    for rewritten in (older, damaged, fifo):
        assert os.stat(out / rewritten).st_ino != inodes[rewritten]
    assert info["quality"]["num_images"] == 40
    assert not [n for n in os.listdir(out) if n.startswith(".")]  # markers and arrays gone


def test_killed_run_is_finished_by_running_it_again(tmp_path):
    """SIGKILL the CLI (and its workers) once the first shard is done, then run it again."""
    for c in range(2):
        (tmp_path / "in" / str(c)).mkdir(parents=True)
        for i in range(150):
            (tmp_path / "in" / str(c) / f"{i}.png").write_bytes(
                _encoded(_image(size=(96, 96)), "PNG")
            )
    out = tmp_path / "out"
    args = [f"--input={tmp_path / 'in'}", f"--output_dir={out}", "--num_shards=30", "--seed=5"]
    cli = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "to_tfrecord.py")
    run = subprocess.Popen(
        [sys.executable, cli, "--noprogress", "--num_workers=1", *args], start_new_session=True
    )
    deadline = time.monotonic() + 60
    while not (out.exists() and any(n.endswith(".tfrecord.json") for n in os.listdir(out))):
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    assert not (out / recordformat.INFO_FILE).exists()
    assert 0 < len([n for n in os.listdir(out) if n.endswith(".tfrecord")]) < 33  # of 30 + 3
    assert _run_cli(*args, "--num_workers=2", "--verify") == 0
    info = json.loads((out / recordformat.INFO_FILE).read_text())
    assert info["num_examples"] == {"train": 270, "validation": 30} and info["num_skipped"] == 0
    assert not [n for n in os.listdir(out) if n.startswith(".") or n.endswith(".tmp")]


@pytest.mark.fast
def test_refuses_to_overwrite_without_the_flag(tmp_path):
    _write(tmp_path, _items(8))
    with pytest.raises(ConvertError, match="finished dataset.*--overwrite"):
        _write(tmp_path, _items(8))
    (tmp_path / "notes.md").write_text("mine")
    _write(tmp_path, _items(12), overwrite=True)
    assert (tmp_path / "notes.md").read_text() == "mine"  # only its own files are replaced
    assert verify.verify(str(tmp_path)) == {"train": 12}


@pytest.mark.fast
def test_never_writes_through_symlinks_outside_output_dir(tmp_path, image_tree):
    """Files planted in --output_dir under the names the converter writes point outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    names = [
        recordformat.INFO_FILE,
        recordformat.INFO_FILE + ".tmp",
        plan.PLAN_FILE + ".tmp",
        "train-00000-of-00001.tfrecord",
        "train-00000-of-00001.tfrecord.tmp",
        worker.done_marker("train-00000-of-00001.tfrecord") + ".tmp",
    ]
    for i, name in enumerate(names):
        (outside / f"victim{i}").write_text("precious")
        os.symlink(outside / f"victim{i}", out / name)
    os.symlink(outside, tmp_path / "in" / "a" / "linked-folder")  # input links are not followed
    args = ["--num_shards=1", "--validation_fraction=0", "--num_workers=1", "--overwrite"]
    assert _run_cli(f"--input={image_tree}", f"--output_dir={out}", *args) == 0
    assert all(p.read_text() == "precious" for p in outside.iterdir())
    # The JSON files' temporary names are the writer's own (files.replacing): the links
    # planted at NAME.tmp are left as they were, never written through.
    planted = {recordformat.INFO_FILE + ".tmp", plan.PLAN_FILE + ".tmp"}
    assert not any(os.path.islink(out / n) for n in os.listdir(out) if n not in planted)
    os.symlink(outside / "victim0", out / "y")  # the workers' own temp files, likewise
    with files.open_new(str(out / "y")) as f:
        f.write(b"new")
    assert (outside / "victim0").read_text() == "precious"


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "exactly one of --input and --tfds_name"),
        (["--input=/nonexistent", "--output_dir=/tmp/x"], "--input=/nonexistent does not exist"),
        (["--input=.", "--output_dir=./sub"], "is inside --input"),
        (
            ["--input=.", "--output_dir=/tmp/x", "--jpeg_quality=0"],
            "--jpeg_quality=0: expected in 1..100",
        ),
        (["--input=.", "--output_dir=/tmp/x", "--num_shards=x"], "num_shards"),
        (["--no_such_flag"], "no_such_flag"),
    ],
)
@pytest.mark.fast
def test_bad_flags_are_one_line_errors(args, message, capsys):
    assert _run_cli(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith("to_tfrecord: error: ") and message in err and err.count("\n") == 1


@pytest.mark.fast
def test_bad_input_file_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "data.bin").write_bytes(b"hello")
    assert _run_cli(f"--input={tmp_path / 'data.bin'}", f"--output_dir={tmp_path / 'o'}") == 2
    assert "is a file but not HDF5" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run_cli(f"--input={empty}", f"--output_dir={tmp_path / 'o'}") == 2
    assert "holds no class folders" in capsys.readouterr().err


@pytest.mark.fast
def test_verify_names_a_shard_that_does_not_read_back(tmp_path):
    _write(tmp_path, _items(10))
    assert verify.verify(str(tmp_path)) == {"train": 10}
    shard = tmp_path / "train-00003-of-00005.tfrecord"
    with open(shard, "ab") as f:  # a well-framed record whose image is not one
        recordformat.write_record(f, recordformat.encode_example(b"junk", 0, 1, 1, "JPEG", "x"))
    with pytest.raises(ConvertError, match="train-00003-of-00005.tfrecord does not read"):
        verify.verify(str(tmp_path))
    shard.write_bytes(shard.read_bytes()[:-30])  # now truncated as well
    with pytest.raises(ConvertError, match="train-00003-of-00005.tfrecord does not read"):
        verify.verify(str(tmp_path))
    info = json.loads((tmp_path / recordformat.INFO_FILE).read_text())
    info["splits"]["train"]["shards"][3]["num_examples"] = 7
    shard.unlink()
    worker.write_shard(str(tmp_path), shard.name, _items(2), EncodeOptions())
    (tmp_path / worker.done_marker(shard.name)).unlink()
    (tmp_path / recordformat.INFO_FILE).write_text(json.dumps(info))
    with pytest.raises(ConvertError, match="holds 2 records, dataset_info.json says 7"):
        verify.verify(str(tmp_path))
