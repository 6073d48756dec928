"""docs/finetune.md's "Fine-tune on your own images", end to end, as a user runs it: a folder of
JPEGs -> tools/to_tfrecord.py -> python -m tfgpu.main (efficientnet_b0 from a Keras .h5 file,
frozen backbone, best checkpoint kept) -> python -m tfgpu.evaluate --checkpoint=best ->
python -m tfgpu.predict on the folder -> CSV.

The commands are read from the page's block and run with its flags: only paths (to this
test's folder) and sizes (32x32 images, 4 updates) differ, so the page cannot drift from what
works. Each command is a subprocess, in the test's folder, as a user types it.

Cost, measured on the 2 shared cores (2026-12-07, the module alone with pytest -n 0, every
process it starts counted in a cpuacct cgroup): 45.5 CPU-s, 57 s wall at a load of 2.4-4 (133
CPU-s earlier in the project). Most of it is tracing efficientnet_b0's graphs (train step, eval
step, export, and again in each command), which the sizes do not change. The export traced the
network 8 times (twice for each of its four signatures) until its signatures shared one
function of it (twice in all): 61.4 -> 48.6 CPU-s for the module at a load of 7-11. The
export's archive then walked every object the model reaches for lookup tables (keras'
ExportArchive.track); keeping the variables without that walk: 43.3 -> 38.4 CPU-s (mean of
two pairs at a load of 4.5-6).
"""

import csv
import json
import os
import shlex
import subprocess
import sys

import pytest
from conftest import make_image_arrays, run_summary
from PIL import Image
from keras_files import efficientnet_b0_h5

GUIDE = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "docs", "finetune.md")
SECTION = "## Fine-tune on your own images"
CLASSES = ("cat", "dog", "fox", "owl")
PER_CLASS = {"train": 8, "validation": 4}  # 32 train images: 2 updates of 16 per epoch
WEIGHTS = "efficientnetb0_notop.h5"  # made here, in keras.applications' own format
# The page's paths -> this test's (relative: the commands run in tmp_path).
PATHS = {
    "~/my_photos": "my_photos",
    "/data/my_photos-tfr": "my_photos-tfr",
    "imagenet": WEIGHTS,
    "new_photos/": "my_photos/",
}
# Sizes for 2 cores (absl keeps a flag's last value): 32x32 images with the small-input
# stem, 2 epochs of 2 updates, so evaluations (every epoch) at steps 2 and 4.
SIZES = ["--small_input", "--image_size=32", "--global_batch_size=16", "--epochs=2"]
TIMEOUT = 900  # the whole chain, on a loaded machine; see the module docstring


def readme_commands() -> list[list[str]]:
    """The commands of the page's fine-tuning block, as argv lists (continuations joined)."""
    with open(GUIDE, encoding="utf-8") as f:
        section = f.read().split(SECTION, 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def localized(argv: list[str]) -> list[str]:
    """A command of the page with this test's python, paths and sizes."""
    out = [sys.executable]
    for arg in argv[1:]:
        name, eq, value = arg.partition("=")
        if eq and value in PATHS:
            arg = f"{name}={PATHS[value]}"
        out.append(PATHS.get(arg, arg))
    return out + (SIZES if "tfgpu.main" in argv else [])


def _make_photos(root) -> list[str]:
    """ROOT/train|validation/<class>/imgNN.jpg (a bright quadrant per class); their paths."""
    n = len(CLASSES) * sum(PER_CLASS.values())
    images, labels = make_image_arrays(n, size=40, num_classes=len(CLASSES))
    seen = {c: 0 for c in range(len(CLASSES))}
    paths = []
    for i, (image, label) in enumerate(zip(images, labels)):
        split = "train" if seen[label] < PER_CLASS["train"] else "validation"
        seen[label] += 1
        folder = root / split / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"img{i:02d}.jpg", quality=90)
        paths.append(str(folder / f"img{i:02d}.jpg"))
    return paths


