"""The converter's array inputs: IDX folders (MNIST's family) and keras.datasets' .npz (CIFAR's
python batches: tests/convert/test_convert_cifar.py). Small generated arrays converted and read back
exactly (pixels, labels, splits, class names); hostile files (cut short, garbage headers,
wrong keys, shapes and dtypes) each end in one line on stderr and exit code 2."""

import gzip
import io
import json
import os
import pickle
import struct
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from requires import FASHION_MNIST  # Debian's dataset-fashion-mnist
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from outcomes import expects, outcome
from PIL import Image

from tfgpu.data import recordformat
from tfgpu.cli import convert as cli
from tfgpu.convert import encode
from tfgpu.convert.inputs import idx
from tfgpu.data import spec as data_spec

pytestmark = pytest.mark.fast
RNG = np.random.default_rng(0)
HYPOTHESIS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _run(capsys, *args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the converter run in this process on ``args``."""
    capsys.readouterr()
    code = cli.main(["to_tfrecord", "--noprogress", "--num_workers=0", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _refused(capsys, *args) -> str:
    """The one stderr line of a conversion that must fail with exit code 2."""
    code, out, err = _run(capsys, *args)
    assert code == 2 and not out and err.count("\n") == 1, (code, out, err)
    assert err.startswith("to_tfrecord: error: ")
    return err


def _records(out) -> dict:
    """{split: {filename: (label, PIL mode, stored pixels)}} of the dataset in ``out``."""
    spec = data_spec.load_data_spec(str(out))
    names = {"image/filename": tf.io.FixedLenFeature([], tf.string)}
    splits = {}
    for split, files in (("train", spec.train_files), ("validation", spec.eval_files)):
        rows = splits.setdefault(split, {})
        for serialized in tf.data.TFRecordDataset(list(files)):
            example = recordformat.parse_example(serialized)
            name = tf.io.parse_single_example(serialized, names)["image/filename"]
            image = Image.open(io.BytesIO(example["encoded"].numpy()))
            rows[name.numpy().decode()] = (int(example["label"]), image.mode, np.asarray(image))
    return splits


def _info(out) -> dict:
    return json.loads((out / recordformat.INFO_FILE).read_text())


# --- IDX --------------------------------------------------------------------------------------


def idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    """``array`` as an IDX file: 00 00 code ndim, big-endian int32 dims, the data."""
    dims = struct.pack(f">{array.ndim}i", *array.shape)
    return bytes([0, 0, code, array.ndim]) + dims + array.tobytes()


def _write_idx(folder, split, images, labels, gz=True, sep="-") -> dict:
    """Writes one split's pair; returns {"images": path, "labels": path}."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, array, n in (("images", images, 3), ("labels", labels, 1)):
        path = folder / f"{split}-{kind}{sep}idx{n}-ubyte{'.gz' if gz else ''}"
        data = idx_bytes(array)
        path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
        paths[kind] = path
    return paths


def _mnist_like(n: int, classes: int = 3, shape=(5, 4), rng=RNG):
    return rng.integers(0, 256, (n, *shape), np.uint8), (np.arange(n) % classes).astype(np.uint8)


@pytest.mark.parametrize("gz, sep, test", [(True, "-", "t10k"), (False, ".", "test")])
def test_idx_folder_round_trips_exactly(tmp_path, capsys, gz, sep, test):
    """Both spellings, gzipped or not: t10k/test files become the validation split; records
    hold the exact 1-channel pixels (PNG by default); --class_names names the classes."""
    train, val = _mnist_like(12), _mnist_like(6)
    _write_idx(tmp_path / "in", "train", *train, gz=gz, sep=sep)
    _write_idx(tmp_path / "in", test, *val, gz=gz, sep=sep)
    out = tmp_path / "out"
    code, stdout, _ = _run(
        capsys,
        f"--input={tmp_path / 'in'}",
        f"--output_dir={out}",
        "--class_names=T-shirt/top,b,c",
        "--verify",
    )
    assert code == 0 and f"; {test} -> validation; lossless PNG (raw pixels);" in stdout
    assert stdout.rstrip().endswith("verified: every record decodes")
    info = _info(out)
    assert info["class_names"] == ["T-shirt/top", "b", "c"]
    assert info["label_map"]["T-shirt/top"] == 0 and info["num_examples"] == {
        "train": 12,
        "validation": 6,
    }
    assert info["splits"]["train"]["per_class"] == {"T-shirt/top": 4, "b": 4, "c": 4}
    rows = _records(out)
    for split, origin, (images, labels) in (("train", "train", train), ("validation", test, val)):
        assert sorted(rows[split]) == sorted(f"{origin}[{i}]" for i in range(len(labels)))
        for i, label in enumerate(labels):
            assert rows[split][f"{origin}[{i}]"][:2] == (label, "L")
            assert np.array_equal(rows[split][f"{origin}[{i}]"][2], images[i])


def test_idx_train_only_is_split_and_nolossless_is_jpeg(tmp_path, capsys):
    _write_idx(tmp_path / "in", "train", *_mnist_like(20, classes=2))
    names = tmp_path / "names.txt"
    names.write_text("zero\n\none\n")  # blank lines ignored
    out = tmp_path / "out"
    args = [f"--input={tmp_path / 'in'}", f"--output_dir={out}", f"--class_names={names}"]
    code, stdout, _ = _run(capsys, *args, "--validation_fraction=0.2", "--nolossless")
    assert code == 0 and "->" not in stdout and "lossless" not in stdout
    info = _info(out)
    assert info["num_examples"] == {"train": 16, "validation": 4}
    assert info["class_names"] == ["zero", "one"] and info["options"]["lossless"] is False
    assert {mode for rows in _records(out).values() for _, mode, _ in rows.values()} == {"L"}


def test_idx_prefers_the_plain_copy_and_names_its_classes_by_number(tmp_path, capsys):
    images, labels = _mnist_like(6)
    _write_idx(tmp_path / "in", "train", images, labels, gz=True)
    _write_idx(tmp_path / "in", "train", images, labels, gz=False)  # gunzip -k
    (tmp_path / "in" / "train-images-idx3-ubyte.gz").write_bytes(b"broken")  # never read
    code, _, _ = _run(capsys, f"--input={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}")
    assert code == 0 and _info(tmp_path / "out")["class_names"] == ["0", "1", "2"]


def _idx_case(tmp_path, case: str):
    """A folder with one hostile IDX case; returns (folder, extra flags, the file to name)."""
    folder = tmp_path / case
    paths = _write_idx(folder, "train", *_mnist_like(4), gz=False)
    images, labels = paths["images"], paths["labels"]
    good = images.read_bytes()
    hostile = {
        "magic": (images, b"\x01\x02" + good[2:]),
        "type code": (images, good[:2] + b"\x0d" + good[3:]),
        "dims": (images, good[:3] + b"\x02" + good[4:]),
        "size": (images, good[:4] + struct.pack(">i", 3) + good[8:]),
        "negative": (images, good[:8] + struct.pack(">i", -5) + good[12:]),
        "cut short": (images, good[:-1]),
        "too long": (images, good + b"\0"),
        "gzip": (images, gzip.compress(good)[:-9]),
        "huge": (images, good[:4] + struct.pack(">3i", 2**31 - 1, 2**31 - 1, 2**31 - 1)),
        "count": (labels, idx_bytes(np.zeros(3, np.uint8))),
        "empty": (labels, b""),
    }
    if case in hostile:
        path, data = hostile[case]
        path.write_bytes(data)
        return folder, [], path
    if case == "range":  # label 2 but 2 names
        return folder, ["--class_names=a,b"], labels
    if case == "no labels":
        labels.unlink()
        return folder, [], "train-labels-idx1-ubyte"
    (folder / "test-images-idx3-ubyte").write_bytes(good)  # "both": t10k and test files
    (folder / "t10k-images-idx3-ubyte").write_bytes(good)
    return folder, [], "t10k and test"


@pytest.mark.parametrize(
    "case, words",
    [
        ("magic", "is not an IDX file: it starts 01 02 08 03"),
        ("type code", "IDX type code 0x0D (float32), expected 0x08 (uint8)"),
        ("dims", "2 dimensions in its IDX header, expected 3"),
        ("size", "holds more bytes than its header says (3x5x4 = 60 bytes of pixels)"),
        ("negative", "negative dimension"),
        ("cut short", "is cut short: its header says 4x5x4 = 80 bytes of pixels, it holds 79"),
        ("too long", "holds more bytes than its header says"),
        ("gzip", "cannot read gzip: cut short"),
        ("huge", "more than half this machine's memory"),
        ("count", "holds 4 images but"),
        ("empty", "is not an IDX file: it starts empty"),
        ("range", "--class_names gives 2 names, but the labels of"),
        ("no labels", "has no train-labels-idx1-ubyte[.gz] file"),
        ("both", "holds both t10k and test IDX files"),
    ],
)
def test_hostile_idx_is_one_line(tmp_path, capsys, case, words):
    folder, flags, named = _idx_case(tmp_path, case)
    err = _refused(capsys, f"--input={folder}", f"--output_dir={tmp_path / 'out'}", *flags)
    assert words in err and str(named) in err


@expects("converted", "refused")
@HYPOTHESIS
@given(data=st.data())
def test_any_cut_or_garbage_idx_file_is_one_line(tmp_path, capsys, data):
    """Any strict prefix of a valid IDX file (gzipped or not) is refused in one line naming
    it; random header bytes are refused the same way, or converted when they happen to fit."""
    folder = Path(tempfile.mkdtemp(dir=tmp_path))  # a fresh folder per example
    arrays = _mnist_like(3, rng=np.random.default_rng(1))  # the same files for every example
    paths = _write_idx(folder, "train", *arrays, gz=data.draw(st.booleans()))
    path = paths[data.draw(st.sampled_from(["images", "labels"]))]
    good = path.read_bytes()
    if data.draw(st.booleans()):
        path.write_bytes(good[: data.draw(st.integers(0, len(good) - 1))])
        assert str(path) in _refused(capsys, f"--input={folder}", f"--output_dir={folder}.out")
        outcome("refused")
        return
    raw = gzip.decompress(good) if path.suffix == ".gz" else good
    head = data.draw(st.binary(min_size=0, max_size=20) | st.just(raw[:4]))  # or its own
    path.write_bytes(head + raw[len(head) :])
    code, _, err = _run(capsys, f"--input={folder}", f"--output_dir={folder}.out", "--overwrite")
    assert code == 0 or code == 2 and err.count("\n") == 1 and str(path) in err, err
    outcome("converted" if code == 0 else "refused")


def test_one_idx_file_as_input_and_class_names_elsewhere_are_refused(tmp_path, capsys):
    paths = _write_idx(tmp_path / "in", "train", *_mnist_like(4))
    out = f"--output_dir={tmp_path / 'out'}"
    assert "is one IDX file: give the folder" in _refused(capsys, f"--input={paths['images']}", out)
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    err = _refused(capsys, f"--input={tmp_path / 'photos'}", out, "--class_names=a")
    assert "--class_names applies to IDX and .npz inputs only" in err
    for names, words in (("a,,b", "an empty name"), ("a,b,a", "'a' is given more than once")):
        assert words in _refused(
            capsys, f"--input={tmp_path / 'in'}", out, f"--class_names={names}"
        )


@pytest.mark.requires("fashion_mnist")
def test_debian_fashion_mnist_reads_as_its_arrays():
    """The real files: 60,000 + 10,000 images, t10k as validation, each row the file's own
    bytes (read independently here), and stored by the worker as those exact pixels."""
    source = idx.idx_source(FASHION_MNIST, [], 0.1, 0)
    assert {s: len(v) for s, v in source.splits.items()} == {"train": 60000, "validation": 10000}
    assert source.note == "t10k -> validation" and source.raw_pixels
    assert source.class_names == [str(i) for i in range(10)]
    with gzip.open(os.path.join(FASHION_MNIST, "t10k-images-idx3-ubyte.gz")) as f:
        pixels = np.frombuffer(f.read()[16:], np.uint8).reshape(10000, 28, 28)
    for item in source.splits["validation"][::997]:
        i = int(item.filename[5:-1])  # "t10k[123]"
        assert np.array_equal(item.source, pixels[i])
        encoded, fmt, _, _ = encode.encode_image(item.source, lossless=True, keep_grayscale=True)
        assert fmt == "PNG" and np.array_equal(
            np.asarray(Image.open(io.BytesIO(encoded))), pixels[i]
        )


# --- .npz -------------------------------------------------------------------------------------


def test_npz_round_trips_rgb_with_test_arrays(tmp_path, capsys):
    x_train = RNG.integers(0, 256, (9, 4, 3, 3), np.uint8)
    x_test = RNG.integers(0, 256, (3, 4, 3, 3), np.uint8)
    path = tmp_path / "data.npz"
    y_train, y_test = (np.arange(9) % 3).reshape(9, 1), np.array([2, 0, 1])  # keras' CIFAR: (N, 1)
    np.savez_compressed(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    out = tmp_path / "out"
    code, stdout, _ = _run(capsys, f"--input={path}", f"--output_dir={out}", "--class_names=x,y,z")
    assert code == 0 and "; x_test -> validation" in stdout
    rows = _records(out)
    assert _info(out)["class_names"] == ["x", "y", "z"]
    for split, key, images, labels in (
        ("train", "x_train", x_train, y_train[:, 0]),
        ("validation", "x_test", x_test, y_test),
    ):
        assert len(rows[split]) == len(labels)
        for i, label in enumerate(labels):
            assert rows[split][f"{key}[{i}]"][:2] == (label, "RGB")
            assert np.array_equal(rows[split][f"{key}[{i}]"][2], images[i])


def test_npz_without_test_arrays_is_split(tmp_path, capsys):
    path = tmp_path / "mnist.npz"
    np.savez(path, x_train=RNG.integers(0, 256, (10, 6, 6), np.uint8), y_train=np.arange(10) % 2)
    out = tmp_path / "out"
    code, _, _ = _run(capsys, f"--input={path}", f"--output_dir={out}", "--validation_fraction=0.2")
    info = _info(out)
    assert code == 0 and info["num_examples"] == {"train": 8, "validation": 2}
    assert info["class_names"] == ["0", "1"]


def _npz(path, **arrays) -> str:
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize(
    "arrays, words",
    [
        ({"x": np.zeros((2, 3, 3), np.uint8)}, "has no array x_train (it holds x;"),
        ({"x_train": np.zeros((2, 3, 3)), "y_train": np.zeros(2, int)}, "x_train is float64"),
        ({"x_train": np.zeros((2, 9), np.uint8), "y_train": np.zeros(2, int)}, "expected uint8"),
        ({"x_train": np.zeros((2, 3, 3), np.uint8), "y_train": np.zeros(3, int)}, "expected 2 "),
        ({"x_train": np.zeros((2, 3, 3), np.uint8), "y_train": np.zeros(2)}, "integer labels"),
        ({"x_train": np.zeros((2, 3, 3), np.uint8), "y_train": -np.ones(2, int)}, "negative"),
        ({"x_train": np.zeros((2, 3, 3), np.uint8), "y_train": np.full(2, 10**9)}, "below"),
        ({"x_train": np.zeros((2, 0, 3), np.uint8), "y_train": np.zeros(2, int)}, "(0, 3) pixels"),
        ({"x_train": np.zeros((0, 3, 3), np.uint8), "y_train": np.zeros(0, int)}, "no images"),
        (
            {"x_train": np.zeros((2, 3, 3), np.uint8), "y_train": np.zeros(2, int), "y_test": [1]},
            "has no array x_test",
        ),
        (
            {"x_train": np.array([None, 1], dtype=object), "y_train": np.zeros(2, int)},
            "x_train holds Python objects (a pickle): refused, never unpickled",
        ),
    ],
)
def test_hostile_npz_is_one_line(tmp_path, capsys, arrays, words):
    path = _npz(tmp_path / "bad.npz", **arrays)
    err = _refused(capsys, f"--input={path}", f"--output_dir={tmp_path / 'out'}")
    assert words in err and path in err


def test_a_pickle_or_a_lying_header_named_npz_is_refused(tmp_path, capsys):
    out = f"--output_dir={tmp_path / 'out'}"
    pickled = tmp_path / "pickled.npz"
    pickled.write_bytes(pickle.dumps({"x_train": np.zeros(2)}))
    assert "is a Python pickle, not an .npz archive" in _refused(capsys, f"--input={pickled}", out)
    other = tmp_path / "other.npz"
    other.write_bytes(b"\x89HDF garbage")
    assert "is not an .npz archive" in _refused(capsys, f"--input={other}", out)
    lying = tmp_path / "lying.npz"
    with zipfile.ZipFile(lying, "w") as archive:  # a header claiming more than its 18 bytes
        member = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            member, {"descr": "|u1", "fortran_order": False, "shape": (9, 9, 9)}
        )
        archive.writestr("x_train.npy", member.getvalue() + bytes(18))
        archive.writestr("y_train.npy", member.getvalue())
    assert "header claims (9, 9, 9), more than it holds" in _refused(
        capsys, f"--input={lying}", out
    )


_DTYPES = st.sampled_from(["uint8", "int64", "float32", "bool", "int8", "<U1"])
_SHAPES = st.lists(st.integers(0, 4), min_size=0, max_size=5).map(tuple)


_N = st.integers(1, 3)
# keras.datasets' layout: x uint8 (N, H, W[, 3]), y integer labels (N,).
_KERAS_LIKE = st.builds(
    lambda n, side, rgb, labels: {
        "x_train": ("uint8", (n, side, side, 3) if rgb else (n, side, side)),
        "y_train": (labels, (n,)),
    },
    _N, st.integers(1, 4), st.booleans(), st.sampled_from(["uint8", "int64"]),
)  # fmt: skip


@expects("converted", "refused")
@HYPOTHESIS
@given(
    arrays=st.dictionaries(
        st.sampled_from(["x_train", "y_train", "x_test", "y_test", "other"]),
        st.tuples(_DTYPES, _SHAPES),
        max_size=5,
    )
    | _KERAS_LIKE
)
def test_any_npz_converts_or_is_one_line(tmp_path, capsys, arrays):
    """Whatever keys, shapes and dtypes an .npz holds: converted, or one line (exit 2)."""
    path = tmp_path / "any.npz"
    np.savez(path, **{k: np.zeros(shape, dtype) for k, (dtype, shape) in arrays.items()})
    args = [f"--input={path}", f"--output_dir={tmp_path / 'out'}", "--overwrite"]
    code, _, err = _run(capsys, *args)
    assert code == 0 or code == 2 and err.count("\n") == 1 and str(path) in err, err
    outcome("converted" if code == 0 else "refused")


def test_keep_grayscale_keeps_only_grayscale():
    gray, rgb = RNG.integers(0, 256, (3, 4), np.uint8), RNG.integers(0, 256, (3, 4, 3), np.uint8)
    for array, mode in ((gray, "L"), (gray[..., None], "L"), (rgb, "RGB")):
        encoded, fmt, _, _ = encode.encode_image(array, lossless=True, keep_grayscale=True)
        image = Image.open(io.BytesIO(encoded))
        assert (fmt, image.mode) == ("PNG", mode) and np.array_equal(
            np.asarray(image), array.squeeze()
        )
