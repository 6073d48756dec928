"""Seeing inside a run (issue #23): a diverging float16 run stops and says so, skipped updates
stay out of the window's loss, evaluation reports non-finite logits, the per-window norms and
loss scale, summary.csv and TensorBoard hparams, and the profiler window."""

import contextlib
import io
import json
import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.train import fitting, loop as train
from tfgpu.config import ConfigError, config_from, validate
from tfgpu.distribute import backends
from tfgpu.errors import NonFiniteLoss
from tfgpu.step.loops import make_eval_step
from tfgpu.results.writer import Window, format_progress
from tfgpu.step.train_step import DynamicLossScale

RUN = dict(
    strategy="default",
    model="tiny_cnn",
    image_size=16,  # float16 convolutions are slow on a CPU; no claim here needs 32x32
    global_batch_size=16,
    train_steps=12,
    optimizer="sgd",
    learning_rate=0.01,
    weight_decay=0.0,
    lr_schedule="constant",
    steps_per_loop=4,
    log_every_steps=4,
    checkpoint_every_steps=100,
    export=False,
    seed=1,
    input_probe_s=0.0,  # no start-up probe of the input alone: conftest.TINY_RUN's note
)


def _config(data_dir, model_dir, **kw):
    return validate(config_from(data_dir=data_dir, model_dir=str(model_dir), **dict(RUN, **kw)))


def _rows(model_dir, split):
    rows = map(json.loads, open(os.path.join(model_dir, "metrics.jsonl")))
    return [r for r in rows if r["split"] == split]


@pytest.fixture
def float32_after():
    yield
    keras.mixed_precision.set_global_policy("float32")


# One float32 run of 8 updates that three tests read (each its own part): its windows' norms
# (compared with a mirrored run's), its evaluations' summary.csv rows (then resumed in a copy),
# its profile of updates 3..5.
PLAIN = dict(train_steps=8, deterministic=True, clip_norm=0.5, eval_every_steps=4)


@pytest.fixture(scope="module")
def plain_run(small_dataset, tmp_path_factory):
    """(model_dir, its stdout) of PLAIN with --profile_steps=3:5."""
    model_dir = tmp_path_factory.mktemp("plain")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        train.run(_config(small_dataset, model_dir, profile_steps="3:5", **PLAIN))
    return model_dir, out.getvalue()


# --- 1. a diverging float16 run stops, and says so ------------------------------------------


@pytest.mark.fast
def test_loss_scale_stops_halving_at_its_floor():
    scale = DynamicLossScale(initial=4.0)
    for _ in range(4):
        scale.update(tf.constant(False))
    assert float(scale.scale) == DynamicLossScale.MIN_SCALE == 1.0
    assert bool(scale.at_floor())


@pytest.mark.fast
def test_a_window_of_skipped_updates_has_no_loss_and_says_how_many():
    window = Window()
    window.add({"loss": 0.0, "correct": 0.0, "count": 0.0, "steps": 0.0, "skipped_updates": 4}, 4)
    record = window.close(4, 0.1, 16)
    assert record["loss"] is None and record["accuracy"] is None
    assert record["skipped_updates"] == 4
    line = format_progress(record, 10, 16)
    assert "loss -" in line and "skipped 4 update(s)" in line


@pytest.mark.fast
def test_max_skipped_updates_must_not_be_negative():
    with pytest.raises(ConfigError, match="--max_skipped_updates=-1"):
        validate(config_from(max_skipped_updates=-1))


def test_diverging_float16_run_stops_with_one_line_naming_step_scale_and_skips(
    small_dataset, tmp_path, float32_after
):
    # Injected overflow: at a learning rate of 1e6 the weights blow up after the first update;
    # every later update overflows, the scale halves from 2**15 to its floor (15 updates),
    # and 5 more in a row at the floor stop the run.
    config = _config(
        small_dataset,
        tmp_path,
        dtype="mixed_float16",
        learning_rate=1e6,
        train_steps=2000,
        max_skipped_updates=5,
    )
    with pytest.raises(NonFiniteLoss) as err:
        train.run(config)
    line = err.value.line("tfgpu")
    assert "\n" not in line and err.value.exit_code == 3
    assert "loss scale at its floor (1)" in line and "5 updates in a row skipped" in line
    step = int(line.split("at step ")[1].split(":")[0])
    assert step < 40  # stopped early, not after 2,000 updates
    for row in _rows(tmp_path, "train"):
        # skipped updates never enter the window's loss: a window of them shows none
        if row["skipped_updates"] == 4:
            assert row["loss"] is None and row["accuracy"] is None
        assert row["loss"] is None or np.isfinite(row["loss"])
    assert any(r["skipped_updates"] for r in _rows(tmp_path, "train"))
    assert not os.path.exists(tmp_path / "final.weights.h5")


@pytest.mark.fast
def test_evaluation_counts_non_finite_logits_wrong_for_top1_and_top5():
    # Logits inf for the first half of the examples (NaN-producing softmax), finite otherwise.
    inputs = keras.Input((8, 8, 3))
    flat = keras.layers.Flatten()(inputs)
    logits = keras.layers.Dense(10)(flat)
    bad = keras.layers.Lambda(lambda x: tf.where(x[:, :1] > 100.0, np.inf, 0.0))(flat)
    model = keras.Model(inputs, keras.layers.Add()([logits, bad]))
    images = np.zeros((8, 8, 8, 3), np.uint8)
    images[:4] = 255  # > 100: the inf half
    batch = {
        "image": tf.constant(images),
        "label": tf.zeros([8], tf.int32),
        "weight": tf.ones([8]),
    }
    sums = make_eval_step(model, backends.build_backend("default"))(batch)
    sums = {k: float(v) for k, v in sums.items()}
    assert sums["non_finite"] == 4 and sums["count"] == 8
    assert sums["top5"] >= sums["top1"]
    assert sums["top1"] <= 4 and sums["top5"] <= 4  # the inf half is never right
    assert np.isfinite(sums["loss"])


