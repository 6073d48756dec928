"""--eval_tta=flip (evaluation averages the softmax of each image and its mirror) and
checkpoint averaging (--average_checkpoints at the end of a run, tfgpu-average after it)."""

import json
import os

import h5py
import keras
import numpy as np
import pytest
from weights import assert_same_weights, changed, combined, same_structure
from weights import named as named_weights
import tensorflow as tf
from absl import flags

from tfgpu import compat, models, train
from tfgpu.cli.average import average
from tfgpu.config import config_from, validate
from tfgpu.cli.flags import define_flags
from tfgpu.train.config import check_average_plan
from tfgpu.data.spec import load_spec
from tfgpu.distribute import backends
from tfgpu.errors import ConfigError, UsageError
from tfgpu.cli.app import run_command
from tfgpu.cli.evaluate import evaluate
from tfgpu.cli.train import make_config
from tfgpu.step.loops import make_eval_step, mean_of_softmax
from tfgpu.checkpoint import network
from tfgpu.config import rundir as head
from tfgpu.cli import head as cli_head
from tfgpu.checkpoint.average import mean_weights, read_model_and_optimizer
from tfgpu.inference.evaluate import Evaluator

# Slow by the tiers' rule (one run of ~5 s shared by the module's end-to-end tests); the tests
# that neither train nor start a process are marked fast.


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# --- test-time augmentation ------------------------------------------------------------------


@pytest.mark.fast
def test_mean_of_softmax_is_the_mean_of_the_probabilities_and_exact_for_equal_views():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(64, 10)).astype(np.float32) * 5
    b = rng.normal(size=(64, 10)).astype(np.float32) * 5
    c = mean_of_softmax(tf.constant(a), tf.constant(b)).numpy()
    np.testing.assert_allclose(_softmax(c), (_softmax(a) + _softmax(b)) / 2, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(mean_of_softmax(tf.constant(a), tf.constant(a)).numpy(), a)
    # Views that disagree completely: no overflow, half the probability each.
    far = mean_of_softmax(tf.constant([[100.0, -100.0]]), tf.constant([[-100.0, 100.0]]))
    np.testing.assert_allclose(_softmax(far.numpy()), [[0.5, 0.5]], rtol=1e-6)


def _tiny(image_size=16, seed=0):
    keras.utils.set_random_seed(seed)
    return models.build_model("tiny_cnn", 4, image_size)


def _batch(images, labels):
    n = len(labels)
    return {
        "image": tf.constant(images),
        "label": tf.constant(labels, tf.int32),
        "weight": tf.ones([n]),
    }


@pytest.mark.fast
def test_flip_tta_on_mirror_symmetric_images_gives_exactly_the_plain_numbers():
    model, backend = _tiny(), backends.build_backend("default")
    half = np.random.default_rng(1).integers(0, 256, size=(12, 16, 8, 3), dtype=np.uint8)
    images = np.concatenate([half, half[:, :, ::-1]], axis=2)  # each image == its mirror
    np.testing.assert_array_equal(images, images[:, :, ::-1])
    batch = _batch(images, np.arange(12) % 4)
    plain = make_eval_step(model, backend)(batch)
    flipped = make_eval_step(model, backend, tta="flip")(batch)
    assert {k: float(v) for k, v in flipped.items()} == {k: float(v) for k, v in plain.items()}


@pytest.mark.fast
def test_flip_tta_equals_averaging_the_two_views_probabilities_by_hand():
    model, backend = _tiny(), backends.build_backend("default")
    images = np.random.default_rng(2).integers(0, 256, size=(12, 16, 16, 3), dtype=np.uint8)
    labels = np.arange(12) % 4
    sums = make_eval_step(model, backend, tta="flip")(_batch(images, labels))
    x = images.astype(np.float32)
    views = [model(x, training=False), model(x[:, :, ::-1], training=False)]
    p = np.mean([_softmax(np.asarray(v, np.float64)) for v in views], axis=0)
    rows = np.arange(12)
    assert float(sums["loss"]) == pytest.approx(-np.log(p[rows, labels]).sum(), rel=1e-5)
    assert float(sums["top1"]) == (p.argmax(-1) == labels).sum()
    top5 = min(5, p.shape[1])
    in_top = (np.argsort(-p, axis=-1)[:, :top5] == labels[:, None]).any(-1)
    assert float(sums["top5"]) == in_top.sum() and float(sums["count"]) == 12
    plain = make_eval_step(model, backend)(_batch(images, labels))
    assert float(plain["loss"]) != pytest.approx(float(sums["loss"]), rel=1e-6)  # it did change


def test_flip_tta_under_mirrored_equals_one_device(small_dataset):
    """The flip is per example, inside the replica function: 2 replicas give one device's
    numbers over the whole validation split (its last batch padded)."""
    config = validate(config_from(data_dir=small_dataset, image_size=16, model="tiny_cnn"))
    spec = load_spec(config.data)
    results = {}
    weights = _tiny().get_weights()
    for strategy in ("default", "mirrored"):
        backend = backends.build_backend(strategy)
        with backend.scope():
            model = _tiny()
        model.set_weights(weights)
        results[strategy] = Evaluator(model, backend, spec, config.data, 10, tta="flip")()
    one, two = results["default"], results["mirrored"]
    assert two["tta"] == one["tta"] == "flip" and two["num_examples"] == one["num_examples"] == 24
    assert (two["top1"], two["top5"]) == (one["top1"], one["top5"])
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)


