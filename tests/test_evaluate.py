"""python -m tfgpu.evaluate: the run's own evaluation, on any checkpoint and split."""

import json
import os

import pytest

from tfgpu import train
from tfgpu.config import config_from, validate
from tfgpu.errors import CheckpointError, run_command
from tfgpu.evaluate import evaluate

pytestmark = pytest.mark.slow  # one training run of ~15 s on 2 cores


@pytest.fixture(scope="module")
def trained_run(small_dataset, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("run")
    config = config_from(
        strategy="default",
        model="tiny_cnn",
        data_dir=small_dataset,
        model_dir=str(model_dir),
        image_size=32,
        global_batch_size=16,
        eval_batch_size=10,  # 24 validation examples: the last batch is padded
        train_steps=6,
        optimizer="adam",
        learning_rate=0.003,
        weight_decay=0.0,
        ema_decay=0.9,  # evaluation uses the EMA weights: so must tfgpu.evaluate
        lr_schedule="constant",
        eval_every_steps=2,
        keep_best=1,
        best_metric="loss",
        steps_per_loop=2,
        seed=1,
        deterministic=True,
        input_probe_s=0.0,
    )
    summary = train.run(validate(config))
    return str(model_dir), summary


def _evals(model_dir):
    lines = open(os.path.join(model_dir, "metrics.jsonl"), encoding="utf-8")
    return [r for r in map(json.loads, lines) if r["split"] == "validation"]


def test_latest_reproduces_the_final_evaluation(trained_run, tmp_path):
    model_dir, summary = trained_run
    out = tmp_path / "eval.json"
    lines = []
    result = evaluate(model_dir, output=str(out), log=lines.append)
    assert result["step"] == 6 and result["num_examples"] == 24
    for key in ("top1", "top5", "loss"):
        assert result[key] == summary["final_eval"][key], key  # exactly
    written = json.load(open(out))
    for key in ("top1", "top5", "loss", "num_examples", "per_class_accuracy"):
        assert written[key] == result[key]
    matrix = written["confusion_matrix"]
    assert len(matrix) == 4 and sum(map(sum, matrix)) == 24
    correct = sum(matrix[i][i] for i in range(4))
    assert correct / 24 == pytest.approx(result["top1"])
    assert written["class_names"] == ["a", "b", "c", "d"]
    assert "confusion matrix" in lines[0] and "top1" in lines[0]


def test_best_checkpoint_reproduces_its_evaluation(trained_run):
    model_dir, summary = trained_run
    best = min(_evals(model_dir), key=lambda r: r["loss"])
    result = evaluate(model_dir, checkpoint="best", log=lambda _: None)
    assert result["step"] == best["step"] == summary["best"]["step"]
    assert result["loss"] == pytest.approx(best["loss"], rel=1e-6)
    assert result["top1"] == best["top1"]


def test_other_split_and_exported_model(trained_run, small_dataset):
    model_dir, _ = trained_run
    on_train = evaluate(model_dir, split="train", log=lambda _: None)
    assert on_train["num_examples"] == 96 and on_train["split"] == "train"
    exported = os.path.join(model_dir, "export", "model.keras")
    from_file = evaluate(checkpoint=exported, data_dir=small_dataset, log=lambda _: None)
    assert from_file["step"] is None and from_file["num_examples"] == 24


def test_errors_are_one_line(trained_run, tmp_path, capsys):
    model_dir, _ = trained_run
    with pytest.raises(CheckpointError, match="best.json lists no checkpoint"):
        os.makedirs(tmp_path / "run", exist_ok=True)
        with open(tmp_path / "run" / "config.json", "w") as f:
            f.write(open(os.path.join(model_dir, "config.json")).read())
        evaluate(str(tmp_path / "run"), checkpoint="best")
    code = run_command(evaluate, str(tmp_path / "nothing"), prog="tfgpu-evaluate")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "holds no config.json" in err[0]


def test_predict_agrees_with_the_evaluation(trained_run):
    # tfgpu.predict from the run (latest checkpoint, EMA weights) predicts what the
    # evaluation counted: its top-1 labels per class are the confusion matrix's columns.
    from tfgpu.predict import predict

    model_dir, _ = trained_run
    result = evaluate(model_dir, log=lambda _: None)
    rows = predict(split="validation", model_dir=model_dir, top_k=1)
    names = result["class_names"]
    predicted = [sum(1 for r in rows if r["top"][0][0] == n) for n in names]
    assert predicted == [sum(col) for col in zip(*result["confusion_matrix"])]
