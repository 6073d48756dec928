"""--eval_tta=flip_translate (airbench's multi-view TTA, step/loops.py): its six views and
weights, the weighted mean of their probabilities, eagerly and inside tf.data, and what the
evaluation step reports from them."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu import models
from tfgpu.distribute import backends
from tfgpu.step.loops import (
    make_eval_step,
    tta_logits,
    tta_probabilities,
    tta_views,
    weighted_mean_of_softmax,
)

pytestmark = pytest.mark.fast


def _softmax(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _images(n=3, size=6, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3)).astype(np.float32)


def test_views_are_the_image_its_shifts_by_one_pixel_and_their_mirrors():
    x = _images()
    views, weights = tta_views(tf.constant(x), "flip_translate")
    padded = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)], mode="reflect")
    up_left, down_right = padded[:, :6, :6], padded[:, 2:, 2:]
    expected = [x, x[:, :, ::-1], up_left, up_left[:, :, ::-1], down_right, down_right[:, :, ::-1]]
    for view, want in zip(views, expected):
        np.testing.assert_array_equal(view.numpy(), want)
    assert weights == [0.25, 0.25, 0.125, 0.125, 0.125, 0.125] and sum(weights) == 1.0


def test_views_are_the_same_eagerly_and_inside_tf_data():
    x = _images(n=4)
    eager = [v.numpy() for v in tta_views(tf.constant(x), "flip_translate")[0]]
    views = lambda b: tta_views(b, "flip_translate")[0]  # noqa: E731
    ds = tf.data.Dataset.from_tensor_slices(x).batch(2).map(views)
    mapped = [np.concatenate(parts) for parts in zip(*[[v for v in b] for b in ds])]
    for a, b in zip(eager, mapped):
        np.testing.assert_array_equal(a, b)


def test_weighted_mean_of_softmax_is_the_weighted_mean_of_the_probabilities():
    rng = np.random.default_rng(1)
    logits = [rng.normal(size=(5, 7)) * 4 for _ in range(3)]
    weights = [0.5, 0.3, 0.2]
    c = weighted_mean_of_softmax([tf.constant(x, tf.float32) for x in logits], weights).numpy()
    want = sum(w * _softmax(x) for w, x in zip(weights, logits))
    np.testing.assert_allclose(_softmax(c.astype(np.float64)), want, rtol=1e-5, atol=1e-7)
    far = weighted_mean_of_softmax(
        [tf.constant([[300.0, -300.0]]), tf.constant([[-300.0, 300.0]])], [0.25, 0.75]
    )
    np.testing.assert_allclose(_softmax(far.numpy().astype(np.float64)), [[0.25, 0.75]], rtol=1e-6)


def test_the_eval_step_reports_the_averaged_probabilities():
    keras.utils.set_random_seed(0)
    model = models.build_model("tiny_cnn", 4, 8)
    x = _images(n=8, size=8, seed=2)
    labels = np.arange(8) % 4
    batch = {
        "image": tf.constant(x),
        "label": tf.constant(labels, tf.int32),
        "weight": tf.ones([8]),
    }
    sums = make_eval_step(model, backends.build_backend("default"), tta="flip_translate")(batch)
    views, weights = tta_views(tf.constant(x), "flip_translate")
    p = sum(
        w * _softmax(np.asarray(model(v, training=False), np.float64))
        for v, w in zip(views, weights)
    )
    assert float(sums["loss"]) == pytest.approx(-np.log(p[np.arange(8), labels]).sum(), rel=1e-5)
    assert float(sums["top1"]) == (p.argmax(-1) == labels).sum()
    same = tta_logits(model, tf.constant(x), "flip_translate")
    np.testing.assert_allclose(_softmax(same.numpy().astype(np.float64)), p, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("tta", ["none", "flip", "flip_translate"])
def test_the_exports_probabilities_are_the_evaluations(tta):
    """``tta_probabilities`` (what the exports compute) is the softmax of ``tta_logits`` (what
    evaluation scores), eagerly and inside a tf.function."""
    keras.utils.set_random_seed(1)
    model = models.build_model("tiny_cnn", 4, 8)
    x = tf.constant(_images(n=5, size=8, seed=3))
    want = tf.nn.softmax(tta_logits(model, x, tta)).numpy()
    np.testing.assert_allclose(tta_probabilities(model, x, tta).numpy(), want, atol=1e-6)
    traced = tf.function(lambda v: tta_probabilities(model, v, tta))(x).numpy()
    np.testing.assert_allclose(traced, want, atol=1e-6)
    views, weights = tta_views(x, tta)
    assert len(views) == {"none": 1, "flip": 2, "flip_translate": 6}[tta] and sum(weights) == 1