def _run(argv: list[str], cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, f"{shlex.join(argv)}\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
    return out


@pytest.mark.fast  # reads the page only
def test_readme_commands_are_the_walkthrough():
    convert, train, evaluate, predict = readme_commands()
    assert convert[:2] == ["python", "tools/to_tfrecord.py"]
    assert [c[:3] for c in (train, evaluate, predict)] == [
        ["python", "-m", f"tfgpu.{name}"] for name in ("main", "evaluate", "predict")
    ]
    for flag in ("--freeze=backbone", "--keep_best=1", "--init_weights=imagenet"):
        assert flag in train, train
    assert "--checkpoint=best" in evaluate and "--checkpoint=best" in predict
    assert any(a.startswith("--output=") for a in evaluate), "evaluate writes its JSON"
    # Every path of the block is one the walk-through replaces: none is the user's.
    values = [a.partition("=")[2] or a for c in readme_commands() for a in c[2:]]
    paths = {v for v in values if v.startswith(("~", "/")) or v.endswith("/")}
    assert paths <= set(PATHS), paths - set(PATHS)


@pytest.mark.timeout(TIMEOUT)  # four processes; 2 shared cores: see the module docstring
def test_photos_to_predictions(tmp_path, monkeypatch):
    convert, train, evaluate, predict = map(localized, readme_commands())
    monkeypatch.chdir(tmp_path)  # the run's files hold paths as given: relative to here
    photos = _make_photos(tmp_path / "my_photos")
    efficientnet_b0_h5(tmp_path / WEIGHTS)
    root = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)
    _run([convert[0], os.path.join(root, convert[1]), *convert[2:]], tmp_path)
    _check_converted(tmp_path / "my_photos-tfr")

    run = _run(train, tmp_path)
    model_dir = tmp_path / _flag(train, "model_dir")
    best = _check_trained(model_dir, run.stdout)

    evaluated = _run(evaluate, tmp_path)
    _check_evaluated(tmp_path / _flag(evaluate, "output"), best, evaluated.stdout)
    assert os.listdir(model_dir / "tensorboard" / "evaluate")  # the confusion matrix image
    predicted = _run(predict, tmp_path)
    _check_predicted(tmp_path / _flag(predict, "output"), photos, tmp_path)
    assert f"predicted {len(photos)} image(s), 0 error(s)" in predicted.stdout


def _flag(argv: list[str], name: str) -> str:
    """The (last) value of ``--name=`` in ``argv``."""
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    return values[-1]


def _check_converted(data_dir) -> None:
    info = json.load(open(data_dir / "dataset_info.json"))
    assert info["class_names"] == list(CLASSES)
    assert info["num_examples"] == {s: len(CLASSES) * n for s, n in PER_CLASS.items()}
    for split in PER_CLASS:
        for shard in info["splits"][split]["shards"]:
            assert os.path.exists(data_dir / shard["file"])


def _check_trained(model_dir, stdout: str) -> dict:
    """best.json names an existing checkpoint of an evaluation the run logged; returns it."""
    assert f"weights from --init_weights={WEIGHTS}" in stdout and "backbone frozen" in stdout
    doc = json.load(open(model_dir / "best" / "best.json"))
    (best,) = doc["kept"]
    assert doc["metric"] == "top1" and os.path.isfile(f"{best['checkpoint']}.index")
    evals = [json.loads(line) for line in open(model_dir / "metrics.jsonl")]
    evals = [r for r in evals if r["split"] == "validation"]
    assert [r["step"] for r in evals] == [2, 4]  # every epoch of 2 updates
    logged = next(r for r in evals if r["step"] == best["step"])
    assert (logged["top1"], logged["loss"]) == (best["top1"], best["loss"])
    summary = run_summary(model_dir)
    assert summary["steps"] == 4 and summary["best"]["step"] == best["step"]
    assert os.path.exists(model_dir / "export" / "model.keras")  # --export_best
    return best


def _check_evaluated(output, best: dict, stdout: str) -> None:
    """tfgpu.evaluate on the best checkpoint gives the run's own evaluation of it, exactly."""
    result = json.load(open(output))
    assert result["checkpoint"] == best["checkpoint"] and result["step"] == best["step"]
    assert (result["top1"], result["loss"]) == (best["top1"], best["loss"])
    assert result["num_examples"] == len(CLASSES) * PER_CLASS["validation"]
    assert result["class_names"] == list(CLASSES) and "confusion matrix image in" in stdout


def _check_predicted(output, photos: list[str], cwd) -> None:
    """One CSV row per image of the folder, top-4 (all classes) with probabilities."""
    rows = list(csv.reader(open(output, newline="")))
    assert ",".join(rows[0]) == (
        "path,label_1,prob_1,label_2,prob_2,label_3,prob_3,label_4,prob_4,error"
    )
    assert sorted(os.path.join(cwd, r[0]) for r in rows[1:]) == sorted(photos)
    for row in rows[1:]:
        assert row[-1] == "" and sorted(row[1:-1:2]) == sorted(CLASSES)
        assert sum(float(p) for p in row[2:-1:2]) == pytest.approx(1.0, abs=1e-4)
