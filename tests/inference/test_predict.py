"""python -m tfgpu.predict: image files, folders or a converted split -> top-k CSV."""

import csv
import os

import numpy as np
import pytest
from PIL import Image

from conftest import make_image_arrays
from tfgpu import models
from tfgpu.errors import UsageError
from tfgpu.cli.predict import predict
from tfgpu.inference.predict import header
from tfgpu.inference.export.serving import export_model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    path = tmp_path_factory.mktemp("export")
    export_model(models.build_model("tiny_cnn", 4, 32), str(path), image_size=32)
    return str(path / "model.keras")


def _folder(tmp_path):
    """3 good JPEGs, a cut-short one and one whose bytes between the markers are garbage."""
    folder = tmp_path / "images"
    folder.mkdir()
    images, _ = make_image_arrays(3, size=40)
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / f"good{i}.jpg", quality=90)
    whole = (folder / "good0.jpg").read_bytes()
    (folder / "cut.jpg").write_bytes(whole[: len(whole) // 2])
    noise = np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8).tobytes()
    (folder / "garbage.jpg").write_bytes(b"\xff\xd8\xff" + noise + b"\xff\xd9")
    return folder


@pytest.mark.slow  # ~10 s: loads a model, traces the preprocessing
def test_folder_with_broken_files(exported, small_dataset, tmp_path, capsys):
    folder = _folder(tmp_path)
    out = tmp_path / "predictions.csv"
    predict([str(folder)], checkpoint=exported, data_dir=small_dataset, output=str(out), top_k=3)
    rows = list(csv.reader(open(out, newline="")))
    assert rows[0] == header(3) == [
        "path", "label_1", "prob_1", "label_2", "prob_2", "label_3", "prob_3", "error"
    ]  # fmt: skip
    by_name = {os.path.basename(r[0]): r for r in rows[1:]}
    assert sorted(by_name) == ["cut.jpg", "garbage.jpg", "good0.jpg", "good1.jpg", "good2.jpg"]
    for name in ("good0.jpg", "good1.jpg", "good2.jpg"):
        row = by_name[name]
        assert row[-1] == "" and {row[1], row[3], row[5]} <= {"a", "b", "c", "d"}
        probs = [float(row[i]) for i in (2, 4, 6)]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-5
    assert "not a whole image" in by_name["cut.jpg"][-1] and by_name["cut.jpg"][1] == ""
    assert by_name["garbage.jpg"][-1]
    err = capsys.readouterr().err
    assert "cut.jpg" in err and "garbage.jpg" in err


@pytest.mark.slow  # ~10 s
def test_split_of_a_converted_dataset(exported, small_dataset, tmp_path):
    rows = predict(split="validation", checkpoint=exported, data_dir=small_dataset, top_k=2)
    assert len(rows) == 24 and all(not r["error"] and len(r["top"]) == 2 for r in rows)
    assert all(r["path"].startswith("synthetic") for r in rows)  # the stored file names


@pytest.mark.fast
def test_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="image files or folders, or --split"):
        predict([], checkpoint="x.keras")
    with pytest.raises(UsageError, match="no such file or folder"):
        predict([str(tmp_path / "missing.jpg")], checkpoint="x.keras")
