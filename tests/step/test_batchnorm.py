"""BatchNorm under every way of spreading training (the contract in tfgpu/batchnorm.py), on the
models users train: resnet18, resnet20, wrn16_4, densenet121 and efficientnet_b0 at small inputs
(opt-in, heavy), and by default on resnet6, the resnet family cut to two stages of one block.

- without --sync_batchnorm: every replica ends with the same moving statistics, their mean over
  the replicas; k micro-batches on one device equal k replicas;
- with --sync_batchnorm: N replicas of b equal one device of N*b;
- the layers' own losses (regularizers) count once per update, whatever the split.
"""

import contextlib
import functools
import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from fewer_blocks import fewer_blocks
from weights import largest, same_structure

from tfgpu import compat, models, optim
from tfgpu.models import remat as remat_
from tfgpu.models import resnet
from tfgpu.models.layers import batchnorm_statistics
from tfgpu.step import batchnorm
from tfgpu.distribute import backends
from tfgpu.step.train_step import TrainStep

GLOBAL_BATCH, UPDATES = 8, 2
# keras.applications needs 32x32 at least; resnet18 (and the regularized net) at 16x16, stage 4
# at 2x2: the same BatchNorm layers and collectives, a quarter of the convolutions' work.
SIZES = {"efficientnet_b0": 32, "densenet121": 32}


def _size(name: str) -> int:
    return SIZES.get(name, 16)


# densenet121 is compared in float64. In float32 its gradient at initialization on these
# images is ill-conditioned: float32 rounding alone, on one device, moves the stem kernel's
# gradient by 0.9% of the largest gradient from the float64 one (measured), more than 2
# replicas then differ from 1 device (0.7%); in float64 they agree to 1e-14 (a bound no
# wrong synchronization meets). It also traces for ~2 minutes on 2 cores (121 BatchNorm
# layers): heavy (opt-in, tests/conftest.py). efficientnet_b0 is heavy too (60 CPU-s, two
# traces of 37,000 and 12,000 ops), and so are the small-image families (resnet20's option-A
# shortcuts, wrn16_4's pre-activation blocks; ~13 s each in the suite): the synchronization is
# the same code for every family, which resnet6 shows in every run; what differs by family,
# that every BatchNorm layer takes the synchronized moments, is shown for all five by the
# structural test below. resnet6: resnet18's code with its BatchNorm in every place it has one
# (the stem, an identity block, a strided block with a projection shortcut), 6 layers of its
# 20. The three tests that trained resnet18 took 45 CPU-s, 14 with resnet6 (measured).
MODELS = [
    ("resnet6", "float32", 1e-5),
    pytest.param("resnet18", "float32", 1e-5, marks=pytest.mark.heavy),
    # The small-image families at 16x16.
    pytest.param("resnet20", "float32", 1e-5, marks=pytest.mark.heavy),
    pytest.param("wrn16_4", "float32", 1e-5, marks=pytest.mark.heavy),
    pytest.param("efficientnet_b0", "float32", 1e-5, marks=pytest.mark.heavy),
    pytest.param("densenet121", "float64", 1e-9, marks=pytest.mark.heavy),
]
# Without sync the code path is the same for every family (the moving statistics of every
# BatchNorm layer, whatever the network): resnet6 keeps the suite's time. The large-batch
# recipe runs the same path with more on it (LARS, BCE, the EMA of the moving statistics):
# it runs by default, plain sgd is heavy.
UNSYNCED_CASES = [
    pytest.param("resnet18", "sgd", marks=pytest.mark.heavy),
    pytest.param("resnet18", "large_batch", marks=pytest.mark.heavy),
    ("resnet6", "large_batch"),
]


def _batches(size: int, n=GLOBAL_BATCH * UPDATES, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (n, size, size, 3)).astype(np.uint8),
        "label": (np.arange(n) % 4).astype(np.int32),
        "flip": np.zeros(n, bool),
        "weight": np.ones(n, np.float32),
    }


