"""Lookahead (optim/lookahead.py, --lookahead_steps) and BatchNorm's own learning rate
(--batchnorm_lr_multiplier, finetune.lr_groups): the arithmetic against numpy, the slow
weights in the optimizer's checkpoint, and the groups' start-up lines."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.config import ConfigError, config_from, validate
from tfgpu.optim import finetune, lookahead

pytestmark = pytest.mark.fast


def _sgd_with_lookahead(every, decay, total, extra=()):
    optimizer = keras.optimizers.SGD(0.1)
    return lookahead.with_lookahead(
        optimizer, every=every, decay=decay, total_steps=total, extra=extra
    )


def _numpy_lookahead(w0, grads, every, decay, total, lr=0.1):
    """The module docstring's arithmetic, by hand: plain SGD with lookahead."""
    fast, slow = np.array(w0, np.float64), np.array(w0, np.float64)
    for t, g in enumerate(grads, 1):
        fast = fast - lr * g
        if t % every == 0 or t >= total:
            d = decay**every * min(t / total, 1.0) ** 3
            slow = d * slow + (1 - d) * fast
            fast = slow.copy()
    return fast, slow


def test_lookahead_steps_as_the_docstring_says():
    w = keras.Variable(np.array([1.0, -2.0, 3.0], np.float32))
    stat = keras.Variable(np.zeros(3, np.float32), trainable=False)  # a moving statistic
    optimizer = _sgd_with_lookahead(3, 0.9, 7, extra=[stat])
    optimizer.build([w])
    grads = np.random.default_rng(0).normal(size=(7, 3))
    step = tf.function(lambda g: optimizer.apply([g], [w]))
    stat_values = []
    for t, g in enumerate(grads, 1):
        stat.assign(np.full(3, float(t), np.float32))  # moved by "the forward pass"
        step(tf.constant(g, tf.float32))
        stat_values.append(stat.numpy().copy())
    fast, slow = _numpy_lookahead([1.0, -2.0, 3.0], grads, 3, 0.9, 7)
    np.testing.assert_allclose(w.numpy(), fast, rtol=1e-5)
    assert len(optimizer._tfgpu_lookahead["slow"]) == 2
    np.testing.assert_allclose(optimizer._tfgpu_lookahead["slow"][0].numpy(), slow, rtol=1e-5)
    # The statistic goes the same way: pulled toward its value at each sync (t = 3, 6, 7).
    assert stat_values[0][0] == 1.0 and stat_values[2][0] < 3.0  # synced at t = 3
    assert stat_values[-1][0] == pytest.approx(optimizer._tfgpu_lookahead["slow"][1].numpy()[0])


def test_the_slow_weights_are_checkpointed_and_a_restored_optimizer_goes_on_exactly(tmp_path):
    grads = np.random.default_rng(1).normal(size=(6, 2)).astype(np.float32)

    def fresh():
        w = keras.Variable(np.array([0.5, 1.5], np.float32))
        optimizer = _sgd_with_lookahead(2, 0.8, 6)
        optimizer.build([w])
        return w, optimizer, tf.function(lambda g: optimizer.apply([g], [w]))

    w, optimizer, step = fresh()
    for g in grads:
        step(tf.constant(g))
    whole = w.numpy()
    w, optimizer, step = fresh()
    for g in grads[:3]:  # stopped between two syncs
        step(tf.constant(g))
    path = tf.train.Checkpoint(w=w, optimizer=optimizer).write(str(tmp_path / "ckpt"))
    w, optimizer, step = fresh()
    tf.train.Checkpoint(w=w, optimizer=optimizer).read(path).assert_consumed()
    for g in grads[3:]:
        step(tf.constant(g))
    np.testing.assert_array_equal(w.numpy(), whole)


def _bn_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.BatchNormalization(scale=False, name="bn_offset_only")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="logits")(x))


def _run_optimizer(config, model, total_steps: int):
    """The run's optimizer as the conductor makes it: the optimizer's and model's sections."""
    batch = config.train.global_batch_size
    return finetune.run_optimizer(config.optim, config.model, model, batch, total_steps)


def test_batchnorm_offsets_and_scales_train_at_their_multiple():
    model = _bn_model()
    config = validate(
        config_from(optimizer="sgd", momentum=0.0, weight_decay=0.0, batchnorm_lr_multiplier=8.0)
    )
    groups = finetune.lr_groups(config.optim, config.model, model)
    assert [(label, m) for label, m, _ in groups] == [("weights", 1.0), ("weights/batchnorm", 8.0)]
    assert sorted(v.path for v in groups[1][2]) == ["bn/beta", "bn/gamma", "bn_offset_only/beta"]
    optimizer = _run_optimizer(config, model, 10)
    assert (
        finetune.describe(optimizer, config.optim, config.model, 10)
        == "learning rate weights x1, weights/batchnorm x8"
    )
    optimizer.build(model.trainable_variables)
    before = [v.numpy().copy() for v in model.trainable_variables]
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    optimizer.apply(grads, model.trainable_variables)
    bn = {v.path for v in groups[1][2]}
    for var, old in zip(model.trainable_variables, before):
        rate = 0.1 * (8.0 if var.path in bn else 1.0)
        np.testing.assert_allclose(old - var.numpy(), rate, rtol=1e-5, err_msg=var.path)


def test_without_the_flags_one_optimizer_and_no_line():
    config = validate(config_from(optimizer="sgd"))
    assert finetune.lr_groups(config.optim, config.model, _bn_model()) is None
    optimizer = _run_optimizer(config, _bn_model(), 10)
    assert finetune.describe(optimizer, config.optim, config.model, 10) == ""
    ahead = validate(config_from(lookahead_steps=5))
    made = _run_optimizer(ahead, _bn_model(), 10)
    line = finetune.describe(made, ahead.optim, ahead.model, 10)
    assert line.startswith("lookahead: every 5 updates the slow weights move")


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(lookahead_steps=-1), "--lookahead_steps=-1 must not be negative"),
        (dict(lookahead_steps=5, lookahead_decay=1.0), "--lookahead_decay=1.0 must be in"),
        (dict(batchnorm_lr_multiplier=0.0), "--batchnorm_lr_multiplier=0.0 must be positive"),
    ],
)
def test_bad_settings_are_one_line(settings, message):
    with pytest.raises(ConfigError, match=message):
        validate(config_from(**settings))
