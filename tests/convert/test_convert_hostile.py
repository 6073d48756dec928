"""The converter on trees and inputs made to hurt it: special files, oversized and bomb images,
a worker killed mid-shard, an interrupted --overwrite, huge HDF5 labels and rows, a database
failing mid-read. Each real-process case runs under a timeout, so a regression fails instead
of hanging the suite."""

import io
import json
import os
import signal
import subprocess
import sys
import time
import zlib

import h5py
import lmdb
import numpy as np
import pytest
from PIL import Image

from tfgpu.data import recordformat
from tfgpu.cli import convert as cli
from tfgpu.convert import encode, plan, replace, worker
from tfgpu.convert.inputs import caffe_datum, folders, hdf5, lmdb_input
from tfgpu.errors import ConvertError
from tfgpu.convert.manifest import BadImage, Item

CLI = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "to_tfrecord.py")
RNG = np.random.default_rng(0)
TIMEOUT_S = 120  # a hang fails the test instead of the suite


def _png(size=(16, 12), value=None) -> bytes:
    shape = (size[1], size[0], 3)
    array = (
        RNG.integers(0, 256, shape, np.uint8) if value is None else np.full(shape, value, np.uint8)
    )
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def _bomb_png(width: int, height: int) -> bytes:
    """A grayscale PNG of width x height zero pixels, compressed to a few kB: a header that
    claims far more pixels than its bytes suggest (written by hand: PIL would allocate it)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    rows = zlib.compress(bytes(width + 1) * height, 9)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    )


def _tree(root, per_class: int = 6, size=(16, 12)) -> str:
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            (root / name / f"{i}.png").write_bytes(_png(size, value=i if size[0] > 16 else None))
    return str(root)


def _run(*args, timeout=TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, CLI, "--noprogress", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _counts(out) -> dict:
    """{split: examples} of the dataset in ``out``, each shard's records counted on disk (what
    ``--verify`` checks, without starting TensorFlow)."""
    info = json.loads((out / recordformat.INFO_FILE).read_text())
    for split in info["splits"].values():
        for shard in split["shards"]:
            assert recordformat.scan_shard(str(out / shard["file"])) == (shard["num_examples"], -1)
    return info["num_examples"]


def _skipped(out) -> dict:
    info = json.loads((out / recordformat.INFO_FILE).read_text())
    entries = info["skipped"] + [s for v in info["splits"].values() for s in v["skipped"]]
    return {s["file"]: s["reason"] for s in entries}


# --- special files, caps ---------------------------------------------------------------------


def test_a_tree_of_special_and_oversized_files_converts_without_hanging(tmp_path):
    """A FIFO, links to /dev/zero and to the FIFO, a broken link, a file over --max_file_mb
    and two bombs (one PIL itself refuses, one only the cap catches) are named skips; a link
    to a real image is kept. A regression that reads the FIFO hangs: the timeout fails it."""
    root = tmp_path / "in"
    _tree(root)
    os.mkfifo(root / "a" / "pipe.jpg")
    os.symlink("/dev/zero", root / "a" / "zero.jpg")
    os.symlink(root / "a" / "pipe.jpg", root / "b" / "to-pipe.jpg")
    os.symlink(root / "nowhere.jpg", root / "b" / "dangling.jpg")
    os.symlink(root / "a" / "0.png", root / "b" / "link-to-image.png")
    (root / "b" / "huge.jpg").write_bytes(b"\xff\xd8\xff" + bytes(3 << 20))
    (root / "b" / "bomb.png").write_bytes(_bomb_png(3000, 2000))  # 6 Mpx: PIL's own error
    (root / "b" / "big.png").write_bytes(_bomb_png(1500, 1000))  # 1.5 Mpx: the cap's check
    out = tmp_path / "out"
    caps = ["--max_file_mb=2", "--max_megapixels=1", "--num_workers=1", "--num_shards=2"]
    run = _run(f"--input={root}", f"--output_dir={out}", *caps)
    assert run.returncode == 0, run.stderr
    assert len((root / "b" / "bomb.png").read_bytes()) < 30_000
    reasons = _skipped(out)
    assert reasons == {
        "a/pipe.jpg": "not a regular file: a FIFO (named pipe)",
        "a/zero.jpg": "not a regular file: a character device (through a symlink)",
        "b/to-pipe.jpg": "not a regular file: a FIFO (named pipe) (through a symlink)",
        "b/dangling.jpg": "cannot read: No such file or directory (a broken symlink)",
        "b/huge.jpg": "file too large: 3.0 MB, over --max_file_mb=2",
        "b/bomb.png": "image too large: 6000000 pixels, over --max_megapixels=1 "
        "(a decompression bomb?)",
        "b/big.png": "image too large: 1500x1000 pixels, over --max_megapixels=1 "
        "(a decompression bomb?)",
    }
    info = json.loads((out / recordformat.INFO_FILE).read_text())
    assert sum(info["num_examples"].values()) == 13  # 12 images and the linked one
    summary = "skipped 7 inputs (3 not a regular file, 2 image too large, 1 cannot read, 1 file"
    assert summary in run.stdout


# --- a worker that dies ----------------------------------------------------------------------


def _descendants(pid: int) -> list:
    """The processes under ``pid`` (from /proc)."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    found, generation = [], [pid]
    while generation:
        generation = [p for p, parent in parents.items() if parent in generation]
        found += generation
    return found


