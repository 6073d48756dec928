"""python -m tfgpu.evaluate: the run's own evaluation, on any checkpoint and split."""

import itertools
import json
import os

import numpy as np
import pytest

from tfgpu import train
from tfgpu.config import config_from, validate
from tfgpu.errors import CheckpointError
from tfgpu.cli.app import run_command
from tfgpu.cli.evaluate import evaluate
from tfgpu.results.writer import confusion_image

# Slow by the tiers' rule (it trains: one run of ~15 s on 2 cores), but for the fast test of
# the image alone.


@pytest.fixture(scope="module")
def trained_run(small_dataset, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("run")
    config = config_from(
        strategy="default",
        model="tiny_cnn",
        data_dir=small_dataset,
        model_dir=str(model_dir),
        image_size=16,  # the size is not the claim: ~25 ms of CPU an update, not ~65
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
    # The matrix as a TensorBoard image, in the run's tensorboard/evaluate/, at its step.
    images = _images(os.path.join(model_dir, "tensorboard", "evaluate"))
    image = images[("confusion_matrix/validation", 6)]
    np.testing.assert_array_equal(image, confusion_image(matrix))
    assert image.shape == (512, 512, 3) and "Images tab" in lines[-1]


def test_best_checkpoint_reproduces_its_evaluation(trained_run):
    model_dir, summary = trained_run
    best = min(_evals(model_dir), key=lambda r: r["loss"])
    result = evaluate(model_dir, checkpoint="best", log=lambda _: None)
    assert result["step"] == best["step"] == summary["best"]["step"]
    assert result["loss"] == pytest.approx(best["loss"], rel=1e-6)
    assert result["top1"] == best["top1"]


def test_other_split_and_exported_model(trained_run, small_dataset, tmp_path):
    model_dir, _ = trained_run
    on_train = evaluate(model_dir, split="train", log=lambda _: None)
    assert on_train["num_examples"] == 96 and on_train["split"] == "train"
    exported = os.path.join(model_dir, "export", "model.keras")
    tensorboard = str(tmp_path / "tb")  # --tensorboard_dir: a .keras file has no run of its own
    from_file = evaluate(
        checkpoint=exported, data_dir=small_dataset, log=lambda _: None, tensorboard_dir=tensorboard
    )
    assert from_file["step"] is None and from_file["num_examples"] == 24
    assert list(_images(tensorboard)) == [("confusion_matrix/validation", 0)]


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
    # A TensorBoard folder that cannot be made is one warning; the results are still given.
    (tmp_path / "a-file").write_text("")
    result = evaluate(model_dir, log=lambda _: None, tensorboard_dir=str(tmp_path / "a-file/tb"))
    (warning,) = capsys.readouterr().err.strip().splitlines()
    assert "WARNING: no TensorBoard image" in warning and result["num_examples"] == 24


def _images(logdir) -> dict:
    """{(tag, step): the decoded image} of every image summary in ``logdir``."""
    import tensorflow as tf

    found = {}
    for path in tf.io.gfile.glob(os.path.join(logdir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "images":
                    width, height, png = tf.make_ndarray(value.tensor)  # TensorBoard's layout
                    image = tf.io.decode_png(png).numpy()
                    assert image.shape[:2] == (int(height), int(width))
                    found[(value.tag, event.step)] = image
    return found


@pytest.mark.fast
def test_confusion_image_is_a_heat_map_of_the_row_shares():
    matrix = [[4, 0, 0], [1, 2, 1], [0, 0, 0]]  # a perfect class, a mixed one, an empty one
    image = confusion_image(matrix)
    side = 512 // 3
    assert image.shape == (3 * side, 3 * side, 3) and image.dtype == np.uint8
    centres = image[side // 2 :: side, side // 2 :: side].astype(int).sum(axis=-1)
    shares = np.array([[1, 0, 0], [0.25, 0.5, 0.25], [0, 0, 0]])
    # Brighter exactly where the share is larger: the perfect class's diagonal is white.
    for a, b in itertools.product(np.ndindex(3, 3), repeat=2):
        assert np.sign(centres[a] - centres[b]) == np.sign(shares[a] - shares[b]), (a, b)
    assert centres[0, 0] == 3 * 255 and centres[2].max() == 0
    assert (image[side, :] == 64).all()  # cells outlined
    assert confusion_image(np.eye(1000)).shape == (1000, 1000, 3)  # a pixel per cell


def test_predict_agrees_with_the_evaluation(trained_run):
    # tfgpu.predict from the run (latest checkpoint, EMA weights) predicts what the
    # evaluation counted: its top-1 labels per class are the confusion matrix's columns.
    from tfgpu.cli.predict import predict

    model_dir, _ = trained_run
    result = evaluate(model_dir, log=lambda _: None)
    rows = predict(split="validation", model_dir=model_dir, top_k=1)
    names = result["class_names"]
    predicted = [sum(1 for r in rows if r["top"][0][0] == n) for n in names]
    assert predicted == [sum(col) for col in zip(*result["confusion_matrix"])]
