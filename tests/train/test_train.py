import json
import os

import numpy as np
import pytest

from tfgpu import train
from tfgpu.config import config_from, validate
from tfgpu.train.actions import Action

pytestmark = pytest.mark.slow  # the tests read one run of the module

CONTRACT_FILES = [
    "config.json",
    "metrics.jsonl",
    "summary.json",
    "checkpoints",
    "final.weights.h5",
    "tensorboard",
    "export/model.keras",
    "export/saved_model",
]


def _config(data_dir, model_dir, **kw):
    base = dict(
        strategy="default",
        model="tiny_cnn",
        data_dir=data_dir,
        model_dir=str(model_dir),
        image_size=16,  # what a run writes and that it learns do not need 32x32's CPU
        global_batch_size=16,
        train_steps=40,
        optimizer="adam",
        learning_rate=0.003,
        weight_decay=0.0,
        warmup_steps=0,
        lr_schedule="constant",
        random_flip=False,
        crop_min_area=0.8,
        log_every_steps=10,
        checkpoint_every_steps=20,
        steps_per_loop=5,
        seed=1,
        deterministic=True,  # the same data order and draws every run: no flaky "loss falls"
        input_probe_s=0.0,  # no start-up probe of the input alone: conftest.TINY_RUN's note
    )
    base.update(kw)
    return validate(config_from(**base))


class _Recorder(Action):
    """A run's own action: what it saw at each step it was asked."""

    every = 3

    def __init__(self):
        self.seen = []

    def __call__(self, state):
        self.seen.append((state.step, state.evaluation[0] if state.evaluation else None))


@pytest.fixture(scope="module")
def run(small_dataset, tmp_path_factory):
    """(model_dir, summary, what a run's own action saw) of one 40-update run that evaluates
    every epoch and asks a _Recorder every 3 updates: the module's three tests read it."""
    model_dir = tmp_path_factory.mktemp("run")
    recorder = _Recorder()
    config = _config(small_dataset, model_dir, eval_every_epochs=1.0)
    summary = train.run(config, actions=[recorder])
    return model_dir, summary, recorder.seen


def test_short_run_writes_every_contract_file_and_learns(run):
    model_dir, summary, _ = run
    for name in CONTRACT_FILES:
        assert os.path.exists(model_dir / name), name
    metrics = map(json.loads, open(model_dir / "metrics.jsonl"))
    logged = [r for r in metrics if r["split"] == "train"]
    train_losses = [r["loss"] for r in logged]
    # Each window's images/s, turned back into seconds, must fit inside the run's wall time.
    window_seconds = sum(10 * 16 / r["images_per_sec"] for r in logged)
    assert 0 < window_seconds < summary["wall_time_s"]
    assert len(train_losses) == 4
    assert np.mean(train_losses[-2:]) < 0.7 * train_losses[0]
    assert summary["steps"] == 40 and summary["final_eval"]["top1"] > 0.5
    assert json.load(open(model_dir / "summary.json"))["num_replicas"] == 1
    assert json.load(open(model_dir / "config.json"))["model"] == "tiny_cnn"


def test_evaluation_every_epoch(run):
    # 96 train examples / 16 per update = 6 updates per epoch: evaluations at 6, 12, .., 36
    # and the end.
    model_dir, _, _ = run
    metrics = map(json.loads, open(model_dir / "metrics.jsonl"))
    evals = [r["step"] for r in metrics if r["split"] == "validation"]
    assert evals == [6, 12, 18, 24, 30, 36, 40]


def test_a_runs_own_actions_are_asked_after_the_built_in_ones(run):
    # Asked at every multiple of 3 but the last step (the run's own), after this step's
    # evaluation (at each multiple of 6; the newest one's step else), although the loop
    # runs --steps_per_loop=5 updates.
    _, summary, seen = run
    assert seen == [(step, 6 * (step // 6) or None) for step in range(3, 40, 3)]
    assert summary["steps"] == 40
