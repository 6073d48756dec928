"""A folder given as --input that holds no class folders: the line says what it holds instead
and what to pass (the .npz, HDF5 or IDX files it holds are inputs of their own)."""

import gzip

import numpy as np
import pytest

from tfgpu.convert.inputs import folders, idx
from tfgpu.errors import ConvertError

pytestmark = pytest.mark.fast


def _idx(path, array: np.ndarray, compress: bool = False) -> None:
    head = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(n).to_bytes(4, "big") for n in array.shape
    )
    data = head + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


def test_a_folder_holding_one_npz_names_it_and_says_to_pass_it(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((4, 8, 8), np.uint8), y_train=np.zeros(4))
    with pytest.raises(ConvertError) as raised:
        folders.folder_source(str(tmp_path), 0.1, 0)
    assert str(raised.value) == (
        f"--input={tmp_path} holds no class folders but mnist.npz: pass the file itself, "
        f"--input={tmp_path / 'mnist.npz'}"
    )


def test_idx_files_under_other_names_are_named_with_the_names_they_need(tmp_path):
    _idx(tmp_path / "images.bin", np.zeros((3, 4, 4)))
    _idx(tmp_path / "labels.gz", np.zeros(3), compress=True)
    (tmp_path / "README").write_text("not IDX")
    assert idx.looks_like_idx(str(tmp_path / "labels.gz"))
    assert not idx.looks_like_idx(str(tmp_path / "README"))
    with pytest.raises(ConvertError) as raised:
        folders.folder_source(str(tmp_path), 0.1, 0)
    message = str(raised.value)
    assert "but IDX files under other names than MNIST's (images.bin, labels.gz)" in message
    assert "train-images-idx3-ubyte, train-labels-idx1-ubyte" in message


def test_a_folder_of_loose_images_says_the_layout_expected(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(ConvertError, match=r"no class folders \(expected ROOT/<class>/<image>"):
        folders.folder_source(str(tmp_path), 0.1, 0)
