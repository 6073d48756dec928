"""Every command of README.md, CONTRIBUTING.md and docs/ runs as written, as far as that can be
known without training (tests/docs/doc_commands.py says how each is checked)."""

import pytest
from doc_checks import StandIns, problems
from doc_commands import ROOT, Command, commands, make_targets, phony_targets

pytestmark = pytest.mark.fast


def test_every_command_of_the_docs_passes_the_checks_its_command_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # where the pages' relative paths start
    (tmp_path / "empty").mkdir()
    stand_ins = StandIns(folder=str(tmp_path / "empty"), fresh=str(tmp_path / "fresh"))
    found = commands()
    assert len(found) > 100, len(found)
    wrong = [f"{c.where}: {c.text[:100]}: {p}" for c in found for p in problems(c, stand_ins)]
    assert not wrong, "\n".join(wrong)
    assert not (tmp_path / "fresh").exists()  # nothing was written for them


def test_every_declared_make_target_does_something():
    rules = make_targets()
    assert not [t for t in phony_targets() if not rules.get(t, "").strip()]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("python -m tfgpu.main --learning_rat=0.1", "no flag --learning_rat"),
        ("tfgpu-train --flagfile=flags/resnet50.flags --data_dir=/d", "flags/resnet50.flags"),
        ("python -m tfgpu.main --global_batch_size=10 --grad_accum_steps=3", "global_batch"),
        ("python -m tfgpu.main --train_steps=10 --epochs=2", "not both"),
        ("mpirun -np 2 python -m tfgpu.main --strategy=mirrored", "trains on one machine"),
        ("tfgpu-horovodrun -np 2 python -m tfgpu.main --strategy=multi_worker_mirrored", "horovod"),
        ("python -m tfgpu.launch --num_workers=2 -- --strategy=default", "separate copies"),
        ("tfgpu-ray --num_workers=0 -- --model=tiny_cnn", "at least 1"),
        (
            "python tools/to_tfrecord.py --input=/x --output_dir=/y --validation_fraction=1",
            "[0, 1)",
        ),
        ("tfgpu-export --model_dir=r --format=onnx --quantise=int8", "no flag --quantise"),
        ("tfgpu-evaluate --model_dir=r --top_k=three", "top_k"),
        ("make bench", "no such target"),
        ("pip install '.[horovod]'", "no extra [horovod]"),
        ("bash tools/install_horovods.sh", "does not exist"),
        (".venv/bin/python -m pytest -q tests/test_nothing.py", "does not exist"),
        ("python -m tfgpu.trainer --help", "no such command"),
        ("tfgpu-serve --model_dir=r", "not a console script"),
    ],
)
def test_the_checks_find_what_is_wrong(text, expected, tmp_path, monkeypatch):
    """Each kind of mistake a page could make is found, with a line that says what."""
    monkeypatch.chdir(ROOT)
    (tmp_path / "empty").mkdir()
    stand_ins = StandIns(folder=str(tmp_path / "empty"), fresh=str(tmp_path / "fresh"))
    found = problems(Command("page.md:1", text), stand_ins)
    assert found and expected in found[0], found


def test_a_command_that_leaves_values_open_is_checked_by_its_flag_names(tmp_path):
    stand_ins = StandIns(folder=str(tmp_path), fresh=str(tmp_path / "fresh"))
    open_ = Command("page.md:1", "tfgpu-ray --num_workers=N -- <tfgpu flags>")
    assert problems(open_, stand_ins) == []
    typo = Command("page.md:1", "tfgpu-ray --num_worker=N -- <tfgpu flags>")
    assert problems(typo, stand_ins) == ["tfgpu-ray: no flag --num_worker"]
