"""The converter on real LMDB databases: Caffe Datum records and encoded images, labelled by a
key pattern, a labels file, a key beside each image or the Datum; bad values and refusals."""

import io
import json
import os
import pickle
import signal
import subprocess
import sys
import time

import lmdb
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from PIL import Image

from tfgpu.data import recordformat
from tfgpu.cli import convert as cli
from tfgpu.convert.inputs import caffe_datum, lmdb_input
from tfgpu.data import spec as data_spec

RNG = np.random.default_rng(0)


def _datum_class():
    """caffe.proto's ``Datum``, built here so that test records are what protobuf writes."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="tfgpu_test_caffe.proto", package="tfgpu_test", syntax="proto2"
    )
    message = proto.message_type.add(name="Datum")
    field = descriptor_pb2.FieldDescriptorProto
    for number, (name, kind) in enumerate(
        [
            ("channels", field.TYPE_INT32),
            ("height", field.TYPE_INT32),
            ("width", field.TYPE_INT32),
            ("data", field.TYPE_BYTES),
            ("label", field.TYPE_INT32),
            ("float_data", field.TYPE_FLOAT),
            ("encoded", field.TYPE_BOOL),
        ],
        start=1,
    ):
        repeated = field.LABEL_REPEATED if name == "float_data" else field.LABEL_OPTIONAL
        message.field.add(name=name, number=number, type=kind, label=repeated)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tfgpu_test.Datum"))


Datum = _datum_class()


def _raw_datum(chw: np.ndarray, label: int) -> bytes:
    c, h, w = chw.shape
    return Datum(channels=c, height=h, width=w, data=chw.tobytes(), label=label).SerializeToString()


def _pixels(*shape) -> np.ndarray:
    return RNG.integers(0, 256, shape, dtype=np.uint8)


def _encoded(array: np.ndarray, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format=fmt)
    return out.getvalue()


def _write_lmdb(path, entries, subdir: bool = True) -> str:
    """A real LMDB environment at ``path`` holding ``entries`` (key, value) as bytes."""
    env = lmdb.open(str(path), map_size=1 << 27, subdir=subdir)
    with env.begin(write=True) as txn:
        for key, value in entries:
            txn.put(key.encode() if isinstance(key, str) else key, value)
    env.close()
    return str(path)


def _run_cli(*args) -> int:
    return cli.main(["to_tfrecord", "--noprogress", *args])


def _convert(db: str, out, *flags) -> dict:
    """Converts ``db`` into ``out``; returns dataset_info.json."""
    assert _run_cli(f"--input={db}", f"--output_dir={out}", "--num_workers=0", *flags) == 0
    return json.loads((out / recordformat.INFO_FILE).read_text())


def _records(out) -> dict:
    """key -> (label, stored bytes, decoded RGB) of every record, read as the trainer does."""
    spec = data_spec.load_data_spec(str(out))
    names = {"image/filename": tf.io.FixedLenFeature([], tf.string)}
    rows = {}
    for serialized in tf.data.TFRecordDataset(list(spec.train_files + spec.eval_files)):
        example = recordformat.parse_example(serialized)
        name = tf.io.parse_single_example(serialized, names)["image/filename"].numpy().decode()
        image = tf.io.decode_image(example["encoded"], channels=3, expand_animations=False)
        rows[name] = (int(example["label"]), example["encoded"].numpy(), image.numpy())
    assert len(rows) == spec.num_train + spec.num_eval
    return rows


def _reasons(info: dict) -> dict:
    """file -> reason of every skipped input, those found listing and those found encoding."""
    found = info["skipped"] + [s for v in info["splits"].values() for s in v["skipped"]]
    return {s["file"]: s["reason"] for s in found}


# --- encoded images -------------------------------------------------------------------------


@pytest.mark.fast
def test_encoded_images_labelled_by_a_key_regex(tmp_path):
    entries, images = [], {}
    for name in ["eel", "cat", "dog"]:
        for i in range(4):
            array = _pixels(6 + i, 5, 3)
            fmt = "JPEG" if i % 2 else "PNG"
            key = f"{name}/{i:03d}.{'jpg' if fmt == 'JPEG' else 'png'}"
            entries.append((key, _encoded(array, fmt)))
            images[key] = array
    entries.append(("README", _encoded(_pixels(4, 4, 3), "JPEG")))  # matches no class
    db = _write_lmdb(tmp_path / "data.lmdb", entries)
    out = tmp_path / "out"
    args = [f"--input={db}", f"--output_dir={out}", r"--lmdb_label_regex=^(\w+)/", "--lossless"]
    more = ["--validation_fraction=0.25", "--num_shards=2", "--num_workers=2", "--verify"]
    assert _run_cli(*args, *more) == 0
    info = json.loads((out / recordformat.INFO_FILE).read_text())
    assert info["class_names"] == ["cat", "dog", "eel"]
    assert info["num_examples"] == {"train": 9, "validation": 3}  # one of each class's 4
    assert info["source"].startswith(f"LMDB {db} (encoded images, labels from --lmdb_label_regex")
    assert _reasons(info) == {
        "README": r"no label (key not matched by --lmdb_label_regex='^(\\w+)/')"
    }
    rows = _records(out)
    assert rows.keys() == images.keys()
    stored = dict(entries)
    for key, (label, encoded, decoded) in rows.items():
        assert info["class_names"][label] == key.split("/")[0]
        if key.endswith(".jpg"):
            assert encoded == stored[key]  # an RGB JPEG passes through byte for byte
        else:
            assert np.array_equal(decoded, images[key])  # PNG, re-encoded losslessly


@pytest.mark.parametrize("style", ["csv", "space", "json"])
@pytest.mark.fast
def test_labels_from_a_companion_file(tmp_path, style):
    keys = [f"img{i:05d}" for i in range(7)]
    labels = {key: 2 * (i % 2) for i, key in enumerate(keys[:-1])}  # the last key has none
    db = _write_lmdb(tmp_path / "db", [(k, _encoded(_pixels(5, 5, 3), "PNG")) for k in keys])
    path = tmp_path / f"labels.{style}"
    if style == "json":
        path.write_text(json.dumps(labels))
    else:
        sep = "," if style == "csv" else "  "
        lines = ["# key,label", "", *(f"{k}{sep}{y}" for k, y in labels.items()), "other,1"]
        path.write_text("\n".join(lines) + "\n")
    info = _convert(db, tmp_path / "out", f"--lmdb_labels_file={path}", "--validation_fraction=0")
    assert info["class_names"] == ["0", "1", "2"]  # integer labels keep their values
    assert info["num_examples"] == {"train": 6}
    assert _reasons(info) == {"img00006": f"no label (key not in --lmdb_labels_file={path})"}
    rows = _records(tmp_path / "out")
    assert {k: label for k, (label, _, _) in rows.items()} == labels


@pytest.mark.fast
def test_labels_stored_beside_the_image_in_a_data_mdb_file(tmp_path):
    entries, names = [], {}
    for i in range(6):
        key = f"photos/{i}.png"
        names[key] = ["zebra", "ant"][i % 2]
        entries += [(key, _encoded(_pixels(4, 7, 3), "PNG")), (key + ".label", names[key].encode())]
    entries += [("photos/unlabelled.png", _encoded(_pixels(3, 3, 3), "PNG"))]
    entries += [("photos/gone.png.label", b"ant")]  # its image is missing
    db = _write_lmdb(tmp_path / "data.mdb", entries, subdir=False)
    info = _convert(db, tmp_path / "out", "--validation_fraction=0.34")
    assert info["class_names"] == ["ant", "zebra"]
    assert info["num_examples"] == {"train": 4, "validation": 2}  # one of each class's 3
    assert _reasons(info) == {
        "photos/unlabelled.png": "no label (no key '<key>.label' beside it)",
        "photos/gone.png.label": "a label beside no image",
    }
    rows = _records(tmp_path / "out")
    assert {k: info["class_names"][y] for k, (y, _, _) in rows.items()} == names


# --- Caffe Datum ----------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["bgr", "rgb"])
@pytest.mark.fast
def test_raw_datum_pixels_round_trip_exactly(tmp_path, order):
    """CHW pixels (BGR, as Caffe writes them, unless told otherwise) -> HWC RGB, lossless."""
    pixels = {f"{i:08d}": _pixels(3, 5 + i % 3, 4) for i in range(9)}
    pixels["gray"] = _pixels(1, 6, 5)
    entries = [
        (k, _raw_datum(chw, int(k[-1]) % 3 if k != "gray" else 4)) for k, chw in pixels.items()
    ]
    db = _write_lmdb(tmp_path / "train_lmdb", entries)
    flags = ["--lossless", "--num_shards=2", f"--lmdb_channel_order={order}"]
    info = _convert(db, tmp_path / "out", *flags)
    assert info["class_names"] == ["0", "1", "2", "3", "4"]
    assert "Caffe Datum records, labels from the Datum records" in info["source"]
    rows = _records(tmp_path / "out")
    assert rows.keys() == pixels.keys() and info["num_skipped"] == 0
    for key, (label, _, decoded) in rows.items():
        hwc = pixels[key].transpose(1, 2, 0)
        if key == "gray":
            assert label == 4 and all(
                np.array_equal(decoded[..., c], hwc[..., 0]) for c in range(3)
            )
        else:
            assert label == int(key[-1]) % 3
            assert np.array_equal(decoded, hwc[..., ::-1] if order == "bgr" else hwc)


@pytest.mark.fast
def test_encoded_datums_and_labels_from_flags_instead(tmp_path):
    arrays = {f"{i:08d}_{['owl', 'bat'][i % 2]}": _pixels(5, 6, 3) for i in range(6)}
    entries = []
    for i, (key, array) in enumerate(arrays.items()):
        data = _encoded(array, "PNG" if i % 2 else "JPEG")
        entries.append((key, Datum(data=data, label=i % 2, encoded=True).SerializeToString()))
    db = _write_lmdb(tmp_path / "enc_lmdb", entries)
    info = _convert(db, tmp_path / "out", "--lossless", "--validation_fraction=0")
    assert info["class_names"] == ["0", "1"]
    rows = _records(tmp_path / "out")
    stored = {k: Datum.FromString(v).data for k, v in entries}
    for i, (key, (label, encoded, decoded)) in enumerate(sorted(rows.items())):
        assert label == i % 2
        assert encoded == stored[key] if i % 2 == 0 else np.array_equal(decoded, arrays[key])
    # A key pattern overrides the Datums' own labels.
    info = _convert(db, tmp_path / "out2", r"--lmdb_label_regex=_(\w+)$", "--validation_fraction=0")
    assert info["class_names"] == ["bat", "owl"]
    rows = _records(tmp_path / "out2")
    assert all(info["class_names"][y] == k.split("_")[1] for k, (y, _, _) in rows.items())


@pytest.mark.fast
def test_lmdb_is_told_by_its_folder_or_its_file(tmp_path):
    folder = _write_lmdb(tmp_path / "folder", [("k", b"v")])
    named = _write_lmdb(tmp_path / "train.lmdb", [("k", b"v")], subdir=False)
    assert lmdb_input.is_lmdb(folder) and lmdb_input.is_lmdb(f"{folder}/data.mdb")
    assert lmdb_input.is_lmdb(named)  # by the magic number of its first page
    assert not lmdb_input.is_lmdb(named + "-lock") and not lmdb_input.is_lmdb(str(tmp_path))
    (tmp_path / "fake.mdb").write_bytes(b"\0" * 64)
    assert not lmdb_input.is_lmdb(str(tmp_path / "fake.mdb"))


@pytest.mark.fast
def test_datum_parser_reads_what_protobuf_writes():
    value = Datum(channels=3, height=2, width=1, data=b"abcdef", label=-7).SerializeToString()
    datum = caffe_datum.parse_datum(value)
    assert (datum["channels"], datum["height"], datum["width"], datum["label"]) == (3, 2, 1, -7)
    assert bytes(datum["data"]) == b"abcdef" and not datum["encoded"] and not datum["float_data"]
    assert caffe_datum.value_kind(value) == "datum-raw"
    floats = Datum(channels=1, height=1, width=3, float_data=[0.5, 1, 2], label=2)
    assert caffe_datum.parse_datum(floats.SerializeToString())["float_data"]
    assert caffe_datum.value_kind(
        Datum(data=b"\xff\xd8\xff", encoded=True).SerializeToString()
    ) == ("datum-encoded")
    kinds = {
        _encoded(_pixels(2, 2, 3), "PNG"): "image",
        _encoded(_pixels(2, 2, 3), "BMP"): "image",
        pickle.dumps({"x": 1}, protocol=2): "pickle",
        pickle.dumps(b"", protocol=5): "pickle",
        b"\x93NUMPY\x01\x00": "unknown",
        value[:-3]: "unknown",  # truncated
        b"": "unknown",
    }
    assert {v: caffe_datum.value_kind(v) for v in kinds} == kinds


# --- bad values, bad databases, refusals ----------------------------------------------------


@pytest.mark.fast
def test_corrupt_values_are_skipped_with_their_reasons(tmp_path):
    good = {f"good{i}": _raw_datum(_pixels(3, 4, 4), i % 2) for i in range(5)}
    truncated = _raw_datum(_pixels(3, 4, 4), 1)
    bad = {
        "000-truncated": truncated[: len(truncated) // 2],  # sorts first: must not decide
        "001-garbage": bytes(RNG.integers(0, 256, 64, dtype=np.uint8)) + b"\x00\xff",
        "floats": Datum(channels=1, height=1, width=2, float_data=[1, 2]).SerializeToString(),
        "short-data": Datum(channels=3, height=4, width=4, data=b"x" * 10).SerializeToString(),
        "empty": b"",
        "negative": _raw_datum(_pixels(3, 4, 4), -1),
    }
    db = _write_lmdb(tmp_path / "db", [*good.items(), *bad.items()])
    info = _convert(db, tmp_path / "out", "--validation_fraction=0")
    assert info["num_examples"] == {"train": 5}
    reasons = _reasons(info)
    assert reasons.keys() == bad.keys() and info["num_skipped"] == len(bad)
    assert reasons["000-truncated"].startswith("corrupt value: not a Caffe Datum (field 4 runs")
    assert reasons["001-garbage"].startswith("corrupt value: not a Caffe Datum")
    assert reasons["floats"] == "Caffe Datum with float_data only (float pixels, not uint8)"
    assert reasons["short-data"].startswith("corrupt value: Datum data holds 10 bytes")
    assert reasons["empty"] == "empty value" and reasons["negative"] == "negative label -1"
    assert _records(tmp_path / "out").keys() == good.keys()

    jpeg = _encoded(_pixels(8, 8, 3), "JPEG")
    entries = [("a.jpg", jpeg), ("b.jpg", jpeg[: len(jpeg) // 2]), ("c.jpg", b"")]
    entries += [(k + ".label", b"3") for k, _ in entries]
    info = _convert(_write_lmdb(tmp_path / "enc", entries), tmp_path / "out2")
    assert info["class_names"] == ["0", "1", "2", "3"] and sum(info["num_examples"].values()) == 1
    reasons = _reasons(info)
    assert reasons["b.jpg"].startswith("cannot decode") and reasons["c.jpg"] == "empty value"


def _one_line_error(capsys, *args) -> str:
    assert _run_cli(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith("to_tfrecord: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.fast
def test_an_empty_database_is_a_one_line_error(tmp_path, capsys):
    db = _write_lmdb(tmp_path / "empty", [])
    err = _one_line_error(capsys, f"--input={db}", f"--output_dir={tmp_path / 'out'}")
    assert f"--input={db} is an empty LMDB database (no keys)" in err


@pytest.mark.parametrize(
    "flags, message",
    [
        ([r"--lmdb_label_regex=^(\d+)/"], "gives none of the 3 keys of --input="),
        ([], "holds encoded images but no labels: pass --lmdb_label_regex"),
        (["--lmdb_labels_file=missing.csv"], "--lmdb_labels_file=missing.csv: cannot read"),
        (["--lmdb_label_regex=^x", "--lmdb_labels_file=f"], "at most one of --lmdb_label_regex"),
        (["--lmdb_label_regex=^(a)(b)"], "has 2 groups, expected one"),
        (["--lmdb_label_regex=(("], "--lmdb_label_regex='((':"),
        (["--lmdb_layout=caffe"], "--lmdb_layout=caffe: expected auto, datum or encoded"),
        (["--lmdb_channel_order=rbg"], "--lmdb_channel_order=rbg: expected bgr or rgb"),
    ],
)
@pytest.mark.fast
def test_no_label_at_all_and_bad_lmdb_flags_are_one_line_errors(tmp_path, capsys, flags, message):
    db = _write_lmdb(tmp_path / "db", [(f"k{i}", _encoded(_pixels(3, 3, 3), "PNG")) for i in "abc"])
    err = _one_line_error(capsys, f"--input={db}", f"--output_dir={tmp_path / 'out'}", *flags)
    assert message in err
    assert not (tmp_path / "out").exists()


@pytest.mark.fast
def test_lmdb_flags_and_unknown_values_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "folder" / "a").mkdir(parents=True)
    out = f"--output_dir={tmp_path / 'out'}"
    err = _one_line_error(capsys, f"--input={tmp_path / 'folder'}", out, "--lmdb_layout=datum")
    assert "--lmdb_layout applies to an LMDB --input only" in err
    db = _write_lmdb(tmp_path / "npy", [("x", b"\x93NUMPY\x01\x00v\x00{'descr': '|u1'}")])
    err = _one_line_error(capsys, f"--input={db}", out)
    assert "cannot tell what its values are (key 'x' starts with b'\\x93NUMPY" in err
    assert "pass --lmdb_layout=datum or --lmdb_layout=encoded" in err


class _Trap:
    """Unpickling this creates ``path``: what a hostile (or careless) pickle can do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("layout", [[], ["--lmdb_layout=encoded"], ["--lmdb_layout=datum"]])