def _build(name):
    if name in ("regularized", "unregularized"):
        return _regularized_net(name == "regularized")
    if name == "stem":
        return _stem_net()
    if name == "resnet6":
        return resnet.build(4, _size(name), small_input=True, depths=(1, 1))
    # Stochastic depth off: its masks are drawn per replica (docs/training-loop.md).
    return models.build_model(name, 4, _size(name), small_input=True, drop_path_rate=0.0)


def _family(name: str) -> str:
    """The network family of a registry model or of resnet6 (what --remat cuts into blocks)."""
    return "resnet" if name == "resnet6" else models.MODELS[name][0]


def _stem_net():
    """resnet6's stem alone (stem_conv, stem_bn, ReLU), pooled, a Dense classifier: one
    BatchNorm layer whose moving mean the mirrored update moves."""
    inputs = keras.Input((_size("stem"), _size("stem"), 3))
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="stem_conv")(x)
    x = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name="stem_bn")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(4, dtype="float32")(x))


def _regularized_net(regularized=True):
    """Conv with a kernel and an activity regularizer: model.losses is not empty. No
    BatchNorm: how a batch is split must change nothing but the regularizers' scaling."""
    size = _size("regularized")
    inputs = keras.Input((size, size, 3))
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Conv2D(
        8,
        3,
        kernel_regularizer=keras.regularizers.L2(1e-1) if regularized else None,
        activity_regularizer=keras.regularizers.L2(1e-2) if regularized else None,
    )(x)
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(x))
    return keras.Model(inputs, keras.layers.Dense(4, dtype="float32")(x))


@contextlib.contextmanager
def _floatx(dtype: str):
    """Keras builds layers in ``dtype`` inside (float64: exactness checks), float32 after."""
    keras.config.set_floatx(dtype)
    keras.config.set_dtype_policy(dtype)
    try:
        yield
    finally:
        keras.config.set_floatx("float32")
        keras.config.set_dtype_policy("float32")


def _large_batch(model) -> tuple:
    """(optimizer, loss arguments) of a large-batch recipe: LARS at a rate that moves each
    layer by 0.5% of its norm per update, an EMA warmed up that averages BatchNorm's moving
    statistics too, BCE with smoothing and a target threshold."""
    opt = optim.build_optimizer(
        "lars",
        5.0,
        momentum=0.9,
        weight_decay=1e-4,
        ema_decay=0.9,
        ema_warmup=True,
        ema_extra=batchnorm_statistics(model),
    )
    return opt, dict(loss="bce", label_smoothing=0.1, bce_target_threshold=0.2)


def _train(
    name,
    strategy="default",
    accum=1,
    sync=False,
    updates=UPDATES,
    dtype="float32",
    kept=None,
    remat=False,
):
    """Trains registry model ``name`` for ``updates`` sgd updates of GLOBAL_BATCH with its
    layers in ``dtype`` (``remat``: the step runs it as --remat does); returns (model,
    backend). With a dict ``kept``: the ``_large_batch`` recipe instead of sgd, its optimizer
    kept there."""
    backend = backends.build_backend(strategy)
    keras.utils.set_random_seed(5)
    with backend.scope(), _floatx(dtype):
        model = _build(name)
        opt, loss = optim.build_optimizer("sgd", 0.01, momentum=0.9, weight_decay=0.0), {}
        if kept is not None:
            opt, loss = _large_batch(model)
            kept["optimizer"] = opt
        step = TrainStep(
            remat_.rematerialized(model, _family(name)) if remat else model,
            opt,
            backend,
            global_batch_size=GLOBAL_BATCH,
            grad_accum_steps=accum,
            sync_batchnorm=sync,
            **loss,
        )
    per_replica = GLOBAL_BATCH // backend.num_replicas
    data = backend.distribute_dataset(
        lambda shard: tf.data.Dataset.from_tensor_slices(_batches(_size(name))).batch(per_replica)
    )
    update, iterator = tf.function(step.update), iter(data)
    for _ in range(updates):
        update(next(iterator))
    return model, backend


