"""Fine-tuning controls (tfgpu/finetune.py): --unfreeze_after_steps, --backbone_lr_multiplier
and --layer_lr_decay.

The training tests run a stand-in for a keras.applications model (``_stand_in``: a nested
backbone named as keras.applications names EfficientNetB0, with its block names and
BatchNorm), a few thousand weights instead of four million, so that a run takes seconds; the
block rules themselves are checked on the registry's real models (densenet121 in one dense block
a stage: Keras' builder and layer names, every stage and transition).
"""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY_RUN, make_image_arrays
from fewer_blocks import fewer_blocks
from weights import assert_same_weights
from weights import named as named_weights
from keras import layers

from tfgpu import compat, models, optim, train
from tfgpu.optim import finetune
from tfgpu.models import pretrained
from tfgpu.config import ConfigError, config_from, validate
from tfgpu.convert import plan
from tfgpu.convert.manifest import items_from_arrays
from tfgpu.distribute import backends
from tfgpu.step.loops import make_train_loop
from tfgpu.optim.schedules import WarmupDecay
from tfgpu.step.train_step import TrainStep

SIZE, CLASSES = 16, 4


def _stand_in(*args, **kwargs):
    """A small model shaped as ``applications.build`` builds them (the registry builder's
    arguments are taken and ignored): image -> backbone "efficientnetb0" (stem, block1a,
    block2a, top: conv + BatchNorm each) -> logits."""
    del args, kwargs
    inputs = keras.Input((SIZE, SIZE, 3))
    x = layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)
    for name, filters, strides in (("stem", 8, 2), ("block1a", 8, 1), ("block2a", 16, 2)):
        x = layers.Conv2D(filters, 3, strides, "same", use_bias=False, name=f"{name}_conv")(x)
        x = layers.ReLU()(layers.BatchNormalization(momentum=0.9, name=f"{name}_bn")(x))
    x = layers.Conv2D(16, 1, name="top_conv")(x)
    x = layers.ReLU()(layers.BatchNormalization(momentum=0.9, name="top_bn")(x))
    backbone = keras.Model(inputs, layers.GlobalAveragePooling2D()(x), name="efficientnetb0")
    image = keras.Input((SIZE, SIZE, 3), name="image")
    logits = layers.Dense(CLASSES, dtype="float32", name="logits")(backbone(image))
    return keras.Model(image, logits, name="efficientnet_b0")


# --- the flags ---------------------------------------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(unfreeze_after_steps=-1), "--unfreeze_after_steps=-1 must not be negative"),
        (dict(unfreeze_after_steps=5), "unfreezes a frozen backbone: add --freeze=backbone"),
        (dict(layer_lr_decay=0.0), "--layer_lr_decay=0.0 must be in (0, 1]"),
        (dict(layer_lr_decay=1.5), "--layer_lr_decay=1.5 must be in (0, 1]"),
        (dict(backbone_lr_multiplier=-0.1), "--backbone_lr_multiplier=-0.1 must be in (0, 1]"),
        (dict(layer_lr_decay=0.7, model="tiny_cnn"), "not --model=tiny_cnn"),
        (dict(layer_lr_decay=0.7, model="densenet121", freeze="backbone"), "never trains it"),
    ],
)
def test_fine_tuning_flags_that_do_not_fit_are_one_line(settings, message):
    with pytest.raises(ConfigError) as err:
        validate(config_from(**settings))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.fast
@pytest.mark.parametrize(
    "settings",
    [
        dict(model="resnet18", layer_lr_decay=0.7, backbone_lr_multiplier=0.1),
        dict(
            model="efficientnet_b0", freeze="backbone", unfreeze_after_steps=3, layer_lr_decay=0.8
        ),
    ],
)
def test_fine_tuning_flags_that_fit_are_kept_as_given(settings):
    flat = validate(config_from(**settings)).flat()
    assert {key: flat[key] for key in settings} == settings


# --- blocks ------------------------------------------------------------------------------