@pytest.mark.fast
def test_a_pickled_database_is_refused(tmp_path, capsys, protocol, layout):
    trap = tmp_path / "unpickled"
    jpeg = _encoded(_pixels(4, 4, 3), "JPEG")
    entries = [(f"{i:05d}", pickle.dumps((jpeg, i % 2), protocol=protocol)) for i in range(4)]
    entries.append(("00002", pickle.dumps(_Trap(str(trap)), protocol=protocol)))
    db = _write_lmdb(tmp_path / "torch.lmdb", entries)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    err = _one_line_error(capsys, f"--input={db}", f"--output_dir={out}", *layout)
    assert f"--input={db} holds pickled values (Python pickle protocol {protocol}" in err
    assert "tfgpu never unpickles data, since unpickling can run any code" in err
    assert "encoded image bytes" in err and "Caffe Datum record" in err
    assert os.listdir(out) == ["notes.txt"] and not trap.exists()


@pytest.mark.fast
def test_a_changed_database_is_another_conversion(tmp_path):
    """The plan's fingerprint sees a database's keys and labels, not only its size."""
    entries = [(f"{i}.png", _encoded(_pixels(3, 3, 3), "PNG")) for i in range(5)]
    source = lambda db: lmdb_input.lmdb_source(db, "auto", r"^(\d)", "", "bgr", 0.2, 0)
    first = source(_write_lmdb(tmp_path / "a", entries)).description
    assert source(_write_lmdb(tmp_path / "b", entries)).description == first.replace("/a ", "/b ")
    renamed = [("9.png", entries[0][1]), *entries[1:]]
    assert (
        source(_write_lmdb(tmp_path / "a2", renamed)).description.split("listing")[1]
        != (first.split("listing")[1])
    )