def _components(variable) -> list[np.ndarray]:
    """Every replica's copy of ``variable`` (one when it is not mirrored)."""
    value = variable.value
    copies = getattr(value, "values", None) or (value,)
    return [np.asarray(c.numpy()) for c in copies]


def _replicas(model: keras.Model, replicas: int = 1) -> dict:
    """Every replica's copy of every weight of ``model``, named (position, name, replica); a
    weight held once (one device) stands for each of ``replicas`` replicas, so that a mirrored
    model's copies are each compared with it."""
    named = {}
    for i, v in enumerate(model.weights):
        copies = _components(v)
        for r in range(max(replicas, len(copies))):
            named[f"{i}:{v.name}@{r}"] = copies[r if len(copies) > 1 else 0]
    return named


def _assert_same_weights(a: keras.Model, b: keras.Model, atol=1e-5):
    """Equal to ``atol`` of the largest weight, every replica's copy of every weight (the
    same names, replicas and shapes first); a float32 weight of a float64 model (the logits
    layer) to 10 of its own ulps."""
    replicas = max(len(_components(v)) for v in a.weights)
    mine, theirs = same_structure(_replicas(a), _replicas(b, replicas))
    scale = largest(a.get_weights())
    for name, x in mine.items():
        ulp = np.finfo(x.dtype).eps if np.issubdtype(x.dtype, np.floating) else 0.0
        tol = max(atol, 10 * float(ulp)) * scale
        np.testing.assert_allclose(x, theirs[name], atol=tol, rtol=0, err_msg=name)


@pytest.mark.timeout(900)  # efficientnet_b0: ~2.5 min on 2 idle cores (two traces)
@pytest.mark.parametrize("name,dtype,atol", MODELS)
def test_sync_batchnorm_two_replicas_equal_one_device_of_the_whole_batch(name, dtype, atol):
    model, backend = _train(name, "mirrored", sync=True, dtype=dtype)
    assert backend.num_replicas == 2
    assert model.weights[0].dtype == dtype
    _assert_same_weights(model, _train(name, dtype=dtype)[0], atol=atol)


@pytest.mark.parametrize(
    "name", ["resnet18", "resnet20", "wrn16_4", "efficientnet_b0", "densenet121"]
)
def test_every_batchnorm_layer_of_every_family_takes_the_synchronized_moments(name):
    """``synchronize`` reaches every BatchNormalization layer the model's config holds, and a
    training forward pass takes every layer's moments through the collective: two sums per
    layer (the equivalence above shows those sums make N replicas of b one device of N*b).
    efficientnet_b0 and densenet121 in fewer blocks (tests/fewer_blocks.py: each kind of
    block and transition of the family, inside its nested backbone, as the whole models)."""
    with fewer_blocks():
        model = _build(name)
    sums = []
    synced = batchnorm.synchronize(model, lambda t: sums.append(t) or t)
    in_config = json.dumps(model.get_config()).count('"class_name": "BatchNormalization"')
    assert synced == in_config > 0
    forward = tf.function(lambda x: model(x, training=True))
    size = _size(name)
    forward.get_concrete_function(tf.TensorSpec((2, size, size, 3), tf.float32))
    assert len(sums) == 2 * synced


