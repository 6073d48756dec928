"""Class balance (tfgpu/data/balance.py): --class_weights in the loss, exact under replicas and
accumulation; --balanced_sampling's stateless draws (frequencies, repeatability, resume); and
the effect on an imbalanced split, in tfgpu.evaluate's per-class accuracy."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import BALANCE_RUN, TINY_RUN, TRAIN_COUNTS, final_weights
from weights import assert_same_weights

from tfgpu import models, optim
from tfgpu.train import loop as train
from tfgpu.config import config_from, validate
from tfgpu.data import balance, memory, run_input, sampling
from tfgpu.data import spec as data_spec
from tfgpu.data.config import DataConfig
from tfgpu.data.stream import Stream
from tfgpu.distribute import InputShard, backends
from tfgpu.errors import ConfigError
from tfgpu.cli.evaluate import evaluate
from tfgpu.data.recordformat import INFO_FILE
from tfgpu.step.train_step import TrainStep

NAMES = ["a", "b", "c", "d"]


# --- the weights' arithmetic ----------------------------------------------------------


@pytest.mark.fast
def test_auto_weights_are_inverse_frequency_with_mean_one_over_examples(imbalanced):
    counts = balance.train_class_counts(imbalanced, 4)
    np.testing.assert_array_equal(counts, TRAIN_COUNTS)
    w = balance.class_weights("auto", imbalanced, NAMES)
    n = np.array(TRAIN_COUNTS, float)
    np.testing.assert_allclose(w, n.sum() / (4 * n))  # 96 / (4 n_c): 0.4, 1, 3, 6
    assert (w * n).sum() / n.sum() == pytest.approx(1.0)
    # A class without train examples weighs 1 and leaves the mean at 1.
    np.testing.assert_allclose(balance.inverse_frequency([30, 0, 10]), [2 / 3, 1, 2])


@pytest.mark.fast
def test_auto_without_per_class_counts_is_one_line_naming_the_file(imbalanced, tmp_path):
    """An info file without the counts (another tool's) still reads; auto says which file
    lacks them."""
    with open(os.path.join(imbalanced, INFO_FILE), encoding="utf-8") as f:
        info = json.load(f)
    del info["splits"]["train"]["per_class"]
    old = tmp_path / "old"
    old.mkdir()
    for name in os.listdir(imbalanced):
        if name != INFO_FILE:
            os.symlink(os.path.join(imbalanced, name), old / name)
    (old / INFO_FILE).write_text(json.dumps(info))
    assert data_spec.load_data_spec(str(old)).num_train == 96  # still readable
    with pytest.raises(ConfigError, match=f"--class_weights=auto .*{old / INFO_FILE}") as err:
        balance.class_weights("auto", str(old), NAMES)
    assert "\n" not in str(err.value)


@pytest.mark.fast
def test_weights_file_by_name_or_index_and_its_errors(tmp_path):
    good = tmp_path / "w.json"
    good.write_text(json.dumps({"a": 0.5, "3": 4, "c": 0}))
    np.testing.assert_array_equal(balance.class_weights(str(good), "", NAMES), [0.5, 1, 0, 4])
    bad = {
        '{"e": 1}': "'e' is not a class",
        '{"4": 1}': "'4' is not a class",
        '{"a": -1}': "'a' is -1, not a finite number >= 0",
        '{"a": "2"}': "'a' is '2', not a finite number",
        '{"a": true}': "'a' is True, not a finite number",
        '{"a": NaN}': "not a finite number",
        '{"a": 1, "0": 2}': "class 'a' is given twice",
        "[1, 2]": "not an object",
        "{oops": "not readable JSON",
    }
    for text, message in bad.items():
        good.write_text(text)
        with pytest.raises(ConfigError, match=f"--class_weights={good}: .*{message}") as err:
            balance.class_weights(str(good), "", NAMES)
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="no such file"):
        balance.class_weights(str(tmp_path / "missing.json"), "", NAMES)


@pytest.mark.fast
def test_flags_are_checked_before_tensorflow_runs(tmp_path):
    def check(**kw):
        with pytest.raises(ConfigError) as err:
            validate(config_from(**kw))
        return str(err.value)

    assert "no such file" in check(class_weights=str(tmp_path / "none.json"))
    assert "needs --balanced_sampling" in check(sampling_power=0.5)
    assert "in [0, 1]" in check(balanced_sampling=True, sampling_power=1.5)
    assert "needs the train split in memory" in check(balanced_sampling=True, in_memory="off")
    validate(config_from(class_weights="auto", balanced_sampling=True, sampling_power=0.0))


@pytest.mark.fast
def test_per_example_loss_weighs_each_class_share_of_the_target():
    """Hard labels weigh w_y; a mixed target lam e_a + (1 - lam) e_b weighs each part by its
    class (in all lam w_a + (1 - lam) w_b); a broken row adds nothing; the sum is over the
    global batch, whatever the weights sum to."""
    w = np.array([0.5, 2.0, 1.0], np.float32)
    backend = backends.build_backend("default")
    with backend.scope():
        model = models.build_model("tiny_cnn", num_classes=3, image_size=16)
        opt = optim.build_optimizer("sgd", 0.01)
        step = TrainStep(model, opt, backend, global_batch_size=4, class_weights=w)
    logits = tf.constant([[1.0, 2.0, 0.5], [0.3, -1.0, 2.0], [0.0, 0.1, 0.2]])
    nll = -tf.nn.log_softmax(logits).numpy()
    targets = np.array([[0, 1, 0], [0.3, 0, 0.7], [0, 0, 0]], np.float32)
    expected = (2.0 * nll[0, 1] + 0.3 * 0.5 * nll[1, 0] + 0.7 * 1.0 * nll[1, 2]) / 4
    assert step.loss(logits, tf.constant(targets)).numpy() == pytest.approx(expected, 1e-6)
    hard = step.loss(logits[:2], tf.constant([1, 2])).numpy()
    assert hard == pytest.approx((2.0 * nll[0, 1] + 1.0 * nll[1, 2]) / 4, rel=1e-6)


@pytest.mark.fast
def test_evaluation_and_prediction_read_a_run_without_its_class_balance(tmp_path):
    """Evaluation is unweighted: a run's weights file need not exist where it is evaluated."""
    from tfgpu import files
    from tfgpu.config import rundir as head

    run = {"model": "tiny_cnn", "class_weights": str(tmp_path / "gone.json")}
    run |= {"balanced_sampling": True, "sampling_power": 0.5, "in_memory": "off"}
    files.write_json(str(tmp_path / "config.json"), run)
    config = head.run_config(str(tmp_path))
    assert config.optim.class_weights == "" and not config.data.balanced_sampling
    assert config.data.sampling_power == 1.0


# --- balanced sampling ----------------------------------------------------------------

BALANCED = DataConfig(image_size=32, in_memory="on", balanced_sampling=True)


@pytest.fixture(scope="module")
def mem(imbalanced):
    return memory.load(data_spec.load_data_spec(imbalanced), BALANCED)


def _stream(mem, data=BALANCED, batch=16, seed=3, start_index=0):
    stream = Stream(batch, batch, seed, deterministic=True, start_index=start_index)
    return memory.make_train_dataset(mem, data, InputShard(1, 0), stream)


def _labels(ds, batches):
    return np.concatenate([b["label"].numpy() for b in ds.take(batches)])


@pytest.mark.fast
@pytest.mark.parametrize("power", [1.0, 0.5, 0.0])
def test_class_frequencies_match_the_target_within_a_binomial_bound(mem, power):
    """p(class) ~ n^(1 - power) over 60 epochs of the 96-example split (5,760 draws): every
    class within 4.5 standard deviations of its expected count."""
    data = DataConfig(image_size=32, in_memory="on", balanced_sampling=True, sampling_power=power)
    labels = _labels(_stream(mem, data, batch=96), 60)
    p = np.array(TRAIN_COUNTS, float) ** (1 - power)
    p /= p.sum()
    counts, draws = np.bincount(labels, minlength=4), len(labels)
    bound = 4.5 * np.sqrt(draws * p * (1 - p))
    assert (np.abs(counts - draws * p) < bound).all(), (counts, draws * p)


@pytest.mark.fast
def test_the_tables_draw_each_example_of_a_class_and_never_a_broken_one():
    labels = np.array([0, 1, 0, 2, 0, 1])
    weights = np.array([1, 1, 0, 1, 1, 1], np.float32)  # example 2 is broken
    members, starts, counts = balance.class_pools(labels, weights, 4)
    np.testing.assert_array_equal(members, [0, 4, 1, 5, 3])
    np.testing.assert_array_equal(counts, [2, 2, 1, 0])
    np.testing.assert_array_equal(starts, [0, 2, 4, 5])
    p = balance.sampling_probabilities(counts, 1.0)
    np.testing.assert_allclose(p, [1 / 3, 1 / 3, 1 / 3, 0])
    assert balance.cumulative(p)[2:].tolist() == [1.0, 1.0]
    key = lambda stream: tf.constant([11, -stream], tf.int64)  # noqa: E731
    tables = {"members": members, "starts": starts, "counts": counts, "cdf": balance.cumulative(p)}
    index = sampling.balanced_index(key, 30_000, {k: tf.constant(v) for k, v in tables.items()})
    seen = np.bincount(index.numpy(), minlength=6)
    assert seen[2] == 0 and seen[3] == pytest.approx(10_000, rel=0.05)
    assert seen[0] == pytest.approx(5_000, rel=0.07) and seen[5] == pytest.approx(5_000, rel=0.07)


@pytest.mark.fast
def test_same_seed_same_sequence_and_resume_equals_uninterrupted(mem):
    """Batches of 16 over 96 positions per epoch: batch 9 starts mid-epoch 1."""
    a = [b["image"].numpy() for b in _stream(mem).take(14)]
    b = [b["image"].numpy() for b in _stream(mem).take(14)]
    resumed = [b["image"].numpy() for b in _stream(mem, start_index=9 * 16).take(5)]
    np.testing.assert_array_equal(np.stack(a), np.stack(b))
    np.testing.assert_array_equal(np.stack(a[9:]), np.stack(resumed))
    other = [b["image"].numpy() for b in _stream(mem, seed=4).take(14)]
    assert np.stack(a).shape == np.stack(other).shape and not np.array_equal(a, other)
    by_8 = np.concatenate([b["label"].numpy() for b in _stream(mem, batch=8).take(28)])
    np.testing.assert_array_equal(by_8, np.concatenate([_labels(_stream(mem), 14)]))


@pytest.mark.fast
def test_the_streaming_path_is_a_one_line_error(imbalanced):
    """The per-example reader has no random access by class: refused when the run is built."""
    config = validate(
        config_from(data_dir=imbalanced, image_size=96, balanced_sampling=True, model="tiny_cnn")
    )
    spec = data_spec.load_data_spec(imbalanced)
    with pytest.raises(ConfigError, match="--balanced_sampling needs the train split in memory"):
        run_input.class_balance(config.data, spec)


# --- training -------------------------------------------------------------------------


def test_class_weights_in_micro_batches_and_resumed_end_as_one_uninterrupted_device(
    imbalanced, reference_run, tmp_path, monkeypatch
):
    """--class_weights=auto with balanced sampling at power 0.5 and MixUp/CutMix (BALANCE_RUN):
    a run in 2 micro-batches, stopped after 3 updates (mid-epoch) then resumed, ends where one
    uninterrupted device does in whole batches (2 mirrored replicas too:
    tests/distribute/test_mirrored_equals_default.py's row). Micro-batches and the resume in
    one run: either gone wrong leaves the reference's weights."""
    flags = BALANCE_RUN
    reference = final_weights(reference_run(data_dir=imbalanced, **flags))

    def run(**kw):
        values = dict(TINY_RUN, **flags, strategy="default", grad_accum_steps=2, **kw)
        config = config_from(data_dir=imbalanced, model_dir=str(tmp_path), **values)
        return train.run(validate(config))

    assert run(train_steps=3)["steps"] == 3
    lines = []
    monkeypatch.setattr(
        "tfgpu.results.writer.RunWriter.info", lambda self, line: lines.append(line)
    )
    summary = run()
    assert summary["steps"] == 6 and summary["grad_accum_steps"] == 2
    assert any(line.startswith("resumed from") and "at step 3" in line for line in lines)
    assert_same_weights(tmp_path, reference, atol=1e-5)


def test_a_run_trains_with_the_class_weights_its_workers_agreed_on(
    imbalanced, tmp_path, monkeypatch
):
    """--class_weights=FILE rewritten after the workers compared it (train.loop.agreed_input) and
    before the run is built (train._build): the loss and the start-up line have the compared
    weights."""
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"d": 4.0}))
    built, lines, real_build = [], [], train._build

    def rewritten_then_built(*args, **kwargs):
        path.write_text(json.dumps({"d": 9.0}))
        state, start_lines = real_build(*args, **kwargs)
        built.append(state)
        return state, start_lines

    monkeypatch.setattr(train, "_build", rewritten_then_built)
    monkeypatch.setattr(
        "tfgpu.results.writer.RunWriter.info", lambda self, line: lines.append(line)
    )
    values = dict(TINY_RUN, train_steps=1, class_weights=str(path), input_probe_s=0.0)
    config = config_from(data_dir=imbalanced, model_dir=str(tmp_path / "run"), **values)
    train.run(validate(config))
    np.testing.assert_array_equal(built[0].step.loss.class_weights.numpy(), [1, 1, 1, 4])
    assert any("to 4 (d)" in line for line in lines) and not any("9 (d)" in x for x in lines)