@pytest.mark.slow  # builds 4 registry models at 32x32: 2-7 s each
@pytest.mark.parametrize(
    "name, labels",
    [
        ("efficientnet_b0", ["top", *[f"block{i}" for i in range(7, 0, -1)], "stem"]),
        ("efficientnetv2_b0", ["top", *[f"block{i}" for i in range(6, 0, -1)], "stem"]),
        ("densenet121", ["conv5", "conv4", "conv3", "conv2", "conv1"]),
        ("resnet18", ["stage4", "stage3", "stage2", "stage1", "stem"]),
    ],
)
def test_every_trainable_variable_of_a_registry_model_is_in_one_block(name, labels):
    # densenet121 in one dense block a stage (tests/fewer_blocks.py: Keras' own layer names,
    # every stage and transition); the EfficientNets whole, whose labels name every stage.
    with fewer_blocks() if name == "densenet121" else contextlib.nullcontext():
        model = models.build_model(name, CLASSES, 32, small_input=True)
    blocks = finetune.backbone_blocks(model)
    assert [label for label, _ in blocks] == labels
    grouped = [id(v) for _, group in blocks for v in group]
    head = model.get_layer("logits").trainable_weights
    assert len(set(grouped)) == len(grouped)
    assert set(grouped) | {id(v) for v in head} == {id(v) for v in model.trainable_variables}
    config = config_from(model=name, layer_lr_decay=0.5, backbone_lr_multiplier=0.1)
    groups = finetune.lr_groups(config.optim, config.model, model)
    assert [m for _, m, _ in groups] == pytest.approx(
        [1.0] + [0.1 * 0.5**d for d in range(1, 1 + len(labels))]
    )


# --- learning rates per group ----------------------------------------------------------


def _config(**settings):
    base = dict(optimizer="adamw", learning_rate=0.01, weight_decay=1e-2, momentum=0.9)
    return config_from(**dict(base, lr_schedule="constant", **settings))


def _run_optimizer(config, model, total_steps: int):
    """The run's optimizer of ``model`` under ``config``, as the run makes it."""
    batch = config.train.global_batch_size
    return finetune.run_optimizer(config.optim, config.model, model, batch, total_steps)


def _grads(variables, seed):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in variables]


def _reference(o, multiplier: float):
    """An optimizer of the run's kind for one variable, at ``lr * multiplier``."""
    schedule = WarmupDecay(o.learning_rate * multiplier, 10, o.warmup_steps, o.lr_schedule)
    return optim.build_optimizer(o.name, schedule, **optim.optimizer_options(o))


@pytest.mark.fast
@pytest.mark.parametrize(
    "optimizer, weight_decay", [("sgd", 1e-3), ("adamw", 1e-2), ("lars", 1e-3)]
)
def test_each_block_updates_as_with_its_own_learning_rate(optimizer, weight_decay):
    # Warmup over the first 2 updates: every group must follow the head's schedule, at the
    # head's count (a group a step ahead or behind would use another rate).
    config = _config(
        optimizer=optimizer,
        learning_rate=5.0 if optimizer == "lars" else 0.01,  # LARS' steps: lr x eeta x |w|/|g|
        weight_decay=weight_decay,
        layer_lr_decay=0.5,
        backbone_lr_multiplier=0.5,
        warmup_steps=2,
    )
    keras.utils.set_random_seed(0)
    model = _stand_in()
    grouped = _run_optimizer(config, model, 10)
    variables = model.trainable_variables
    grouped.build(variables)
    references = {}  # variable id -> (a copy, its own optimizer at lr * m, m)
    for _, multiplier, group in finetune.lr_groups(config.optim, config.model, model):
        for var in group:  # the copy keeps the name: weight decay skips gamma, beta and bias
            copy = keras.Variable(var.numpy(), name=var.name)
            references[id(var)] = (copy, _reference(config.optim, multiplier), multiplier)
    for i in range(3):
        grads = _grads(variables, seed=i)
        grouped.apply(grads, variables)
        for var, grad in zip(variables, grads, strict=True):
            copy, reference, _ = references[id(var)]
            reference.apply([grad], [copy])
    for var in variables:
        copy, _, _ = references[id(var)]
        np.testing.assert_allclose(var.numpy(), copy.numpy(), rtol=1e-6, atol=1e-7)
    # head, top, block2, block1, stem
    assert {m for _, _, m in references.values()} == {1.0, 0.25, 0.125, 0.0625, 0.03125}


def _frozen_with_groups(config):
    """(the stand-in model with its backbone frozen, its GroupedOptimizer built on it), as
    the run builds them: the groups before the freeze."""
    keras.utils.set_random_seed(0)
    model = _stand_in()
    grouped = _run_optimizer(config, model, 10)
    pretrained.freeze_backbone(model)
    grouped.build(model.trainable_variables)
    return model, grouped


@pytest.mark.fast
def test_an_unfrozen_backbone_starts_adam_as_a_new_optimizer():
    # 3 updates of the head alone, then everything: the backbone's first Adam update is a new
    # Adam's first (bias correction from its own count), not one with moments from zero at
    # update 4 of a shared count (0.58x as large here; ~3x after thousands of updates).
    config = _config(freeze="backbone", unfreeze_after_steps=3, weight_decay=0.0)
    model, grouped = _frozen_with_groups(config)
    for i in range(3):
        grouped.apply(_grads(model.trainable_variables, i), model.trainable_variables)
    assert [int(o.iterations.numpy()) for o in grouped.optimizers] == [3, 0]
    pretrained.backbone_of(model).trainable = True
    kernel = model.get_layer("efficientnetb0").get_layer("stem_conv").kernel
    before = kernel.numpy()
    grads = _grads(model.trainable_variables, 9)
    grouped.apply(grads, model.trainable_variables)
    fresh = keras.optimizers.AdamW(0.01, weight_decay=0.0)
    copy = keras.Variable(before)
    fresh.apply([grads[[id(v) for v in model.trainable_variables].index(id(kernel))]], [copy])
    np.testing.assert_allclose(kernel.numpy(), copy.numpy(), rtol=1e-6, atol=1e-8)
    assert [int(o.iterations.numpy()) for o in grouped.optimizers] == [4, 1]