@pytest.mark.parametrize("name,recipe", UNSYNCED_CASES)
def test_without_sync_replicas_hold_the_mean_and_equal_accumulation(name, recipe):
    """2 replicas of 4 and 2 micro-batches of 4 on one device: each micro-batch normalizes by
    itself, the moving statistics move once per update by the mean; every replica holds it.
    With the large-batch recipe (``_large_batch``: LARS, BCE, an EMA of the weights and of the
    moving statistics) the averages are the same too, on every replica. The replicas run with
    --remat (blocks recomputed in the backward pass): the same again."""
    kept = ({}, {}) if recipe == "large_batch" else (None, None)
    mirrored, _ = _train(name, "mirrored", kept=kept[0], remat=True)
    accumulated, _ = _train(name, "default", accum=2, kept=kept[1])
    stats = batchnorm.moving_statistics(mirrored)
    for var in stats:
        first, second = _components(var)
        np.testing.assert_array_equal(first, second, err_msg=var.path)
    _assert_same_weights(mirrored, accumulated)
    if recipe != "large_batch":
        return
    trained = [_components(v)[0] for v in stats]
    with compat.ema_weights(kept[0]["optimizer"]), compat.ema_weights(kept[1]["optimizer"]):
        _assert_same_weights(mirrored, accumulated)
        for var in stats:
            first, second = _components(var)
            np.testing.assert_array_equal(first, second, err_msg=var.path)
        # The averaged statistics are in place, not the trained ones.
        moved = [np.abs(_components(v)[0] - t).max() for v, t in zip(stats, trained, strict=True)]
        assert max(moved) > 1e-4


def test_moving_statistics_are_the_mean_of_the_replicas_batch_statistics():
    """One update from the initial statistics (mean 0, variance 1, momentum 0.9): the first
    BatchNorm's moving mean is 0.1 x the mean of the two half-batches' means, computed here
    from the stem convolution's outputs. On resnet6's stem alone (``_stem_net``): the value
    is the one layer's; the equivalences above hold every layer of resnet6 to one device."""
    model, _ = _train("stem", "mirrored", updates=1)
    keras.utils.set_random_seed(5)
    fresh = _build("stem")  # same seed: the weights before the update
    stem = keras.Model(fresh.input, fresh.get_layer("stem_conv").output)
    images = _batches(_size("stem"))["image"][:GLOBAL_BATCH].astype(np.float32)
    halves = [stem(images[:4]).numpy().mean((0, 1, 2)), stem(images[4:]).numpy().mean((0, 1, 2))]
    expected = 0.1 * (halves[0] + halves[1]) / 2
    for copy in _components(model.get_layer("stem_bn").moving_mean):
        np.testing.assert_allclose(copy, expected, atol=1e-5, rtol=1e-4)
    wrong = 0.1 * halves[0]  # what replica 0 alone would hold
    assert np.abs(expected - wrong).max() > 1e-3


@functools.cache
def _regularized_reference() -> keras.Model:
    """The regularized net trained on one device in whole batches (read, never trained on):
    the reference of the two tests below, trained once for both."""
    return _train("regularized")[0]


@pytest.mark.parametrize("strategy,accum", [("default", 2), ("mirrored", 2)])
def test_regularization_losses_count_once_per_update(strategy, accum):
    reference = _regularized_reference()
    assert reference.losses, "the test model must have regularization losses"
    split, _ = _train("regularized", strategy, accum=accum)
    _assert_same_weights(split, reference)


def test_regularization_losses_change_the_update():
    """The regularizers are not ignored: without them the same start ends elsewhere."""
    regularized = _regularized_reference()
    unregularized, _ = _train("unregularized")
    kernels = [m.layers[2].kernel.numpy() for m in (regularized, unregularized)]
    assert regularized.layers[2].name.startswith("conv2d")
    assert np.abs(kernels[0] - kernels[1]).max() > 1e-4


@pytest.mark.fast
def test_the_batchnorm_hook_is_still_where_compat_expects_it():
    layer = keras.layers.BatchNormalization()
    layer.build((None, 4, 4, 3))
    compat.set_batchnorm_moments(layer, lambda x, axes: (tf.zeros(3), tf.ones(3) * 4.0))
    out = layer(tf.ones((2, 4, 4, 3)), training=True)
    np.testing.assert_allclose(out.numpy(), 0.5, atol=1e-3)  # (1 - 0) / sqrt(4)
