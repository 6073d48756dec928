"""What large batches use, against references written out in numpy: LARS (TF Model Garden's
arithmetic), the BCE loss (timm's), the poly schedule and the batch-size scaling of the
learning rate, the EMA's warm-up (Model Garden's) and its BatchNorm statistics; and the
one-line errors of their flags. Their equivalence across strategies is in test_step.py,
test_batchnorm.py and test_equivalence.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu import compat, optim
from tfgpu.config import config_from, validate
from tfgpu.errors import ConfigError
from tfgpu.optim import schedules
from tfgpu.optim.lars import LARS
from tfgpu.step.losses import Loss


def _lars_reference(weights, grads_per_step, lr, momentum, decay, eeta, decayed, adapted):
    """Model Garden's LARS (classic momentum) in numpy: the weights after each step."""
    weights = [w.astype(np.float64) for w in weights]
    velocity = [np.zeros_like(w) for w in weights]
    for grads in grads_per_step:
        for i, g in enumerate(grads):
            g = g.astype(np.float64) + (decay * weights[i] if decayed[i] else 0.0)
            rate = lr
            w_norm, g_norm = np.linalg.norm(weights[i]), np.linalg.norm(g)
            if adapted[i] and w_norm > 0 and g_norm > 0:
                rate = lr * eeta * w_norm / g_norm
            velocity[i] = momentum * velocity[i] + rate * g
            weights[i] = weights[i] - velocity[i]
    return weights


def _lars_variables():
    rng = np.random.default_rng(0)
    shapes = {
        "conv/kernel": (3, 3, 2, 4),
        "conv/bias": (4,),
        "bn/gamma": (4,),
        "dense/kernel": (4, 3),
    }
    variables = []
    for path, shape in shapes.items():
        layer, name = path.split("/")
        with keras.name_scope(layer):
            variables.append(keras.Variable(rng.normal(size=shape).astype(np.float32), name=name))
    return variables


@pytest.mark.fast
def test_lars_steps_equal_model_gardens_arithmetic():
    variables = _lars_variables()
    assert [v.path for v in variables][:2] == ["conv/kernel", "conv/bias"]
    start = [v.numpy() for v in variables]
    rng = np.random.default_rng(1)
    steps = [[rng.normal(size=v.shape).astype(np.float32) for v in variables] for _ in range(3)]
    steps[1][3] = np.zeros_like(steps[1][3])  # a zero gradient: trust ratio 1, decay only
    opt = LARS(
        0.5,
        momentum=0.9,
        weight_decay_rate=1e-2,
        eeta=0.02,
        exclude_from_weight_decay=["bias", "gamma"],
        exclude_from_layer_adaptation=["gamma"],
    )
    opt.build(variables)
    assert [opt.decays(v) for v in variables] == [True, False, False, True]
    assert [opt.adapts(v) for v in variables] == [True, True, False, True]
    for grads in steps:
        opt.apply([tf.constant(g) for g in grads], variables)
    expected = _lars_reference(
        start, steps, 0.5, 0.9, 1e-2, 0.02, [True, False, False, True], [True, True, False, True]
    )
    for var, want, first in zip(variables, expected, start, strict=True):
        np.testing.assert_allclose(var.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=var.path)
        assert np.abs(var.numpy() - first).max() > 1e-3  # every variable moved


@pytest.mark.fast
def test_lars_from_the_registry_excludes_batchnorm_and_biases_by_default():
    opt = optim.build_optimizer("lars", 1.0, weight_decay=1e-4)
    variables = _lars_variables()
    opt.build(variables)
    assert [opt.decays(v) for v in variables] == [True, False, False, True]
    assert [opt.adapts(v) for v in variables] == [True, False, False, True]
    assert opt.get_config()["eeta"] == 0.001


def _bce_reference(logits, targets, smoothing, threshold, weights=None):
    """timm's BinaryCrossEntropy (mean over classes) per example, times its weight."""
    mass = targets.sum(-1, keepdims=True)
    k = logits.shape[-1]
    unit = targets / np.where(mass > 0, mass, 1.0)
    unit = unit * (1 - smoothing) + smoothing / k
    if threshold:
        unit = (unit > threshold).astype(np.float64)
    p = 1 / (1 + np.exp(-logits))
    bce = -(unit * np.log(p) + (1 - unit) * np.log(1 - p)).mean(-1)
    weight = mass[:, 0] if weights is None else (targets * weights).sum(-1)
    return bce * weight


@pytest.mark.fast
@pytest.mark.parametrize("smoothing, threshold", [(0.0, 0.0), (0.1, 0.0), (0.1, 0.2)])
def test_bce_equals_timms_and_a_broken_image_adds_nothing(smoothing, threshold):
    logits = np.array([[1.0, -2.0, 0.5, 0.0], [0.3, 1.0, -1.0, 2.0], [2.0, 1.0, 0.0, -1.0]])
    # a hard label, a MixUp of two classes (0.7 / 0.3), a broken image (zero row)
    targets = np.array([[0, 1, 0, 0], [0.7, 0, 0.3, 0], [0, 0, 0, 0]], np.float64)
    loss = Loss(4, smoothing, kind="bce", bce_target_threshold=threshold)
    variable = tf.Variable(logits)
    with tf.GradientTape() as tape:
        value = loss(variable, tf.constant(targets))
    expected = _bce_reference(logits, targets, smoothing, threshold).sum() / 4
    assert float(value) == pytest.approx(expected, rel=1e-12)
    np.testing.assert_array_equal(tape.gradient(value, variable).numpy()[2], 0.0)
    weights = np.array([1.0, 2.0, 0.5, 1.0])
    weighted = Loss(4, 0.0, class_weights=weights, kind="bce")(
        tf.constant(logits), tf.constant(targets)
    )
    expected = _bce_reference(logits, targets, 0.0, 0.0, weights).sum() / 4
    assert float(weighted) == pytest.approx(expected, rel=1e-12)
    hard = Loss(4, smoothing, kind="bce", bce_target_threshold=threshold)
    labels = tf.constant([1, 3, 0])
    assert float(hard(tf.constant(logits), labels)) == pytest.approx(
        _bce_reference(logits, np.eye(4)[[1, 3, 0]], smoothing, threshold).sum() / 4, rel=1e-12
    )