@pytest.mark.fast
def test_ema_weights_leave_a_backbone_never_trained_as_it_is():
    # The groups are built before --init_weights is loaded (models.set_initial_weights), so a
    # frozen group's average holds the weights as built until its first update: evaluation
    # must not use it.
    config = _config(freeze="backbone", unfreeze_after_steps=3, ema_decay=0.5)
    model, grouped = _frozen_with_groups(config)
    kernel = model.get_layer("efficientnetb0").get_layer("stem_conv").kernel
    kernel.assign(kernel.numpy() + 1.0)  # as a weights file loaded after the build
    loaded = kernel.numpy()
    head = model.get_layer("logits").kernel
    for i in range(2):
        grouped.apply(_grads(model.trainable_variables, i), model.trainable_variables)
    trained = head.numpy()
    with compat.ema_weights(grouped):
        np.testing.assert_array_equal(kernel.numpy(), loaded)
        assert not np.array_equal(head.numpy(), trained)  # the head's average is swapped in
    np.testing.assert_array_equal(head.numpy(), trained)


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (n, SIZE, SIZE, 3)).astype(np.uint8),
        "label": (np.arange(n) % CLASSES).astype(np.int32),
        "flip": np.zeros(n, bool),
        "weight": np.ones(n, np.float32),
    }


def _train_steps(config, updates=3, batch=8):
    """``updates`` TrainStep updates of the stand-in with ``config``'s optimizer (default
    strategy); returns (its named weights, optimizer)."""
    backend = backends.build_backend("default")
    keras.utils.set_random_seed(3)
    model = _stand_in()
    optimizer = _run_optimizer(config, model, 10)
    step = TrainStep(model, optimizer, backend, global_batch_size=batch)
    data = tf.data.Dataset.from_tensor_slices(_batches(batch * updates)).batch(batch)
    update = tf.function(step.update)
    for b in data:
        update(b)
    return named_weights(model), optimizer


@pytest.mark.slow  # 4 short TrainStep runs: ~10 s
@pytest.mark.parametrize("optimizer", [pytest.param("sgd", marks=pytest.mark.heavy), "adamw"])
def test_groups_at_multiplier_1_step_bit_for_bit_as_one_optimizer(optimizer):
    plain, one = _train_steps(_config(optimizer=optimizer, layer_lr_decay=1.0))
    assert not isinstance(one, finetune.GroupedOptimizer)  # D = 1: the plain path itself
    # Groups with every multiplier 1 (what --unfreeze_after_steps makes, here never frozen):
    # per-group optimizers change no bit of any update.
    grouped, groups = _train_steps(_config(optimizer=optimizer, unfreeze_after_steps=2))
    assert isinstance(groups, finetune.GroupedOptimizer) and groups.multipliers == (1.0, 1.0)
    assert_same_weights(grouped, plain)


# --- unfreezing in a run, and resuming across it ------------------------------------------


def _weights(model) -> dict:
    """{"backbone/layer/i" or "head/logits/i": array} of every weight of a stand-in."""
    backbone = pretrained.backbone_of(model)
    named = [("backbone", x) for x in backbone.layers] + [("head", model.get_layer("logits"))]
    return {f"{part}/{x.name}/{i}": w.numpy() for part, x in named for i, w in enumerate(x.weights)}


def _assert_equal(a: dict, b: dict, keys=None) -> None:
    """``a`` and ``b`` hold the same weights; those of ``keys`` (else all) equal to the bit."""
    assert a.keys() == b.keys()
    keys = keys or list(a)
    assert_same_weights({k: a[k] for k in keys}, {k: b[k] for k in keys})