# --- averaging checkpoints -------------------------------------------------------------------


def _bn_model():
    """A small net with BatchNorm: its moving statistics are averaged too."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3)(x))


def _write(model, optimizer, prefix, values=None) -> str:
    if values is not None:
        model.set_weights(values)
    return tf.train.Checkpoint(model=model, optimizer=optimizer).write(str(prefix))


def _random_weights(model, seed):
    rng = np.random.default_rng(seed)
    # Magnitudes from 1e-6 to 1e3: float32 rounding shows at every scale.
    return [
        (rng.normal(size=w.shape) * 10.0 ** rng.uniform(-6, 3, size=w.shape)).astype(np.float32)
        for w in model.get_weights()
    ]


def _mean(x, y):
    """The mean of two float32 arrays as tfgpu's average computes it."""
    return (x + y) / np.float32(2)


@pytest.mark.fast
def test_the_average_of_identical_checkpoints_is_each_of_them_to_the_bit(tmp_path):
    model, optimizer = _bn_model(), keras.optimizers.SGD()
    optimizer.build(model.trainable_variables)
    values = _random_weights(model, 1)
    paths = [_write(model, optimizer, tmp_path / f"ckpt-{i}", values) for i in range(3)]
    model.set_weights(_random_weights(model, 2))  # what the model held does not matter
    read = lambda p: read_model_and_optimizer(model, optimizer, p)  # noqa: E731
    mean = mean_weights(model, optimizer, paths, read)
    assert len(mean) == len(values) == 8  # conv 2, BatchNorm 4 (gamma, beta, mean, var), dense 2
    mean, values = same_structure(mean, values)
    for name, got in mean.items():
        assert got.dtype == np.float32 and got.tobytes() == values[name].tobytes(), name


@pytest.mark.fast
def test_the_average_of_two_checkpoints_is_their_mean_by_hand_batchnorm_included(tmp_path):
    model, optimizer = _bn_model(), keras.optimizers.SGD()
    optimizer.build(model.trainable_variables)
    a, b = _random_weights(model, 3), _random_weights(model, 4)
    paths = [
        _write(model, optimizer, tmp_path / "a", a),
        _write(model, optimizer, tmp_path / "b", b),
    ]
    read = lambda p: read_model_and_optimizer(model, optimizer, p)  # noqa: E731
    mean = mean_weights(model, optimizer, paths, read)
    assert_same_weights(mean, combined(_mean, a, b))
    bn = model.get_layer(index=2)
    assert "moving_mean" in bn.weights[2].path  # the fourth array: a statistic, averaged too


