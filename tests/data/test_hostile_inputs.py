"""Files from elsewhere, made to hurt: any dataset_info.json, LMDB value (Caffe Datum), class
weight file or flagfile gives a result, a named skip or a one-line error naming the file and
the field, never a traceback and never a hang. Hypothesis draws the inputs (a modest number
each: this is the fast tier); the cases a reader met are spelled out beside them."""

import contextlib
import io
import json
import os
import subprocess
import sys
import shutil
import tempfile

import numpy as np
import pytest
from PIL import Image
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from outcomes import expects, outcome

from tfgpu.data import recordformat
from tfgpu.cli import convert as cli
from tfgpu.convert import encode, plan
from tfgpu.convert.inputs import caffe_datum, lmdb_input
from tfgpu.convert.manifest import BadImage, Item
from tfgpu.data import balance, broken
from tfgpu.data import spec as data_spec
from tfgpu.errors import ConfigError, DataError, UsageError
from tfgpu.files import MAX_FLAGFILES, check_flagfiles
from tfgpu.train.op_errors import translate

SETTINGS = settings(
    max_examples=60,
    deadline=None,  # a loaded machine must not turn a slow example into a failure
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _one_line(err: Exception, *words) -> None:
    message = str(err)
    assert message and "\n" not in message, message
    assert all(w in message for w in words), (message, words)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """A converted dataset of 2 classes: train in 2 shards, validation in 1."""
    out = tmp_path_factory.mktemp("data")
    items = [Item(np.full((6, 6, 3), 40 * i, np.uint8), i % 2, f"{i % 2}/{i}") for i in range(6)]
    plan.write_dataset(
        {"train": items[:4], "validation": items[4:]},
        ["cat", "dog"],
        str(out),
        "test",
        {"train": 2, "validation": 1},
    )
    return str(out)


def _info(data_dir: str) -> dict:
    with open(os.path.join(data_dir, recordformat.INFO_FILE), encoding="utf-8") as f:
        return json.load(f)


@contextlib.contextmanager
def _with_info(data_dir: str, text):
    """``data_dir``'s info file replaced by ``text`` (str or bytes) for the block."""
    path = os.path.join(data_dir, recordformat.INFO_FILE)
    keep = path + ".keep"
    if not os.path.exists(keep):
        shutil.copy(path, keep)
    with open(path, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    try:
        yield path
    finally:
        shutil.copy(keep, path)


def _open_as_the_reader_does(data_dir: str) -> None:
    """Everything a run reads of the info file: the spec, the class names, each split, the
    per-class counts; a DataError (one line, naming the file) is the only failure allowed."""
    try:
        spec = data_spec.load_data_spec(data_dir)
        data_spec.class_names(spec)
        data_spec.split_spec(spec, "validation" if spec.num_eval else "train")
        balance.train_class_counts(data_dir, spec.num_classes)
    except DataError as err:
        _one_line(err)
        assert recordformat.INFO_FILE in str(err) or "--data_dir" in str(err), str(err)
        outcome("refused")
    else:
        outcome("read")


# --- dataset_info.json -----------------------------------------------------------------------

FIELDS = [
    ("num_classes",),
    ("class_names",),
    ("class_names", 0),
    ("label_offset",),
    ("splits",),
    ("splits", "train"),
    ("splits", "train", "shards"),
    ("splits", "train", "shards", 0),
    ("splits", "train", "shards", 0, "file"),
    ("splits", "train", "shards", 1, "num_examples"),
    ("splits", "train", "num_examples"),
    ("splits", "train", "per_class"),
    ("splits", "train", "per_class", "cat"),
    ("splits", "train", "short_sides"),
    ("splits", "validation", "num_examples"),
    ("splits", "test"),
]


KEEP = object()  # the field's own value: the file as the converter wrote it


def _set(info: dict, field: tuple, value) -> dict:
    node = info
    for key in field[:-1]:
        node = node[key]
    if value is not KEEP:
        node[field[-1]] = value
    return info


@expects("read", "refused")
@SETTINGS
@given(field=st.sampled_from(FIELDS), value=JSON | st.just(KEEP))
def test_any_value_of_any_field_is_read_or_refused_in_one_line(dataset, field, value):
    text = json.dumps(_set(_info(dataset), field, value))
    with _with_info(dataset, text):
        _open_as_the_reader_does(dataset)


@expects("read", "refused")
@SETTINGS
@given(
    st.binary(max_size=300)
    | st.text(max_size=300).map(str.encode)
    | JSON.map(json.dumps)
    | st.integers(0, 8)  # the converter's own file, written with this indent (0: none)
)
def test_any_bytes_as_the_info_file_are_read_or_refused_in_one_line(dataset, text):
    if isinstance(text, int):
        text = json.dumps(_info(dataset), indent=text or None)
    with _with_info(dataset, text):
        _open_as_the_reader_does(dataset)


@pytest.mark.parametrize(
    "field, value, message",
    [
        (FIELDS[8], "/etc/passwd", "splits.train.shards[0].file is '/etc/passwd', expected a file"),
        (FIELDS[8], "../data/train-0.tfrecord", "splits.train.shards[0].file is '../data/"),
        (FIELDS[8], "sub/train.tfrecord", "expected a file name inside --data_dir"),
        (FIELDS[10], 4000, "splits.train.num_examples is 4000, expected its shards' sum, 4"),
        (FIELDS[0], 10**12, "num_classes is 1000000000000, expected a whole number in 1..1000000"),
        (FIELDS[0], 3, "class_names is '2 names', expected num_classes = 3 names"),
        (FIELDS[0], "2", "num_classes is '2', expected a whole number"),
        (FIELDS[9], 2.0, "splits.train.shards[1].num_examples is 2.0, expected a whole number"),
        (FIELDS[12], "many", "splits.train.per_class['cat'] is 'many'"),
    ],
)
def test_what_the_info_file_says_is_checked(dataset, field, value, message):
    with _with_info(dataset, json.dumps(_set(_info(dataset), field, value))) as path:
        with pytest.raises(DataError) as caught:
            data_spec.load_data_spec(dataset)
    _one_line(caught.value, path + ": ", message)


def test_a_record_failing_its_checksum_names_the_shard_and_the_byte(dataset, tmp_path):
    data = tmp_path / "copy"
    shutil.copytree(dataset, data)
    spec = data_spec.load_data_spec(str(data))
    shard = spec.train_files[1]
    with open(shard, "r+b") as f:  # one bit of the first record's image flipped
        f.seek(recordformat.HEADER_BYTES + 40)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(tf.errors.DataLossError) as caught:
        for _ in tf.data.TFRecordDataset(list(spec.train_files)):
            pass
    error = translate(caught.value)
    assert isinstance(error, DataError) and error.exit_code == 2
    _one_line(error, f"{shard}: the record at byte 12 is corrupted (it fails its checksum")
    assert broken.data_loss_error(tf.errors.DataLossError(None, None, "other")) is None


# --- LMDB values: Caffe Datum records ---------------------------------------------------------


def _varint(n: int) -> bytes:
    out = b""
    while n > 0x7F:
        out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
    return out + bytes([n])


def _datum(channels, height, width, data, label, encoded) -> bytes:
    """A Datum as protobuf writes it, with any field values (varints up to 2**64 - 1)."""
    head = b"".join(
        _varint(n << 3) + _varint(v) for n, v in ((1, channels), (2, height), (3, width))
    )
    tail = b"\x28" + _varint(label) + b"\x38" + _varint(encoded)
    return head + b"\x22" + _varint(len(data)) + data + tail


VARINT = st.integers(0, 8) | st.integers(0, 2**64 - 1)
DATUMS = st.builds(
    _datum, VARINT, VARINT, VARINT, st.binary(max_size=48), VARINT, st.integers(0, 1)
)


def _whole_datum(channels, height, width, label, data) -> bytes:
    """A Datum of raw pixels that fit its shape, as Caffe writes them."""
    return _datum(channels, height, width, data.ljust(channels * height * width, b"\x07"), label, 0)


def _png(height, width, data) -> bytes:
    pixels = np.frombuffer(data.ljust(height * width * 3, b"\x07"), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels[: height * width * 3].reshape(height, width, 3)).save(out, "PNG")
    return out.getvalue()


SIDES = st.integers(1, 4)
# Values a real database holds: a Datum of raw pixels, an encoded image as the value.
WHOLE = st.builds(
    _whole_datum, st.sampled_from([1, 3]), SIDES, SIDES, st.integers(0, 9), st.binary(max_size=48)
) | st.builds(_png, SIDES, SIDES, st.binary(max_size=48))


@expects("image", "skip")
@SETTINGS
@given(st.binary(max_size=200) | DATUMS | WHOLE)
def test_any_lmdb_value_is_an_image_or_a_named_skip(value):
    caffe_datum.value_kind(value)  # tells it apart, whatever it is
    label, why = caffe_datum.datum_label(value)
    assert (label is None) != (why is None) and (label is None or label >= 0)
    for layout in ("datum", "encoded"):
        source = lmdb_input._image_source(value, layout, bgr=True)
        try:
            if isinstance(source, BadImage):
                raise source
            encode.encode_image(source, max_megapixels=1)
        except BadImage as err:
            _one_line(err)
            outcome("skip")
        else:
            outcome("image")


# --- class weight files ----------------------------------------------------------------------


@expects("weights", "refused")
@SETTINGS
@given(
    JSON.map(json.dumps).map(str.encode)
    | st.dictionaries(st.sampled_from(["cat", "dog", "2", " 1", "²", "9" * 30, "x"]), JSON).map(
        lambda d: json.dumps(d).encode()
    )
    | st.binary(max_size=100)
    | st.dictionaries(  # a file as a user writes it: names or indices, weights >= 0
        st.sampled_from(["cat", "dog", "bird", "1"]), st.floats(0, 1e6) | st.integers(0, 99)
    ).map(lambda d: json.dumps(d).encode())
)
def test_any_class_weights_file_gives_weights_or_one_line(content):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(content)
        f.flush()
        try:
            weights = balance.weights_from_file(f.name, ["cat", "dog", "bird"])
        except ConfigError as err:
            _one_line(err, f"--class_weights={f.name}")
            outcome("refused")
        else:
            assert weights.shape == (3,) and np.all(np.isfinite(weights)) and np.all(weights >= 0)
            outcome("weights")


def test_a_class_weights_fifo_or_deep_nesting_is_one_line(tmp_path):
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    for name in ("fifo.json", "deep.json"):
        with pytest.raises(ConfigError) as caught:
            balance.weights_from_file(str(tmp_path / name), ["a"])
        _one_line(caught.value, name)


# --- flagfiles -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def flag_dir(tmp_path_factory) -> str:
    """Files a flagfile may name: a FIFO, a folder, a big file, bytes that are not UTF-8."""
    folder = tmp_path_factory.mktemp("flags")
    os.mkfifo(folder / "fifo")
    (folder / "dir").mkdir()
    (folder / "big").write_bytes(b"#" * (2 << 20))
    (folder / "latin1").write_bytes("--seed=1 # caf\xe9\n".encode("latin-1"))
    (folder / "ok").write_text("--seed=3\n")
    return str(folder)


LINES = st.lists(
    st.sampled_from(
        [
            "--flagfile={d}/fifo",
            "--flagfile=/dev/zero",
            "--flagfile={d}/dir",
            "--flagfile={d}/big",
            "--flagfile={d}/latin1",
            "--flagfile={d}/ok",
            "--flagfile={d}/missing",
            "--flagfile={self}",
            "--flagfile={d}/./current",
            "--num_shards=x",
            "--seed=2",
            "--no_such_flag",
            "# a comment",
        ]
    )
    | st.text(max_size=30).filter(lambda t: "output_dir" not in t),
    max_size=6,
)


@expects("read", "refused")
@SETTINGS
@given(lines=LINES, raw=st.binary(max_size=40) | st.just(b""))
def test_any_flagfile_is_read_or_refused_in_one_line(flag_dir, lines, raw):
    """The converter parses it (the trainer runs the same check first); flags after it make
    sure no conversion can start whatever it says: read, the one error is theirs."""
    path = os.path.join(flag_dir, "current")
    text = "\n".join(lines).replace("{d}", flag_dir).replace("{self}", path)
    with open(path, "wb") as f:
        f.write(text.encode("utf-8", "surrogatepass") + b"\n" + raw)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli.main(["to_tfrecord", f"--flagfile={path}", "--input=/x", "--tfds_name=y"])
    errors = [line for line in stderr.getvalue().splitlines() if "error" in line]
    assert code == 2 and len(errors) == 1 and "Traceback" not in stderr.getvalue(), (
        stderr.getvalue()
    )
    outcome("read" if "give exactly one of --input and --tfds_name" in errors[0] else "refused")


def test_flagfiles_that_absl_would_hang_on_are_refused(flag_dir, tmp_path):
    for name, why in [
        ("fifo", "not a regular file"),
        ("dir", "not a regular file"),
        ("big", "larger than 1 MB"),
        ("latin1", "not UTF-8 text (byte 14)"),
    ]:
        with pytest.raises(UsageError) as caught:
            check_flagfiles(["prog", "--flagfile", os.path.join(flag_dir, name)])
        _one_line(caught.value, f"--flagfile={flag_dir}/{name}: {why}")
    fan = tmp_path / "fan"  # each file names the next twice: 2**20 reads for absl
    for i in range(20):
        (tmp_path / f"f{i}").write_text(f"--flagfile={tmp_path}/f{i + 1}\n" * 2)
    (tmp_path / "f20").write_text("--seed=1\n")
    fan.write_text(f"--flagfile={tmp_path}/f0\n")
    with pytest.raises(UsageError, match=f"more than {MAX_FLAGFILES} flagfiles"):
        check_flagfiles(["prog", f"--flagfile={fan}"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "module", ["tfgpu.main", "tfgpu.evaluate", "tfgpu.predict", "tfgpu.launch"]
)
def test_every_command_refuses_a_fifo_flagfile_in_one_line(tmp_path, module):
    """absl itself would block on the FIFO for ever: the timeout fails a regression."""
    os.mkfifo(tmp_path / "fifo")
    out = subprocess.run(
        [sys.executable, "-m", module, f"--flagfile={tmp_path}/fifo"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "not a regular file" in out.stderr and "Traceback" not in out.stderr, out.stderr