def _writer_of_a_shard(pid: int):
    """A process under ``pid`` (only those: other tests may run beside) that holds a
    ``.tfrecord.tmp`` open, or None."""
    for child in _descendants(pid):
        try:
            fds = os.listdir(f"/proc/{child}/fd")
            if any(os.readlink(f"/proc/{child}/fd/{fd}").endswith(".tfrecord.tmp") for fd in fds):
                return child
        except OSError:
            continue
    return None


def test_a_killed_worker_stops_the_conversion_in_one_line(tmp_path):
    """SIGKILL (what the out-of-memory killer sends) a worker while it writes a shard: the
    converter says so in one line and exits 5 at once; the same command then finishes."""
    root = tmp_path / "in"
    _tree(root, per_class=100, size=(256, 256))
    out = tmp_path / "out"
    args = [f"--input={root}", f"--output_dir={out}", "--num_shards=4", "--num_workers=2"]
    run = subprocess.Popen(
        [sys.executable, CLI, "--noprogress", *args],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while (writer := _writer_of_a_shard(run.pid)) is None:
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
        os.kill(writer, signal.SIGKILL)
        _, err = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 5, err
    assert err.count("\n") == 1 and err.startswith("to_tfrecord: error: a worker process")
    assert "was killed by SIGKILL" in err and "run the same command again" in err
    assert _run(*args).returncode == 0
    assert _counts(out) == {"train": 180, "validation": 20}


# --- --overwrite -----------------------------------------------------------------------------


def test_an_interrupted_overwrite_leaves_the_finished_dataset(tmp_path):
    """--overwrite killed half-way: the old dataset reads as before; run again, the new one
    replaces it whole, and the user's own files in --output_dir stay."""
    old_in, new_in, out = tmp_path / "old", tmp_path / "new", tmp_path / "out"
    _tree(old_in, per_class=5)
    _tree(new_in, per_class=150)
    # The old dataset, converted in this process (its conversion is not the claim).
    old = ["x", "--noprogress", f"--input={old_in}", f"--output_dir={out}", "--num_workers=0"]
    assert cli.main(old) == 0
    (out / "notes.md").write_text("mine")
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    args = [f"--input={new_in}", f"--output_dir={out}", "--overwrite", "--num_shards=20"]
    run = subprocess.Popen(
        [sys.executable, CLI, "--noprogress", "--num_workers=1", *args], start_new_session=True
    )
    staging = tmp_path / ".out.to_tfrecord-new"
    deadline = time.monotonic() + TIMEOUT_S
    while not (staging.exists() and any(n.endswith(".json") for n in os.listdir(staging))):
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait(timeout=30)
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before
    assert _counts(out) == {"train": 10}
    assert _run(*args, "--num_workers=2").returncode == 0
    assert _counts(out) == {"train": 270, "validation": 30}
    assert (out / "notes.md").read_text() == "mine" and not staging.exists()
    assert not [p for p in os.listdir(tmp_path) if "to_tfrecord" in p]


def _items(n: int) -> list:
    return [Item(_png(value=i), i % 2, f"{i % 2}/{i}.png") for i in range(n)]


def _write(out, items, **kwargs) -> dict:
    return plan.write_dataset(
        {"train": items}, ["a", "b"], str(out), "test", {"train": 2}, seed=0, **kwargs
    )


@pytest.mark.fast
def test_overwrite_that_fails_keeps_the_old_dataset_then_resumes(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _write(out, _items(4))
    real, calls = worker.write_shard, []

    def fails_on_the_second(output_dir, name, items, options):
        calls.append(output_dir)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(output_dir, name, items, options)

    monkeypatch.setattr(plan, "write_shard", fails_on_the_second)
    with pytest.raises(OSError):
        _write(out, _items(6), overwrite=True)
    assert calls[0] == str(tmp_path / ".out.to_tfrecord-new")  # beside, not inside
    assert _counts(out) == {"train": 4}
    monkeypatch.setattr(plan, "write_shard", real)
    assert _write(out, _items(6), overwrite=True)["num_examples"] == {"train": 6}
    assert len(calls) == 2  # the first shard was kept, only the second was written again
    assert _counts(out) == {"train": 6}
    assert sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.fast
def test_overwrite_swaps_by_two_renames_where_there_is_no_exchange(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _write(out, _items(4))
    (out / "notes.md").write_text("mine")
    monkeypatch.setattr(replace, "_exchange", lambda a, b: False)
    assert _write(out, _items(6), overwrite=True)["num_examples"] == {"train": 6}
    assert _counts(out) == {"train": 6} and sorted(os.listdir(tmp_path)) == ["out"]
    assert (out / "notes.md").read_text() == "mine"


@pytest.mark.fast
def test_overwrite_falls_back_to_file_by_file_when_the_folder_cannot_move(tmp_path, monkeypatch):
    """A mount point (or an unwritable parent) cannot be renamed: the new files move in one by
    one, the info file last."""
    out = tmp_path / "out"
    _write(out, _items(4))
    monkeypatch.setattr(replace, "_swap_folders", lambda a, b: False)
    assert _write(out, _items(6), overwrite=True)["num_examples"] == {"train": 6}
    assert _counts(out) == {"train": 6} and sorted(os.listdir(tmp_path)) == ["out"]
    assert not [n for n in os.listdir(out) if n.startswith(".")]


# --- inputs: HDF5, Datum, LMDB, paths ---------------------------------------------------------


@pytest.mark.fast
def test_hdf5_labels_and_rows_are_bounded(tmp_path, monkeypatch):
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f["images"] = np.zeros((3, 8, 8, 3), np.uint8)
        f["labels"] = np.array([0, 1, 10**12], np.int64)
    with pytest.raises(ConvertError, match=r"label 1000000000000: expected class indices below"):
        hdf5.hdf5_source(str(path), "images", "labels", 0.0, 0)
    with h5py.File(path, "w") as f:
        f["images"] = RNG.integers(0, 256, (10, 32, 32, 3), np.uint8)
        f["labels"] = np.arange(10) % 2
    source = hdf5.hdf5_source(str(path), "images", "labels", 0.0, 0)
    monkeypatch.setattr(worker, "_H5_READ_BYTES", 3 * 32 * 32 * 3)  # three rows a read
    reads = []
    real = worker._read_rows
    monkeypatch.setattr(
        worker, "_read_rows", lambda refs, o: reads.append(len(refs)) or real(refs, o)
    )
    info = plan.write_dataset(
        source.splits, source.class_names, str(tmp_path / "o"), "t", {"train": 1}
    )
    assert info["num_examples"] == {"train": 10} and reads == [3, 3, 3, 1]
    monkeypatch.setattr(worker, "_H5_READ_BYTES", 64 << 20)
    options = worker.EncodeOptions(max_megapixels=0)  # every row over the cap: none is read
    rows = worker._read_rows([it.source for it in source.splits["train"]], options)
    assert all(isinstance(v, BadImage) and "image too large" in str(v) for v in rows.values())


@pytest.mark.fast
def test_a_datum_whose_size_overflows_int64_is_a_named_skip():
    def varint(n):
        out = b""
        while n > 0x7F:
            out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
        return out + bytes([n])

    value = b"\x08" + varint(2**63 + 5) + b"\x10\x04\x18\x04\x22\x10" + bytes(16)
    with pytest.raises(BadImage, match="Datum data holds 16 bytes, not channels x height"):
        caffe_datum.datum_image(value, bgr=True)
    assert caffe_datum.value_kind(value) == "unknown"


@pytest.mark.fast
def test_an_lmdb_failing_mid_read_is_a_one_line_error(tmp_path):
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i in range(6):
            txn.put(f"{i % 2}/{i}".encode(), _png())
    env.close()
    source = lmdb_input.lmdb_source(str(tmp_path / "db"), "auto", r"^(\d)/", "", "bgr", 0, 0)
    load = source.splits["train"].load
    assert len(load(0, 2)) == 2
    load.args[0].close()  # the database goes away between two shards' reads
    with pytest.raises(ConvertError, match=r"--input=.*/db: the LMDB database fails while"):
        load(2, 4)


@pytest.mark.fast
def test_home_is_expanded_before_every_check(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    _tree(tmp_path / "in", per_class=2)
    assert cli.main(["x", "--input=~/in", f"--output_dir={tmp_path}/in/out"]) == 2
    assert "is inside --input=~/in" in capsys.readouterr().err
    assert (
        cli.main(["x", "--noprogress", "--num_workers=0", "--input=~/in", "--output_dir=~/out"])
        == 0
    )
    assert _counts(tmp_path / "out") == {"train": 4}


@pytest.mark.fast
def test_listing_special_files_reads_nothing(tmp_path):
    """Listing alone must neither open a FIFO nor follow a link to a device."""
    _tree(tmp_path / "in", per_class=2)
    os.mkfifo(tmp_path / "in" / "a" / "fifo.png")
    source = folders.folder_source(str(tmp_path / "in"), 0.0, 0)
    assert source.skipped == [
        {"file": "a/fifo.png", "reason": "not a regular file: a FIFO (named pipe)"}
    ]
    with pytest.raises(BadImage, match="FIFO"):  # opened non-blocking: no writer needed
        encode.encode_image(str(tmp_path / "in" / "a" / "fifo.png"))


@pytest.mark.fast
def test_a_fifo_as_input_or_labels_file_is_one_line(tmp_path, capsys):
    """Neither h5py's nor LMDB's sniffing, nor the labels file's read, may open a FIFO (an
    alarm fails a regression that would block)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    signal.alarm(30)
    try:
        assert cli.main(["x", f"--input={fifo}", f"--output_dir={tmp_path / 'o'}"]) == 2
        assert "is not a regular file (expected a folder, an HDF5" in capsys.readouterr().err
        with pytest.raises(ConvertError, match="--lmdb_labels_file=.*fifo: not a regular file"):
            lmdb_input.read_labels_file(str(fifo))
    finally:
        signal.alarm(0)