@pytest.mark.slow  # traces the loop twice under 2 replicas: ~15 s
def test_unfrozen_under_mirrored_the_backbone_trains_and_replicas_stay_equal():
    backend = backends.build_backend("mirrored")
    config = _config(optimizer="adam", freeze="backbone", unfreeze_after_steps=2)
    keras.utils.set_random_seed(3)
    with backend.scope():  # as the run builds them: every variable, the groups' slots too, in scope
        model = _stand_in()
        optimizer = _run_optimizer(config.with_settings(layer_lr_decay=0.5), model, 10)
        pretrained.freeze_backbone(model)
        step = TrainStep(model, optimizer, backend, global_batch_size=8)
        counters = [tf.Variable(0, dtype=tf.int64, trainable=False) for _ in range(2)]
    loop = make_train_loop(step, *counters)
    data = backend.distribute_dataset(
        lambda shard: tf.data.Dataset.from_tensor_slices(_batches(32)).batch(4)
    )
    batches = iter(data)
    initial = _weights(model)
    backbone = [key for key in initial if key.startswith("backbone/")]
    loop(batches, tf.constant(2), step.variant)
    _assert_equal(_weights(model), initial, backbone)  # frozen: weights and statistics
    settings = config_from(model="efficientnet_b0", freeze="backbone")  # the stand-in's family
    finetune.unfreeze(model, settings.model, step)
    assert len(step.moving_stats.variables) == 8  # the backbone's 4 BatchNorm layers train now
    loop(batches, tf.constant(2), step.variant)
    assert loop.experimental_get_tracing_count() == 2
    trained = _weights(model)
    assert not [key for key in backbone if np.array_equal(trained[key], initial[key])]
    assert [int(o.iterations.numpy()) for o in optimizer.optimizers] == [4, 2, 2, 2, 2]
    for var in model.weights:  # one value on both replicas, BatchNorm statistics included
        first, second = [np.asarray(c.numpy()) for c in var.value.values]
        np.testing.assert_array_equal(first, second, err_msg=var.path)


RUN = dict(
    TINY_RUN,
    strategy="default",
    model="efficientnet_b0",
    image_size=SIZE,
    global_batch_size=8,
    optimizer="adam",
    learning_rate=0.003,
    freeze="backbone",
    unfreeze_after_steps=3,
    layer_lr_decay=0.5,
    train_steps=6,
    steps_per_loop=6,
    log_every_steps=6,
    checkpoint_every_steps=100,
    input_probe_s=0.0,
)


@pytest.fixture(scope="module")
def train_split(tmp_path_factory) -> str:
    """A converted train split alone (48 images of 20x20): the runs have no evaluation to trace."""
    out = str(tmp_path_factory.mktemp("train-only"))
    images, labels = make_image_arrays(48, size=20)
    items = items_from_arrays(images, labels, prefix="synthetic")
    plan.write_dataset(
        {"train": items}, ["a", "b", "c", "d"], out, source="tests", num_shards={"train": 2}
    )
    return out


def _run(data_dir, model_dir, monkeypatch, **settings):
    """train.run of RUN with the stand-in model; returns (its lines, its final weights)."""
    monkeypatch.setattr(models, "build_model", _stand_in)
    lines = []
    monkeypatch.setattr(
        "tfgpu.results.writer.RunWriter.info", lambda self, line: lines.append(line)
    )
    config = config_from(data_dir=data_dir, model_dir=str(model_dir), **dict(RUN, **settings))
    train.run(validate(config))
    model = _stand_in()
    model.load_weights(model_dir / "final.weights.h5")
    return lines, _weights(model)


@pytest.fixture(scope="module")
def uninterrupted(train_split, tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        return _run(train_split, tmp_path_factory.mktemp("uninterrupted"), monkeypatch)


@pytest.mark.slow  # 3 short runs (+ the uninterrupted one, once): ~4 CPU-s each
def test_a_run_stopped_before_and_after_the_unfreeze_resumes_exactly(
    train_split, uninterrupted, tmp_path, monkeypatch
):
    """One run stopped at 2 (before the unfreeze after 3), resumed and stopped again at 4
    (after it), resumed to the end: the uninterrupted run's weights to the bit. A resume that
    went wrong at either stop leaves them (one run fewer than a run for each stop)."""
    lines, weights = uninterrupted
    assert "step 3: backbone unfrozen" in " ".join(lines)
    assert any(line.startswith("fine-tune: learning rate logits x1, top x0.5") for line in lines)
    _, stopped = _run(train_split, tmp_path, monkeypatch, train_steps=2)
    keras.utils.set_random_seed(RUN["seed"])
    initial = _weights(_stand_in())
    backbone = [key for key in initial if key.startswith("backbone/")]
    _assert_equal(stopped, initial, backbone)  # frozen: weights and BatchNorm statistics
    for stop, train_steps in ((2, 4), (4, RUN["train_steps"])):
        lines, resumed = _run(train_split, tmp_path, monkeypatch, train_steps=train_steps)
        assert any(line.startswith("resumed from") and f"at step {stop}" in line for line in lines)
        unfrozen = [line for line in lines if "backbone unfrozen" in line]
        assert unfrozen and unfrozen[0].startswith(f"step {max(stop, 3)}:")
    _assert_equal(resumed, weights)