@pytest.mark.fast
def test_with_an_ema_the_average_is_of_the_ema_weights(tmp_path):
    """What evaluation uses of each checkpoint (compat.ema_weights), not the trained weights."""
    model = _bn_model()
    optimizer = keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5)
    optimizer.build(model.trainable_variables)
    paths, ema, raw = [], [], []
    for i in range(2):
        grads = [tf.ones_like(v) * (i + 1) for v in model.trainable_variables]
        optimizer.apply(grads, model.trainable_variables)
        with compat.ema_weights(optimizer):
            ema.append(model.get_weights())
        raw.append(model.get_weights())
        paths.append(_write(model, optimizer, tmp_path / f"ckpt-{i}"))
    read = lambda p: read_model_and_optimizer(model, optimizer, p)  # noqa: E731
    mean = mean_weights(model, optimizer, paths, read)
    assert_same_weights(mean, combined(_mean, *ema))
    assert changed(mean, combined(_mean, *raw))  # not the trained ones


@pytest.mark.fast
def test_settings_that_cannot_average_are_one_line_errors():
    with pytest.raises(ConfigError, match="only --keep_checkpoints=3 are kept"):
        validate(config_from(average_checkpoints=4))
    with pytest.raises(ConfigError, match="must not be negative"):
        validate(config_from(average_checkpoints=-1))
    with pytest.raises(ConfigError, match="do not go together"):
        validate(config_from(average_checkpoints=2, export_best=True, eval_every_steps=2))
    with pytest.raises(ConfigError, match="--eval_tta='mirror' is unknown"):
        validate(config_from(eval_tta="mirror"))
    t = config_from(average_checkpoints=3, checkpoint_every_steps=4).train
    check_average_plan(t, 9)  # steps 4, 8 and the last, 9
    with pytest.raises(ConfigError, match="write 2 checkpoint.*every_steps=2 or less"):
        check_average_plan(t, 8)
    with pytest.raises(ConfigError, match="train 3 updates or more"):
        check_average_plan(t, 2)
    with pytest.raises(UsageError, match="needs --model_dir"):
        head.head_config("", "averaged.weights.h5")


# --- end to end: a run of tfgpu.main's flags, then tfgpu-average and tfgpu-evaluate ----------

RUN_FLAGS = [
    "--strategy=default",
    "--model=tiny_cnn",
    "--image_size=16",
    "--global_batch_size=16",
    "--eval_batch_size=10",  # 24 validation examples: the last batch padded
    "--train_steps=6",
    "--checkpoint_every_steps=2",
    "--eval_every_steps=2",
    "--eval_tta=flip",
    "--average_checkpoints=2",
    "--optimizer=adam",
    "--learning_rate=0.003",
    "--steps_per_loop=2",
    "--input_probe_s=0",
    "--seed=1",
    "--deterministic",
]


@pytest.fixture(scope="module")
def averaged_run(small_dataset, tmp_path_factory):
    """(model_dir, summary) of a run from tfgpu.main's flags (parsed as the command does)."""
    model_dir = str(tmp_path_factory.mktemp("run"))
    values = flags.FlagValues()
    define_flags(values)
    values(["tfgpu", *RUN_FLAGS, f"--data_dir={small_dataset}", f"--model_dir={model_dir}"])
    config = make_config(values)
    assert (config.train.eval_tta, config.train.average_checkpoints) == ("flip", 2)
    return model_dir, train.run(config)


def _model_weights(path) -> dict:
    """The model weights of checkpoint ``path``, read by hand into a fresh registry model."""
    model = _tiny()
    tf.train.Checkpoint(model=model).read(path).expect_partial()
    return named_weights(model)


def _file_weights(path) -> dict:
    model = _tiny()
    model.load_weights(path)
    return named_weights(model)


