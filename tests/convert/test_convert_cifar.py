"""The converter's CIFAR input: the python batches of CIFAR-10 and CIFAR-100, as Python 2 wrote
them, converted and read back exactly; pickles that name any global but numpy's array
reconstruction, or ask it to allocate, refused unrun in one line (exit code 2)."""

import io
import pickle
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_convert_arrays import HYPOTHESIS, RNG, _info, _records, _refused, _run

pytestmark = pytest.mark.fast


class Py2Pickler(pickle._Pickler):
    """Writes bytes and str as Python 2's str (BINSTRING), numpy's globals as numpy 1.x
    named them: what CIFAR's own files hold (pickled by Python 2's cPickle)."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_bytes(self, obj):
        n = len(obj)
        head = bytes([ord("U"), n]) if n < 256 else b"T" + struct.pack("<i", n)
        self.write(head + obj)
        self.memoize(obj)

    def save_str(self, obj):
        self.save_bytes(obj.encode("latin1"))

    dispatch[bytes] = save_bytes
    dispatch[str] = save_str


def py2_pickle(obj) -> bytes:
    out = io.BytesIO()
    Py2Pickler(out, protocol=2).dump(obj)
    return out.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def _cifar10(folder, batches=2, n=5, test=True) -> dict:
    """A CIFAR-10 python folder of ``batches`` train batches of ``n`` rows (Python 2 pickles);
    returns {batch name: (CHW rows, labels)}."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [b"plane", b"car", b"bird"]
    (folder / "batches.meta").write_bytes(py2_pickle({"label_names": names, "num_vis": 3072}))
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, batches + 1)] + ["test_batch"] * test:
        data = RNG.integers(0, 256, (n, 3072), np.uint8)
        labels = [int(v) for v in RNG.integers(0, 3, n)]
        files = [f"{name}_{i}.png".encode() for i in range(n)]
        batch = {"batch_label": b"x", "data": data, "labels": labels, "filenames": files}
        (folder / name).write_bytes(py2_pickle(batch))
        written[name] = (data, labels)
    return written


def test_cifar10_python_batches_round_trip_exactly(tmp_path, capsys):
    """Python 2 pickles (bytes keys, numpy.core's _reconstruct) through the restricted
    Unpickler; channel-first rows stored as HWC RGB, test_batch as validation."""
    written = _cifar10(tmp_path / "cifar-10-batches-py")
    out = tmp_path / "out"
    code, stdout, _ = _run(
        capsys, f"--input={tmp_path / 'cifar-10-batches-py'}", f"--output_dir={out}"
    )
    assert code == 0 and "; test_batch -> validation; lossless PNG" in stdout
    assert _info(out)["class_names"] == ["plane", "car", "bird"]
    rows = _records(out)
    assert {s: len(r) for s, r in rows.items()} == {"train": 10, "validation": 5}
    for name, (data, labels) in written.items():
        split = "validation" if name == "test_batch" else "train"
        for i, label in enumerate(labels):
            chw = data[i].reshape(3, 32, 32)
            assert rows[split][f"{name}/{name}_{i}.png"][:2] == (label, "RGB")
            assert np.array_equal(rows[split][f"{name}/{name}_{i}.png"][2], chw.transpose(1, 2, 0))


def test_cifar100_python_folder_uses_fine_labels(tmp_path, capsys):
    """CIFAR-100's train/test/meta, here pickled by Python 3 and numpy 2 (str keys)."""
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    meta = {"fine_label_names": ["apple", "bee"], "coarse_label_names": ["food"]}
    (folder / "meta").write_bytes(pickle.dumps(meta, protocol=4))
    data = RNG.integers(0, 256, (4, 3072), np.uint8)
    batch = {"data": data, "fine_labels": [1, 0, 1, 1], "coarse_labels": [0] * 4}
    (folder / "train").write_bytes(pickle.dumps(batch, protocol=4))
    out = tmp_path / "out"
    code, _, _ = _run(capsys, f"--input={folder}", f"--output_dir={out}", "--validation_fraction=0")
    assert code == 0 and _info(out)["class_names"] == ["apple", "bee"]
    rows = _records(out)["train"]
    assert [rows[f"train[{i}]"][0] for i in range(4)] == [1, 0, 1, 1]
    assert np.array_equal(rows["train[2]"][2], data[2].reshape(3, 32, 32).transpose(1, 2, 0))