# --- interruption ---------------------------------------------------------------------------


def _shard_bytes(out) -> dict:
    return {n: (out / n).read_bytes() for n in sorted(os.listdir(out)) if n.endswith(".tfrecord")}


def test_an_interrupted_conversion_resumes_to_the_same_shards(tmp_path):
    """SIGKILL the CLI (and its worker) once its first shard is done, then run it again: the
    result is byte for byte what an uninterrupted conversion writes."""
    entries = [(f"{i:06d}", _raw_datum(_pixels(3, 128, 128), i % 3)) for i in range(300)]
    db = _write_lmdb(tmp_path / "big_lmdb", entries)
    clean = tmp_path / "clean"
    args = [f"--input={db}", "--num_shards=30", "--seed=5", "--noprogress"]
    _convert(db, clean, *args[1:])
    out = tmp_path / "out"
    tool = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "to_tfrecord.py")
    run = subprocess.Popen(
        [sys.executable, tool, *args, f"--output_dir={out}", "--num_workers=1"],
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not (out.exists() and any(n.endswith(".tfrecord.json") for n in os.listdir(out))):
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    assert not (out / recordformat.INFO_FILE).exists()
    assert 0 < len([n for n in os.listdir(out) if n.endswith(".tfrecord")]) < 34  # of 30 + 4
    assert _run_cli(*args, f"--output_dir={out}", "--num_workers=2", "--verify") == 0
    assert _shard_bytes(out) == _shard_bytes(clean)
    info = json.loads((out / recordformat.INFO_FILE).read_text())
    assert info == json.loads((clean / recordformat.INFO_FILE).read_text())
    assert info["num_examples"] == {"train": 270, "validation": 30}
    assert not [n for n in os.listdir(out) if n.startswith(".") or n.endswith(".tmp")]