def _train_and_evaluate(data_dir, model_dir, **kw) -> dict:
    values = dict(
        TINY_RUN,
        image_size=16,  # the classes' quadrants are as plain at 16x16; half the CPU of 32x32
        seed=2,
        train_steps=40,
        optimizer="adam",
        learning_rate=0.003,
        random_flip=False,  # a flip turns a quadrant image of class a into one of b
        steps_per_loop=20,
        log_every_steps=20,
        input_probe_s=0.0,
    )
    config = config_from(data_dir=data_dir, model_dir=str(model_dir), **dict(values, **kw))
    train.run(validate(config))
    return evaluate(str(model_dir), log=lambda _: None)


def test_balancing_lifts_the_rarest_class_in_the_per_class_accuracy(imbalanced, tmp_path):
    """On the 60/24/8/4 split, 40 updates at 16x16: tfgpu.evaluate's per-class accuracy on the
    balanced validation split shows class d (4 train examples) missed without balancing, and
    learnt with class weights or with balanced sampling (measured at 40 updates: plain 1, 1,
    0, 0; both others 1, 1, 1, 1; at 60: plain 1, 1, 1, 0, sampling drawn at the natural
    frequencies 1, 1, 1, 0; at 24 class weights still miss d). The contrast is the seed's (2,
    deterministic): at 60 updates, seeds 1, 4, 6 and 7 let the plain run learn d from its 4
    examples too, so this shows balancing at work where plain training misses a class, not
    that plain training always misses it."""
    plain = _train_and_evaluate(imbalanced, tmp_path / "plain")
    weighted = _train_and_evaluate(imbalanced, tmp_path / "weighted", class_weights="auto")
    sampled = _train_and_evaluate(imbalanced, tmp_path / "sampled", balanced_sampling=True)
    assert plain["per_class_accuracy"][3] <= 0.25
    assert weighted["per_class_accuracy"][3] >= 0.75
    assert sampled["per_class_accuracy"][3] >= 0.75
    assert min(weighted["per_class_accuracy"] + sampled["per_class_accuracy"]) >= 0.5