_FORBIDDEN = st.sampled_from(
    [
        ("os", "system"),
        ("posix", "system"),
        ("builtins", "eval"),
        ("builtins", "getattr"),
        ("subprocess", "Popen"),
        ("numpy", "load"),
        ("numpy", "frombuffer"),
        ("_codecs", "encode"),
        ("numpy.core.multiarray", "scalar"),
    ]
) | st.tuples(
    st.text(st.characters(codec="utf-8", exclude_characters="\n\r"), min_size=1, max_size=20),
    st.text(st.characters(codec="utf-8", exclude_characters="\n\r"), min_size=1, max_size=20),
)


@HYPOTHESIS
@given(glob=_FORBIDDEN, protocol=st.sampled_from([2, 4]), where=st.sampled_from(["meta", "batch"]))
def test_pickles_naming_forbidden_globals_are_refused_unrun(
    tmp_path, capsys, glob, protocol, where
):
    """A global other than numpy's array reconstruction is named in one line, never called
    (here called with no arguments, were it called)."""
    module, name = glob
    if protocol == 2:
        call = b"c" + module.encode() + b"\n" + name.encode() + b"\n"
    else:
        call = b"".join(b"\x8c" + bytes([len(s.encode())]) + s.encode() for s in glob) + b"\x93"
    hostile = bytes([0x80, protocol]) + call + b")R."
    _cifar10(tmp_path / "c", batches=1, n=2, test=False)
    target = tmp_path / "c" / ("batches.meta" if where == "meta" else "data_batch_1")
    target.write_bytes(hostile)
    err = _refused(capsys, f"--input={tmp_path / 'c'}", f"--output_dir={tmp_path / 'out'}")
    assert f"{target}: refused, not unpickled: it names " in err


@pytest.mark.parametrize(
    "batch, words",
    [
        ("huge", "refused, not unpickled: numpy's _reconstruct with other arguments"),
        ("direct", "refused, not unpickled: it calls numpy.ndarray itself"),
        ({"data": np.zeros((2, 3072), np.float32), "labels": [0, 1]}, "uint8 (N, 3072)"),
        ({"data": np.zeros((2, 3000), np.uint8), "labels": [0, 1]}, "rows of 3000 bytes"),
        ({"data": np.zeros((2, 3072), np.uint8), "labels": [0]}, "a list of 2 integer labels"),
        ({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 7]}, "label 7, but batches.meta"),
        ([1, 2], "expected a dict whose data"),
        ("cut", "is not a readable CIFAR pickle"),
    ],
)
def test_hostile_cifar_batches_are_one_line(tmp_path, capsys, batch, words):
    _cifar10(tmp_path / "c", batches=1, n=2, test=False)
    target = tmp_path / "c" / "data_batch_1"
    if batch == "huge":  # numpy's own reconstruction asked for 2**40 bytes up front
        data = py2_pickle({"data": np.zeros(2, np.uint8)}).replace(
            b"K\x00\x85", b"\x8a\x06\x00\x00\x00\x00\x00\x01\x85"
        )
    elif batch == "direct":  # numpy.ndarray((2**40,)), a terabyte
        data = b"\x80\x02cnumpy\nndarray\n\x8a\x06\x00\x00\x00\x00\x00\x01\x85R."
    elif batch == "cut":
        data = target.read_bytes()[:-100]
    else:
        data = py2_pickle(batch)
    target.write_bytes(data)
    err = _refused(capsys, f"--input={tmp_path / 'c'}", f"--output_dir={tmp_path / 'out'}")
    assert words in err and str(target) in err
