"""The train step: k micro-batches of b = one batch of k*b, on one replica and on two; one
all-reduce per update; no retracing; weight decay skips BatchNorm and bias."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from weights import assert_same_weights, combined
from weights import named as named_weights

from tfgpu import models, optim
from tfgpu.models import resnet
from tfgpu.optim import schedules
from tfgpu.distribute import backends
from tfgpu.step.train_step import TrainStep

GLOBAL_BATCH, UPDATES = 16, 3


def _batches():
    rng = np.random.default_rng(0)
    n = GLOBAL_BATCH * UPDATES
    return {
        "image": rng.integers(0, 256, (n, 16, 16, 3)).astype(np.uint8),
        "label": (np.arange(n) % 5).astype(np.int32),
        "flip": rng.random(n) < 0.5,
        "weight": np.ones(n, np.float32),
    }


def _train(strategy: str, optimizer: str, accum: int, weight_decay: float, lr=0.01, **loss):
    """Trains tiny_cnn for UPDATES updates (``loss``: TrainStep's loss arguments); returns
    (named weights, step, traced update fn)."""
    backend = backends.build_backend(strategy)
    keras.utils.set_random_seed(7)
    with backend.scope():
        model = models.build_model("tiny_cnn", num_classes=5, image_size=16)
        opt = optim.build_optimizer(optimizer, lr, momentum=0.9, weight_decay=weight_decay)
        step = TrainStep(
            model, opt, backend, global_batch_size=GLOBAL_BATCH, grad_accum_steps=accum, **loss
        )
    per_replica = GLOBAL_BATCH // backend.num_replicas
    data = backend.distribute_dataset(
        lambda shard: tf.data.Dataset.from_tensor_slices(_batches()).batch(per_replica)
    )
    update = tf.function(step.update)
    iterator = iter(data)
    for _ in range(UPDATES):
        update(next(iterator))
    return named_weights(model), backend, update


# Every optimizer and both strategies once by default; the rest of the matrix is heavy.
OPTIMIZERS = [("sgd", 0.0), ("sgd", 1e-3), ("nesterov", 0.0), ("adamw", 1e-2)]
KEPT = {("default", "sgd", 1e-3), ("mirrored", "nesterov", 0.0), ("mirrored", "adamw", 1e-2)}
ACCUMULATION_CASES = [
    pytest.param(*case, marks=() if case in KEPT else pytest.mark.heavy)
    for case in ((s, o, wd) for s in ("default", "mirrored") for o, wd in OPTIMIZERS)
]


@pytest.mark.parametrize("strategy,optimizer,weight_decay", ACCUMULATION_CASES)
@pytest.mark.slow  # 6-28 s a case: train steps (2 shared cores)
def test_accumulated_gradients_equal_the_large_batch(strategy, optimizer, weight_decay):
    big, _, _ = _train(strategy, optimizer, 1, weight_decay)
    small, backend, update = _train(strategy, optimizer, 4, weight_decay)
    assert_same_weights(small, big, atol=1e-5)
    assert int(backend.all_reduce_calls.numpy()) == UPDATES
    assert update.experimental_get_tracing_count() == 1


@pytest.mark.slow  # 15 s: train steps on 2 replicas (2 shared cores)
def test_two_replicas_equal_one():
    one, _, _ = _train("default", "adam", 2, 0.0)
    two, backend, _ = _train("mirrored", "adam", 2, 0.0)
    assert backend.num_replicas == 2
    # Adam divides by sqrt(v) + 1e-7: a gradient that is pure rounding noise (|g| ~ 1e-9,
    # summed in another order by 2 replicas) moves its weight by up to lr * |g| / (|g| + 1e-7),
    # so rounding shows up magnified. Seen on an AVX-512 CPU: 1.02e-5 on 1 weight of 9,216.
    assert_same_weights(two, one, atol=3e-5)


@pytest.mark.slow  # 2 short trainings of tiny_cnn
def test_lars_with_bce_on_two_replicas_in_micro_batches_equals_one_device():
    """LARS' per-layer norms are of the all-reduced gradient of the global batch, and BCE is a
    sum over examples: 2 replicas of 2 micro-batches each update as one device of 16. The
    learning rate makes LARS' steps 0.5% of each layer's norm (eeta 0.001 x lr 5)."""
    settings = dict(lr=5.0, loss="bce", label_smoothing=0.1, bce_target_threshold=0.2)
    keras.utils.set_random_seed(7)
    start = named_weights(models.build_model("tiny_cnn", num_classes=5, image_size=16))
    one, _, _ = _train("default", "lars", 1, 1e-4, **settings)
    two, backend, _ = _train("mirrored", "lars", 2, 1e-4, **settings)
    assert backend.num_replicas == 2
    assert max(float(np.abs(d).max()) for d in combined(np.subtract, one, start).values()) > 1e-3
    assert_same_weights(two, one, atol=1e-5)


@pytest.mark.fast
def test_weight_decay_skips_batchnorm_and_bias():
    # resnet6 (resnet18's code in two stages of one block, as tests/step/test_batchnorm.py's):
    # the same kinds of variables (conv kernels, BatchNorm's gamma and beta, the head's kernel
    # and bias), a tenth of resnet18's values to draw.
    model = resnet.build(3, 16, small_input=True, depths=(1, 1))
    opt = optim.build_optimizer("sgd", 0.1, weight_decay=1e-4)
    opt.build(model.trainable_variables)
    decayed = {v.path for v in model.trainable_variables if opt._use_weight_decay(v)}
    assert any(p.endswith("kernel") for p in decayed)
    assert not any(p.endswith(("bias", "gamma", "beta")) for p in decayed)


@pytest.mark.fast
def test_schedule_warms_up_then_decays_to_zero():
    schedule = schedules.WarmupDecay(0.4, total_steps=100, warmup_steps=10, decay="cosine")
    rates = [float(schedule(s)) for s in (0, 9, 10, 55, 100)]
    assert rates[0] == pytest.approx(0.04) and rates[1] == pytest.approx(0.4)
    assert rates[2] == pytest.approx(0.4) and rates[3] == pytest.approx(0.2, abs=1e-6)
    assert rates[4] == pytest.approx(0.0, abs=1e-7)
    step = schedules.WarmupDecay(1.0, total_steps=100, decay="step")
    assert [round(float(step(s)), 6) for s in (0, 30, 60, 95)] == [1.0, 0.1, 0.01, 0.001]
    assert optim.scaled_learning_rate(0.1, 1024, "linear") == pytest.approx(0.4)


def _loss_and_logit_grads(step, logits, targets):
    logits = tf.Variable(logits)
    with tf.GradientTape() as tape:
        loss = step.loss(logits, tf.constant(targets))
    return loss.numpy(), tape.gradient(loss, logits).numpy()


@pytest.mark.fast
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_a_broken_example_adds_no_loss_and_no_gradient(smoothing):
    """An all-zero target row (a broken image) adds nothing, also under label smoothing: the
    fused cross-entropy's gradient (softmax - target) assumes rows of mass 1."""
    backend = backends.build_backend("default")
    with backend.scope():
        model = models.build_model("tiny_cnn", num_classes=3, image_size=16)
        opt = optim.build_optimizer("sgd", 0.01)
        step = TrainStep(model, opt, backend, global_batch_size=2, label_smoothing=smoothing)
    logits = np.array([[1.0, 2.0, 0.5], [0.3, -1.0, 2.0]], np.float32)
    good = np.array([[0.0, 1.0, 0.0]], np.float32)
    loss, grads = _loss_and_logit_grads(step, logits, np.concatenate([good, np.zeros((1, 3))]))
    alone, alone_grads = _loss_and_logit_grads(step, logits[:1], good)
    assert loss == pytest.approx(alone, rel=1e-6)
    np.testing.assert_array_equal(grads[1], 0.0)
    np.testing.assert_allclose(grads[:1], alone_grads, rtol=1e-6)
