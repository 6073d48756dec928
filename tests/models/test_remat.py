"""--remat (tfgpu/models/remat.py): per-block gradient checkpointing gives the gradients,
BatchNorm statistics and dropout masks of the model without it, for every family, and leaves
the model's checkpoint object graph as it is. Memory and time: bench/remat.py."""

import contextlib

import keras
import numpy as np
import pytest
from fewer_blocks import fewer_blocks
from weights import assert_same_weights, changed, largest
from weights import named as named_weights
import tensorflow as tf

from tfgpu import models
from tfgpu.models import prepare, remat, resnet


def _gradients(model, trained, images, labels):
    """Gradients of ``trained`` (a model's variables) at one training forward pass of
    ``model``, and the model's non-trainable variables (moving statistics, seeds) after it."""

    @tf.function
    def grads():
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            loss = tf.reduce_mean(loss)
        return tape.gradient(loss, trained.trainable_variables)

    before = [v.numpy() for v in trained.non_trainable_variables]
    names = named_weights(trained.trainable_variables)
    out = dict(zip(names, (g.numpy() for g in grads()), strict=True))
    after = named_weights(trained.non_trainable_variables)
    for v, value in zip(trained.non_trainable_variables, before, strict=True):
        v.assign(value)  # the next pass starts from the same state
    return out, after


@pytest.mark.slow  # builds and traces keras.applications models (10-60 s each)
@pytest.mark.parametrize(
    "name,drop_path,small",
    [
        ("tiny_cnn", -1.0, False),
        # resnet18's code in three stages of one block (the stem, an identity block, strided
        # blocks with projection shortcuts: two blocks recomputed, which chains them);
        # resnet18 itself heavy.
        ("resnet8", -1.0, False),
        pytest.param("resnet18", -1.0, False, marks=pytest.mark.heavy),
        # Stochastic depth on: the recompute must draw the same masks. B0's first three stages
        # (tests/fewer_blocks.py: five blocks, two with stochastic depth, at 0.24 and 0.48 so
        # that new masks show in 8 examples); the whole B0 (at Keras' 0.2) heavy.
        ("efficientnet_b0", 0.6, True),
        pytest.param("efficientnet_b0", 0.2, False, marks=pytest.mark.heavy),
        pytest.param("densenet121", -1.0, False, marks=pytest.mark.heavy),
    ],
)
def test_remat_gives_the_same_gradients_statistics_and_checkpoint(name, drop_path, small, tmp_path):
    keras.utils.set_random_seed(1)
    if name == "resnet8":
        model = resnet.build(4, 32, small_input=True, depths=(1, 1, 1))
    else:
        with fewer_blocks() if small else contextlib.nullcontext():
            model = models.build_model(name, 4, 32, small_input=True, drop_path_rate=drop_path)
    saved = tf.train.Checkpoint(model=model).write(str(tmp_path / "before"))
    if name == "resnet8":  # not a registry name: the resnet family's blocks
        wrapped = remat.rematerialized(model, "resnet")
    else:
        wrapped = prepare.rematerialized(model, name)
    assert wrapped.blocks >= 2
    # The optimizer sees the same variables in the same order (its slots, its checkpoint).
    assert [id(v) for v in wrapped.trainable_variables] == [
        id(v) for v in model.trainable_variables
    ]
    rng = np.random.default_rng(0)
    images = tf.constant(rng.integers(0, 256, (8, 32, 32, 3)).astype(np.float32))
    labels = tf.constant([0, 1, 2, 3] * 2)
    grads, state = _gradients(model, model, images, labels)
    remat_grads, remat_state = _gradients(wrapped, model, images, labels)
    assert_same_weights(remat_grads, grads, atol=1e-6 * largest(grads), what="gradients")
    initial = named_weights(model.non_trainable_variables)
    if name == "tiny_cnn":  # no BatchNorm, no seeds: no state to move
        assert state == remat_state == {}
    else:  # BatchNorm statistics (and seeds) moved: the comparison means something
        assert changed(state, initial)
        assert_same_weights(remat_state, state, atol=1e-6)  # moved once, not twice
    # Wrapping added nothing to what a checkpoint of the model holds.
    after = tf.train.Checkpoint(model=model).write(str(tmp_path / "after"))
    names = lambda path: sorted(n for n, _ in tf.train.list_variables(path))  # noqa: E731
    assert names(after) == names(saved)


@pytest.mark.fast
def test_a_model_without_blocks_is_refused():
    inputs = keras.Input((8, 8, 3))
    model = keras.Model(inputs, keras.layers.Dense(2, name="logits")(inputs))
    with pytest.raises(ValueError, match="no blocks found"):
        remat.rematerialized(model, "tiny_cnn")