def test_the_runs_final_weights_are_the_mean_of_its_last_two_checkpoints(averaged_run):
    model_dir, summary = averaged_run
    assert summary["steps"] == 6 and summary["averaged_checkpoints"] == [4, 6]
    assert summary["final_eval"]["tta"] == "flip" and 0 <= summary["final_eval"]["top1"] <= 1
    rows = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
    evals = [r for r in rows if r["split"] == "validation"]
    assert [r["step"] for r in evals] == [2, 4, 6] and {r["tta"] for r in evals} == {"flip"}
    assert evals[-1]["loss"] == summary["final_eval"]["loss"]
    ckpt = os.path.join(model_dir, "checkpoints")
    a, b = (_model_weights(os.path.join(ckpt, f"ckpt-{s}")) for s in (4, 6))
    final = _file_weights(os.path.join(model_dir, "final.weights.h5"))
    assert changed(a, b)
    assert_same_weights(final, combined(_mean, a, b))
    # The export is the averaged model too; the final checkpoint, the last trained state.
    exported = keras.saving.load_model(os.path.join(model_dir, "export", "model.keras"))
    assert_same_weights(exported, final)
    assert_same_weights(_model_weights(os.path.join(ckpt, "ckpt-6")), b)


def test_tfgpu_average_writes_the_same_mean_and_evaluate_reproduces_final_eval(
    averaged_run, tmp_path
):
    model_dir, summary = averaged_run
    out = str(tmp_path / "mean.weights.h5")
    lines = []
    done = average(model_dir, 2, out, log=lines.append)
    assert done["steps"] == [4, 6] and "steps [4, 6]" in lines[0]
    with h5py.File(out, "r") as f:
        assert len(f.keys()) > 0
    assert_same_weights(out, os.path.join(model_dir, "final.weights.h5"))  # both named by path
    # Evaluated as a file of weights, with the run's --eval_tta: the run's final numbers.
    result = evaluate(model_dir, checkpoint=out, log=lambda _: None)
    assert result["tta"] == "flip" and result["step"] is None
    for key in ("top1", "top5", "loss"):
        assert result[key] == summary["final_eval"][key], key
    plain = evaluate(model_dir, checkpoint=out, eval_tta="none", log=lambda _: None)
    assert plain["tta"] == "none" and plain["loss"] != result["loss"]


def test_tfgpu_average_refuses_more_checkpoints_than_kept_in_one_line(averaged_run, capsys):
    model_dir, _ = averaged_run
    for last, message in [(4, "--last=4: "), (0, "--last=0: give how many")]:
        code = run_command(average, model_dir, last, prog="tfgpu-average")
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], err
        assert err[0].startswith("tfgpu-average: error:")
    code = run_command(average, model_dir, 2, "out.h5", prog="tfgpu-average")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "must end with .weights.h5" in err[0]


def test_with_an_ema_the_run_averages_and_evaluates_the_ema_weights(small_dataset, tmp_path):
    """--ema_decay: the mean is of each checkpoint's EMA weights (what evaluation uses), and
    the final evaluation is of that mean as it is (no EMA swapped in over it): tfgpu-evaluate
    of final.weights.h5 gives the run's final numbers."""
    values = flags.FlagValues()
    define_flags(values)
    argv = [f for f in RUN_FLAGS if not f.startswith(("--eval_tta", "--eval_every"))]
    argv += ["--ema_decay=0.5", "--export=false", f"--data_dir={small_dataset}"]
    values(["tfgpu", *argv, f"--model_dir={tmp_path}"])
    summary = train.run(make_config(values))
    assert summary["averaged_checkpoints"] == [4, 6] and summary["final_eval"]["tta"] == "none"
    r = cli_head.open_run(str(tmp_path), optimizer=True).network
    ema, raw = [], []
    for step in (4, 6):
        network.restore(r, os.path.join(tmp_path, "checkpoints", f"ckpt-{step}"))
        raw.append(named_weights(r.model))
        with compat.ema_weights(r.optimizer):
            ema.append(named_weights(r.model))
    final = _file_weights(os.path.join(tmp_path, "final.weights.h5"))
    assert_same_weights(final, combined(_mean, *ema))
    assert changed(final, combined(_mean, *raw))
    result = evaluate(str(tmp_path), checkpoint=str(tmp_path / "final.weights.h5"), log=print)
    for key in ("top1", "top5", "loss"):
        assert result[key] == summary["final_eval"][key], key