# --- 2. per-window diagnostics ----------------------------------------------------------------


def test_windows_log_grad_norm_clipping_weight_norm_and_loss_scale(
    small_dataset, tmp_path, float32_after
):
    config = _config(small_dataset, tmp_path, dtype="mixed_float16", clip_norm=1e-3)
    train.run(config)
    rows = _rows(tmp_path, "train")
    assert [r["step"] for r in rows] == [4, 8, 12]
    for row in rows:
        applied = 4 - row["skipped_updates"]
        assert row["grad_norm"] > 1e-3  # so every applied update was clipped
        assert row["clipped_updates"] == applied
        assert row["weight_norm"] > 0 and row["loss_scale"] >= 1.0
    tags = set()
    for path in tf.io.gfile.glob(str(tmp_path / "tensorboard/train/*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    assert {"grad_norm", "weight_norm", "loss_scale", "skipped_updates"} <= tags


def test_window_norms_under_mirrored_equal_those_of_one_device(small_dataset, tmp_path, plain_run):
    # The norms are taken after the all-reduce: 2 replicas of 8 give the figures of 1 of 16.
    rows = {"default": _rows(plain_run[0], "train")}
    train.run(_config(small_dataset, tmp_path, strategy="mirrored", **PLAIN))
    rows["mirrored"] = _rows(tmp_path, "train")
    assert [r["step"] for r in rows["default"]] == [r["step"] for r in rows["mirrored"]] != []
    for a, b in zip(rows["default"], rows["mirrored"], strict=True):
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["weight_norm"] == pytest.approx(b["weight_norm"], rel=1e-5)
        assert a["clipped_updates"] == b["clipped_updates"]


@pytest.mark.fast
def test_windows_without_clipping_or_float16_leave_those_out():
    window = Window()
    totals = {"loss": 2.0, "correct": 8.0, "count": 32.0, "steps": 2.0, "grad_norm": 3.0}
    window.add(dict(totals, weight_norm=5.0), 2)
    window.add(dict(totals, weight_norm=6.0), 2)
    record = window.close(4, 0.1, 16)
    assert record["grad_norm"] == 1.5 and record["weight_norm"] == 6.0  # mean, last
    assert "loss_scale" not in record and record["loss"] == 1.0


# --- 3. comparing runs: summary.csv and TensorBoard hparams -----------------------------------


def _events(directory):
    for path in tf.io.gfile.glob(os.path.join(directory, "events.out.tfevents.*")):
        yield from tf.compat.v1.train.summary_iterator(path)


def test_summary_csv_has_a_row_per_evaluation_and_tensorboard_has_hparams(
    small_dataset, tmp_path, plain_run
):
    import csv

    tmp_path = tmp_path / "run"
    shutil.copytree(plain_run[0], tmp_path)  # resumed below: the other tests read the original
    rows = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert [int(r["step"]) for r in rows] == [4, 8]
    assert list(rows[0]) == ["step", "epoch", "top1", "top5", "loss", "learning_rate",
                             "images_per_sec"]  # fmt: skip
    for row in rows:
        assert float(row["top5"]) >= float(row["top1"])
        assert float(row["learning_rate"]) == pytest.approx(0.01)
        assert float(row["images_per_sec"]) > 0
    assert float(rows[1]["epoch"]) == pytest.approx(8 * 16 / 96, abs=1e-3)  # 96 train examples
    # A resumed run (more steps, same model_dir) appends, header once.
    train.run(_config(small_dataset, tmp_path, **dict(PLAIN, train_steps=12)))
    lines = open(tmp_path / "summary.csv").read().splitlines()
    assert lines[0].startswith("step,") and [ln.split(",")[0] for ln in lines[1:]] == [
        "4",
        "8",
        "12",
    ]
    plugins, tags = set(), set()
    for event in _events(str(tmp_path / "tensorboard")):
        for value in event.summary.value:
            plugins.add(value.metadata.plugin_data.plugin_name)
            tags.add(value.tag)
    assert "hparams" in plugins
    assert {"final/top1", "final/top5", "final/loss"} <= tags


# --- 4. the profiler window -------------------------------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize("value", ["3", "1:4", "5:4", "a:b", "3:"])
def test_bad_profile_steps_fail_with_one_line_naming_the_flag(value):
    with pytest.raises(ConfigError, match="--profile_steps="):
        validate(config_from(profile_steps=value))


@pytest.mark.fast
def test_profile_action_stops_the_loop_at_the_window_edges():
    from tfgpu.train.actions import Profile

    profile = Profile(3, 5, "/unused")
    assert [profile.next_stop(s) for s in (0, 1, 2, 4, 5, 9)] == [2, 2, 5, 5, None, None]
    assert fitting.next_stop([profile], 0, 100, 10) == 2
    assert fitting.next_stop([profile], 2, 100, 10) == 5


def test_profile_steps_write_a_trace_holding_the_train_step(plain_run):
    tmp_path, out = plain_run
    traces = tf.io.gfile.glob(str(tmp_path / "tensorboard/plugins/profile/*/*.xplane.pb"))
    assert len(traces) == 1
    content = open(traces[0], "rb").read()
    assert b"Conv2D" in content  # tiny_cnn's convolutions ran while tracing
    assert "profile of updates 3..5 written" in out
