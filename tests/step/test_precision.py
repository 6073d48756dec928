"""Mixed precision and XLA on CPU: bfloat16 and float16 policies keep float32 logits, float16
dynamic loss scaling skips an overflowing update and lowers the scale, and an XLA-compiled
train step gives the same loss and update as the plain one."""

import keras
import numpy as np
import pytest
from weights import assert_same_weights, changed
from weights import named as named_weights
import tensorflow as tf

from tfgpu import compat, models
from tfgpu.train import build
from tfgpu.config import config_from
from tfgpu.data import host_ops, run_input
from tfgpu.distribute import backends
from tfgpu.models import resnet
from tfgpu.step.train_step import DynamicLossScale, TrainStep


@pytest.fixture
def policy():
    """Sets a global mixed-precision policy for one test and restores float32 after it."""
    yield keras.mixed_precision.set_global_policy
    keras.mixed_precision.set_global_policy("float32")


def _batch(n=8, size=32, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "image": tf.constant(rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)),
        "label": tf.constant(rng.integers(0, 4, n), tf.int32),
        "flip": tf.zeros([n], tf.bool),
        "weight": tf.ones([n]),
    }


def _backend():
    return backends.build_backend("default")


def _step(model, loss_scale=None, lr=0.05):
    backend = _backend()
    optimizer = keras.optimizers.SGD(lr, momentum=0.9)
    return TrainStep(model, optimizer, backend, global_batch_size=8, loss_scale=loss_scale)


def _weights(model) -> dict:
    """A copy of the trainable weights, named (position and name)."""
    return {name: w.copy() for name, w in named_weights(model.trainable_weights).items()}


@pytest.mark.parametrize("dtype", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.fast
def test_mixed_policies_compute_in_half_and_give_float32_logits(policy, dtype):
    """On resnet18's code in two stages of one block at 16x16 (as the bfloat16 step below):
    the policy is the layers', not the model's size."""
    policy(dtype)
    model = resnet.build(4, 16, small_input=True, depths=(1, 1))
    assert model.get_layer("stage1_block1_conv1").compute_dtype == dtype.split("_")[1]
    assert model.get_layer("stage1_block1_conv1").kernel.dtype == "float32"  # master weights
    assert model(np.zeros((2, 16, 16, 3), np.float32)).dtype == "float32"


@pytest.mark.slow  # a train step of BatchNorm convolutions in bfloat16: seconds on a CPU
def test_bfloat16_train_step_runs_and_updates_weights(policy):
    """On resnet18's blocks cut to two stages of one at 16x16 (resnet18 at 32x32: 41 s on 2
    shared cores; bfloat16 matmuls are slow on a CPU): BatchNorm, residual additions and a
    projection shortcut in bfloat16, float32 master weights."""
    policy("mixed_bfloat16")
    model = resnet.build(4, 16, small_input=True, depths=(1, 1))
    step = _step(model)
    before = _weights(model)
    metrics, finite = tf.function(step.update)(_batch(size=16))
    assert np.isfinite(float(metrics["loss"])) and bool(finite)
    assert changed(_weights(model), before)


@pytest.mark.fast
def test_float16_overflow_is_skipped_the_scale_halved_and_later_steps_apply_and_double_it(
    policy,
):
    """One traced float16 step (period 2): an overflowing update is skipped and halves the
    scale; the finite updates after it apply, and the period's second doubles the scale."""
    policy("mixed_float16")
    model = models.build_model("tiny_cnn", 4, 32)
    loss_scale = DynamicLossScale(initial=2.0**15, period=2)
    step = _step(model, loss_scale)
    update = tf.function(step.update)
    # Injected overflow: 1e30 fits float32 (the scaled loss) but not float16 (max 65504), so
    # the float16 activations' gradients become inf, as with a too-high scale on a GPU.
    loss_scale.scale.assign(1e30)
    before = _weights(model)
    _, finite = update(_batch())
    assert not bool(finite)
    assert changed(_weights(model), before) == []  # skipped
    assert float(loss_scale.scale) == pytest.approx(5e29) and int(loss_scale.good_steps) == 0
    loss_scale.scale.assign(2.0**10)
    metrics, finite = update(_batch())
    assert bool(finite) and np.isfinite(float(metrics["loss"]))
    assert changed(_weights(model), before)  # applied
    assert float(loss_scale.scale) == 2.0**10 and int(loss_scale.good_steps) == 1
    update(_batch())  # the period's second finite step
    assert float(loss_scale.scale) == 2.0**11 and int(loss_scale.good_steps) == 0


def _small_bn_net():
    """Convolutions + BatchNorm + a residual add: the ops of a ResNet, at a size whose XLA
    compilation takes seconds, not the ~45 s of resnet18's on 2 cores."""
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(keras.layers.Conv2D(16, 3)(x)))
    y = keras.layers.BatchNormalization()(keras.layers.Conv2D(16, 3, padding="same")(x))
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(keras.layers.Add()([x, y])))
    return keras.Model(inputs, keras.layers.Dense(4, dtype="float32")(x))


