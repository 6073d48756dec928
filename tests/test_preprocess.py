"""Device-side ops: same result eagerly and in tf.data; MixUp/CutMix independent of the split."""

import numpy as np
import tensorflow as tf

from tfgpu import image_ops, preprocess
from tfgpu import input_pipeline as ip
from tfgpu.distribute import InputShard

MIX = ip.PipelineConfig(
    image_size=32, seed=5, deterministic=True, shuffle_buffer=16, mixup_alpha=0.4, cutmix_alpha=1.0
)


def _eager_and_graph(fn, *args):
    eager = fn(*args)
    graph = next(iter(tf.data.Dataset.from_tensors(args).map(fn)))
    return eager, graph


def _assert_same(a, b):
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)


def test_host_ops_eager_equal_tf_data():
    seed = image_ops.example_seed(2, tf.constant(1), tf.constant(7))
    _assert_same(*_eager_and_graph(lambda s: image_ops.draw_mixing(s, 32, 0.4, 1.0), seed))
    _assert_same(*_eager_and_graph(image_ops.draw_flip, seed))
    image = tf.cast(tf.reshape(tf.range(30 * 50 * 3) % 251, [30, 50, 3]), tf.uint8)
    eager, graph = _eager_and_graph(lambda x: image_ops.resize_uint8(x, 16), image)
    _assert_same(eager, graph)
    assert eager.shape == (16, 16, 3) and eager.dtype == tf.uint8
    reference = tf.cast(tf.round(tf.image.resize(image, [16, 16])), tf.uint8)
    assert np.abs(eager.numpy().astype(int) - reference.numpy()).max() <= 1
    encoded = tf.io.encode_jpeg(image)
    _assert_same(*_eager_and_graph(image_ops.looks_whole, encoded))
    assert not image_ops.looks_whole(tf.strings.substr(encoded, 0, 100))
    assert image_ops.looks_whole(encoded + b"\x00" * 9)  # padding after EOI is common
    png = tf.io.encode_png(image)
    assert image_ops.looks_whole(png)
    assert not image_ops.looks_whole(tf.strings.substr(png, 0, 60))


def test_mixing_draws_are_consistent():
    for position in range(20):
        seed = image_ops.example_seed(0, tf.constant(0), tf.constant(position))
        d = {k: v.numpy() for k, v in image_ops.draw_mixing(seed, 32, 0.4, 1.0).items()}
        assert 0 <= d["mix_lam"] <= 1
        if d["use_cut"]:
            y0, x0, y1, x1 = d["cut_box"]
            assert np.isclose(d["mix_lam"], 1 - (y1 - y0) * (x1 - x0) / 32**2)


def _batch(spec, shard, batch, global_batch):
    return next(iter(ip.make_train_dataset(spec, MIX, shard, batch, global_batch)))


def test_batch_fn_eager_equal_tf_data_and_shapes(small_dataset):
    spec = ip.load_data_spec(small_dataset)
    batch = _batch(spec, InputShard(1, 0), 8, 8)
    fn = preprocess.make_batch_fn(4)
    eager, graph = fn(batch), next(iter(tf.data.Dataset.from_tensors(batch).map(fn)))
    _assert_same(eager, graph)
    images, targets = eager
    assert images.shape == (8, 32, 32, 3) and images.dtype == tf.float32
    assert targets.shape == (8, 4)
    np.testing.assert_allclose(targets.numpy().sum(-1), 1.0, rtol=1e-5)


def test_mixing_does_not_depend_on_the_split(small_dataset):
    """Two pipelines x half batches give, after the device fn, the whole batch's result."""
    spec = ip.load_data_spec(small_dataset)
    fn = preprocess.make_batch_fn(4)
    whole = fn(_batch(spec, InputShard(1, 0), 8, 8))
    halves = [fn(_batch(spec, InputShard(2, i), 4, 8)) for i in range(2)]
    for k in range(2):
        np.testing.assert_allclose(
            np.concatenate([h[k].numpy() for h in halves]), whole[k].numpy(), rtol=1e-6
        )


def test_preprocess_on_host_equals_device(small_dataset):
    spec = ip.load_data_spec(small_dataset)
    device = preprocess.device_fn(4, MIX)(_batch(spec, InputShard(1, 0), 8, 8))
    host_cfg = ip.PipelineConfig(**{**MIX.__dict__, "preprocess_on": "host"})
    host_batch = next(iter(ip.make_train_dataset(spec, host_cfg, InputShard(1, 0), 8, 8)))
    _assert_same(device, preprocess.device_fn(4, host_cfg)(host_batch))


def test_pair_swap_and_flip():
    x = tf.reshape(tf.range(4 * 2), [4, 2])
    np.testing.assert_array_equal(preprocess.pair_swap(x).numpy(), [[2, 3], [0, 1], [6, 7], [4, 5]])
    images = tf.reshape(tf.range(2 * 2 * 3 * 1, dtype=tf.int32), [2, 2, 3, 1])
    flip = tf.constant([True, False])
    eager, graph = _eager_and_graph(preprocess.apply_flip, images, flip)
    _assert_same(eager, graph)
    np.testing.assert_array_equal(eager[0], images.numpy()[0, :, ::-1])