@pytest.mark.fast
def test_poly_decay_and_the_batch_size_rules():
    schedule = schedules.WarmupDecay(2.0, total_steps=110, warmup_steps=10, decay="poly")
    rates = [float(schedule(s)) for s in (0, 9, 10, 35, 60, 110)]
    expected = [0.2, 2.0, 2.0, 2.0 * 0.75**2, 2.0 * 0.5**2, 0.0]
    np.testing.assert_allclose(rates, expected, rtol=1e-6, atol=1e-7)
    cubic = schedules.WarmupDecay(1.0, total_steps=100, decay="poly", power=3.0)
    assert float(cubic(50)) == pytest.approx(0.125)
    assert schedules.WarmupDecay.from_config(cubic.get_config()).power == 3.0
    assert optim.scaled_learning_rate(0.1, 1024, "linear") == pytest.approx(0.4)
    assert optim.scaled_learning_rate(0.1, 1024, "sqrt") == pytest.approx(0.2)
    assert optim.scaled_learning_rate(0.1, 1024, "none") == 0.1
    config = validate(config_from(learning_rate=11.0, lr_scaling="sqrt", base_batch_size=3200))
    assert optim.run_learning_rate(config.optim, 800) == pytest.approx(5.5)
    line = optim.describe_learning_rate(config.optim, 800)
    assert "5.5 at the global batch 800" in line and "batch of 3200, scaled sqrt" in line
    legacy = config_from(learning_rate=0.1, scale_lr_with_batch=True).optim
    assert optim.run_learning_rate(legacy, 512) == pytest.approx(0.2)
    assert optim.describe_learning_rate(config_from().optim, 512) == ""


def _apply_steps(opt, variables, values):
    """Sets the variables to each of ``values`` through a gradient step of SGD at rate 1
    (gradient = old - new), so the average sees exactly those weights."""
    for value in values:
        grads = [tf.constant(v.numpy() - value, tf.float32) for v in variables]
        opt.apply(grads, variables)


@pytest.mark.fast
@pytest.mark.parametrize("warmup", [False, True])
def test_ema_warmup_follows_model_garden_and_batchnorm_statistics_are_averaged(warmup):
    weight = keras.Variable(np.zeros(2, np.float32), name="kernel")
    stat = keras.Variable(np.zeros(2, np.float32), name="moving_mean", trainable=False)
    opt = optim.build_optimizer(
        "sgd", 1.0, momentum=0.0, ema_decay=0.9, ema_warmup=warmup, ema_extra=[stat]
    )
    opt.build([weight])
    values = [1.0, 2.0, 4.0, 8.0, 16.0]
    expected, average = [], None
    for n, value in enumerate(values, 1):
        stat.assign(np.full(2, -value, np.float32))  # as the step moves it before the update
        _apply_steps(opt, [weight], [value])
        decay = 0.0 if n == 1 else (min(0.9, (1 + n) / (10 + n)) if warmup else 0.9)
        average = value if average is None else decay * average + (1 - decay) * value
        expected.append(average)
    with compat.ema_weights(opt):
        np.testing.assert_allclose(weight.numpy(), expected[-1], rtol=1e-6)
        np.testing.assert_allclose(stat.numpy(), -expected[-1], rtol=1e-6)
    np.testing.assert_array_equal(weight.numpy(), 16.0)  # the trained values are back
    np.testing.assert_array_equal(stat.numpy(), -16.0)
    # Model Garden's decay at update 2 is 3/12 = 0.25: the average is mostly the new weights.
    assert expected[1] == pytest.approx(1.75 if warmup else 1.1)


@pytest.mark.fast
def test_the_plain_average_is_keras_own():
    """Without warm-up or extra variables the optimizer is Keras' own, as in older runs:
    their checkpoints and averages are unchanged."""
    opt = optim.build_optimizer("sgd", 0.1, ema_decay=0.9)
    assert type(opt) is keras.optimizers.SGD


@pytest.mark.fast
@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(scale_lr_with_batch=True, lr_scaling="linear"), "not both"),
        (dict(base_batch_size=0), "--base_batch_size=0 must be positive"),
        (dict(lars_eeta=0.01), "--lars_eeta is for --optimizer=lars"),
        (dict(optimizer="lars", lars_exclude_from_decay="bias,("), "no regular expression"),
        (dict(bce_target_threshold=0.2), "--bce_target_threshold is for --loss=bce"),
        (dict(loss="bce", bce_target_threshold=1.0), "must be in [0, 1)"),
        (dict(ema_warmup=True), "--ema_warmup is for the weights' average: set --ema_decay"),
        (dict(ema_batchnorm=True), "--ema_batchnorm is for"),
        (dict(lr_schedule="polynomial"), "--lr_schedule='polynomial' is unknown"),
    ],
)
def test_bad_large_batch_settings_are_one_line(settings, message):
    with pytest.raises(ConfigError, match=None) as err:
        validate(config_from(**settings))
    assert message in str(err.value) and "\n" not in str(err.value)