def _twin_models(name):
    keras.utils.set_random_seed(3)
    build = _small_bn_net if name == "small_bn_net" else lambda: models.build_model(name, 4, 32)
    a, b = build(), build()
    b.set_weights(a.get_weights())
    return a, b


# small_bn_net by default (BatchNorm, a residual add, SGD with momentum under XLA); tiny_cnn's
# XLA update equal to the plain one is the un-resized crops test's below (default tier).
@pytest.mark.parametrize(
    "name", [pytest.param("tiny_cnn", marks=pytest.mark.heavy), "small_bn_net"]
)
@pytest.mark.slow  # 8-16 s a case: XLA compilation (2 shared cores)
def test_xla_train_step_matches_the_plain_one(name):
    # Op determinism is process-wide and an earlier test may have left it on; XLA refuses it.
    compat.set_op_determinism(False)
    plain_model, xla_model = _twin_models(name)
    plain = _step(plain_model)
    xla = TrainStep(
        xla_model,
        keras.optimizers.SGD(0.05, momentum=0.9),
        _backend(),
        global_batch_size=8,
        jit_compile=True,
    )
    batch = _batch(seed=1)
    m_plain, _ = tf.function(plain.update)(batch)
    m_xla, _ = tf.function(xla.update)(batch)
    np.testing.assert_allclose(float(m_xla["loss"]), float(m_plain["loss"]), rtol=1e-4)
    assert_same_weights(_weights(xla_model), _weights(plain_model), rtol=1e-3, atol=1e-5)


@pytest.mark.slow  # 21 s: XLA compilation (2 shared cores)
def test_xla_step_takes_un_resized_crops_and_matches_the_plain_one():
    """--resize_on=device with --jit_compile: the variable-length crops are resized before
    XLA, which sees fixed shapes; the update equals the plain step's."""
    compat.set_op_determinism(False)
    plain_model, xla_model = _twin_models("tiny_cnn")
    settings = dict(image_size=32, resize_on="device", global_batch_size=8, weight_decay=0.0)

    def step(model, jit_compile):
        config = config_from(**settings, jit_compile=jit_compile)
        return build.build_step(
            model,
            keras.optimizers.SGD(0.05),
            _backend(),
            config.model,
            config.optim,
            config.train,
            step_fns=run_input.step_fns(config.data, 4),
        )

    plain, xla = step(plain_model, False), step(xla_model, True)
    rng = np.random.default_rng(4)
    update = tf.function(xla.update)
    for shapes in ([(40, 30), (20, 50)] * 4, [(33, 33), (64, 16)] * 4):  # two lengths
        crops = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]
        batch = dict(_batch(seed=2), sizes=tf.constant(shapes, tf.int32))
        batch["pixels"] = tf.concat([host_ops.pack_pixels(tf.constant(c)) for c in crops], 0)
        del batch["image"]
        (m_plain, _), (m_xla, _) = tf.function(plain.update)(batch), update(batch)
        np.testing.assert_allclose(float(m_xla["loss"]), float(m_plain["loss"]), rtol=1e-4)
    assert_same_weights(_weights(xla_model), _weights(plain_model), rtol=1e-3, atol=1e-5)


def _resize_on(resize_on, has_gpu, preprocess_on="device", **settings):
    config = config_from(resize_on=resize_on, preprocess_on=preprocess_on, **settings)
    return config.resolved(has_gpu).data.resize_on


@pytest.mark.fast
def test_resize_on_auto_is_device_only_with_a_gpu():
    assert _resize_on("auto", has_gpu=True) == "device"
    assert _resize_on("auto", has_gpu=False) == "host"
    assert _resize_on("device", has_gpu=False) == "device"
    assert _resize_on("host", has_gpu=True) == "host"
    # With the float work in tf.data the resize would run there too, on the CPU.
    assert _resize_on("auto", has_gpu=True, preprocess_on="host") == "host"
    # Synthetic batches are made at --image_size: a step expecting crops would find none
    # (--synthetic_data on a GPU machine stopped with KeyError: 'pixels').
    assert _resize_on("auto", has_gpu=True, synthetic_data=True) == "host"
    assert _resize_on("device", has_gpu=True, synthetic_data=True) == "host"
