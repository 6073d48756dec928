"""Device-side ops: same result eagerly and in tf.data; MixUp/CutMix independent of the split."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from conftest import train_ds

from tfgpu.data.config import DataConfig
from tfgpu.data import device_ops, host_ops
from tfgpu.data import spec as data_spec
from tfgpu.distribute import InputShard

MIX = DataConfig(image_size=32, shuffle_buffer=16, mixup_alpha=0.4, cutmix_alpha=1.0)
ORDER = dict(seed=5, deterministic=True)


def _eager_and_graph(fn, *args):
    eager = fn(*args)
    graph = next(iter(tf.data.Dataset.from_tensors(args).map(fn)))
    return eager, graph


def _assert_same(a, b):
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)


def test_host_ops_eager_equal_tf_data():
    seed = host_ops.example_seed(2, tf.constant(1), tf.constant(7))
    _assert_same(*_eager_and_graph(lambda s: host_ops.draw_mixing(s, 32, 0.4, 1.0), seed))
    _assert_same(*_eager_and_graph(host_ops.draw_flip, seed))
    image = tf.cast(tf.reshape(tf.range(30 * 50 * 3) % 251, [30, 50, 3]), tf.uint8)
    eager, graph = _eager_and_graph(lambda x: host_ops.resize_uint8(x, 16), image)
    _assert_same(eager, graph)
    assert eager.shape == (16, 16, 3) and eager.dtype == tf.uint8
    reference = tf.cast(tf.round(tf.image.resize(image, [16, 16])), tf.uint8)
    assert np.abs(eager.numpy().astype(int) - reference.numpy()).max() <= 1
    encoded = tf.io.encode_jpeg(image)
    _assert_same(*_eager_and_graph(host_ops.looks_whole, encoded))
    assert not host_ops.looks_whole(tf.strings.substr(encoded, 0, 100))
    assert host_ops.looks_whole(encoded + b"\x00" * 9)  # padding after EOI is common
    png = tf.io.encode_png(image)
    assert host_ops.looks_whole(png)
    assert not host_ops.looks_whole(tf.strings.substr(png, 0, 60))
    # A block of records at once (as the train pipeline checks them) = one at a time.
    block = tf.stack(
        [encoded, tf.strings.substr(encoded, 0, 100), encoded + b"\x00" * 9, png]
        + [tf.strings.substr(png, 0, 60), b"", b"\xff\xd9", b"GIF8"]
    )
    eager, graph = _eager_and_graph(host_ops.looks_whole, block)
    _assert_same(eager, graph)
    assert eager.numpy().tolist() == [bool(host_ops.looks_whole(e)) for e in block]
    assert eager.numpy().tolist() == [True, False, True, True, False, False, False, True]


def test_large_jpeg_windows_decode_at_a_dct_scale_like_an_antialiased_resize():
    smooth = tf.image.resize(tf.random.stateless_uniform([1, 40, 48, 3], [3, 4]), [1000, 1200])
    encoded = tf.io.encode_jpeg(tf.cast(smooth[0] * 255, tf.uint8), quality=90)
    full = tf.io.decode_jpeg(encoded, channels=3)
    # One output size, windows of every scale: each mode's choice traced once in tf.data
    # (a trace of the four-decode choice costs ~0.2 CPU-s; one per window took 12 of them).
    min_side = 120
    cases = [  # window -> decoded shape
        ([100, 200, 200, 800], (200, 800)),  # 200 < 2 x 120: full scale
        ([100, 200, 300, 800], (150, 400)),  # >= 2x, < 4x: 1/2
        ([1, 1, 599, 1199], (150, 300)),  # >= 4x: 1/4, odd edges rounded outwards
        ([0, 0, 900, 1200], (225, 300)),  # >= 8x on one side only: 1/4
        ([0, 0, 1000, 1200], (125, 150)),  # >= 8x: 1/8
    ]
    windows = tf.constant([window for window, _ in cases])
    for mode in ("on", "auto"):
        decode = lambda w, d=mode: host_ops.decode_crop(encoded, lambda _: w, min_side, d)  # noqa: E731
        graphs = list(tf.data.Dataset.from_tensor_slices(windows).map(decode))
        for (window, shape), graph in zip(cases, graphs, strict=True):
            eager = decode(tf.constant(window))
            _assert_same(eager, graph)
            assert eager.shape == shape + (3,), (window, mode)
            y, x, h, w = window
            crop = tf.cast(full[y : y + h, x : x + w], tf.float32)
            reference = tf.image.resize(crop, shape, antialias=True)
            # Windows are widened to whole scaled pixels: off by under one, ~1-2.5/255 on average.
            assert float(tf.reduce_mean(tf.abs(tf.cast(eager, tf.float32) - reference))) < 3.0
    # No output size: the window at full scale, with no choice of scale.
    whole = lambda e: host_ops.decode_crop(e, lambda _: tf.constant([100, 200, 600, 800]))  # noqa: E731
    eager, graph = _eager_and_graph(whole, encoded)
    _assert_same(eager, graph)
    assert eager.shape == (600, 800, 3)
    difference = tf.abs(tf.cast(eager, tf.float32) - tf.cast(full[100:700, 200:1000], tf.float32))
    assert float(tf.reduce_mean(difference)) < 3.0  # the fused decode's edges: not to the bit


def test_mixing_draws_are_consistent():
    for position in range(20):
        seed = host_ops.example_seed(0, tf.constant(0), tf.constant(position))
        d = {k: v.numpy() for k, v in host_ops.draw_mixing(seed, 32, 0.4, 1.0).items()}
        assert 0 <= d["mix_lam"] <= 1
        if d["use_cut"]:
            y0, x0, y1, x1 = d["cut_box"]
            assert np.isclose(d["mix_lam"], 1 - (y1 - y0) * (x1 - x0) / 32**2)


def _batch(spec, shard, batch, global_batch):
    return next(iter(train_ds(spec, MIX, shard, batch, global_batch, **ORDER)))


@pytest.fixture(scope="module")
def whole_batch(small_dataset):
    """The first batch of 8 of one pipeline (MIX), as the device fn receives it: read once
    for the tests below (each pipeline traced costs ~0.6 CPU-s); none changes it."""
    return _batch(data_spec.load_data_spec(small_dataset), InputShard(1, 0), 8, 8)


def test_batch_fn_eager_equal_tf_data_and_shapes(whole_batch):
    batch = whole_batch
    fn = device_ops.make_batch_fn("uint8", 4, MIX)
    eager, graph = fn(batch), next(iter(tf.data.Dataset.from_tensors(batch).map(fn)))
    _assert_same(eager, graph)
    images, targets = eager
    assert images.shape == (8, 32, 32, 3) and images.dtype == tf.float32
    assert targets.shape == (8, 4)
    np.testing.assert_allclose(targets.numpy().sum(-1), 1.0, rtol=1e-5)


@pytest.mark.slow  # 6 s (2 shared cores)
def test_mixing_does_not_depend_on_the_split(small_dataset, whole_batch):
    """Two pipelines x half batches give, after the device fn, the whole batch's result."""
    spec = data_spec.load_data_spec(small_dataset)
    fn = device_ops.make_batch_fn("uint8", 4, MIX)
    whole = fn(whole_batch)
    halves = [fn(_batch(spec, InputShard(2, i), 4, 8)) for i in range(2)]
    for k in range(2):
        np.testing.assert_allclose(
            np.concatenate([h[k].numpy() for h in halves]), whole[k].numpy(), rtol=1e-6
        )


def test_preprocess_on_host_equals_device(small_dataset, whole_batch):
    spec = data_spec.load_data_spec(small_dataset)
    device = device_ops.make_batch_fn("uint8", 4, MIX)(whole_batch)
    host_cfg = dataclasses.replace(MIX, preprocess_on="host")
    host_batch = next(iter(train_ds(spec, host_cfg, InputShard(1, 0), 8, 8, **ORDER)))
    _assert_same(device, device_ops.make_batch_fn("float", 4, host_cfg)(host_batch))


def test_pair_swap_and_flip():
    x = tf.reshape(tf.range(4 * 2), [4, 2])
    np.testing.assert_array_equal(device_ops.pair_swap(x).numpy(), [[2, 3], [0, 1], [6, 7], [4, 5]])
    images = tf.reshape(tf.range(2 * 2 * 3 * 1, dtype=tf.int32), [2, 2, 3, 1])
    flip = tf.constant([True, False])
    eager, graph = _eager_and_graph(device_ops.apply_flip, images, flip)
    _assert_same(eager, graph)
    np.testing.assert_array_equal(eager[0], images.numpy()[0, :, ::-1])


def _crops(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]


def _flat(crops):
    """Crops packed one after the other, as a --resize_on=device batch carries them."""
    words = tf.concat([host_ops.pack_pixels(tf.constant(c)) for c in crops], 0)
    return words, tf.constant([c.shape[:2] for c in crops], tf.int32)


def test_pack_pixels_round_trips_eagerly_and_in_tf_data():
    for crop in _crops([(1, 1), (3, 5), (8, 1), (7, 9)]):
        eager, graph = _eager_and_graph(host_ops.pack_pixels, tf.constant(crop))
        _assert_same(eager, graph)
        assert eager.dtype == tf.int64 and eager.shape[0] % 3 == 0
        rgb = device_ops.unpack_rgb(eager).numpy()
        n = crop.shape[0] * crop.shape[1]
        np.testing.assert_array_equal(rgb[:n], crop.reshape(-1, 3))
        assert len(rgb) == -(-n // 8) * 8 and not rgb[n:].any()


def test_resize_flat_equals_tf_image_resize_eagerly_and_in_tf_data():
    crops = _crops([(30, 50), (7, 3), (1, 1), (100, 64), (16, 16), (17, 250)])
    pixels, sizes = _flat(crops)
    eager, graph = _eager_and_graph(lambda p, s: device_ops.resize_flat(p, s, 16), pixels, sizes)
    _assert_same(eager, graph)
    assert eager.shape == (len(crops), 16, 16, 3) and eager.dtype == tf.float32
    for image, crop in zip(eager.numpy(), crops):
        np.testing.assert_allclose(image, tf.image.resize(crop, [16, 16]).numpy(), atol=1e-3)
        host = host_ops.resize_uint8(tf.constant(crop), 16).numpy()  # rounded to uint8
        assert np.abs(image - host).max() <= 0.5 + 1e-3


def test_resize_flat_does_not_depend_on_the_batch():
    crops = _crops([(30, 50), (9, 40), (64, 12), (5, 5)], seed=1)
    whole = device_ops.resize_flat(*_flat(crops), 8).numpy()
    halves = [device_ops.resize_flat(*_flat(crops[i : i + 2]), 8).numpy() for i in (0, 2)]
    np.testing.assert_array_equal(np.concatenate(halves), whole)


DEVICE_RESIZE = dataclasses.replace(MIX, resize_on="device")


@pytest.fixture(scope="module")
def packed_batch(small_dataset):
    """(the first packed batch of 8 of one DEVICE_RESIZE pipeline, the device fn's (images,
    targets) of it): read once for the two tests below (a pipeline traced costs ~0.6 CPU-s);
    neither changes it."""
    spec = data_spec.load_data_spec(small_dataset)
    batch = next(iter(train_ds(spec, DEVICE_RESIZE, InputShard(1, 0), 8, 8, **ORDER)))
    return batch, device_ops.make_batch_fn("packed", 4, DEVICE_RESIZE)(batch)


@pytest.mark.slow  # 8 s (2 shared cores)
def test_resize_on_device_batches_and_equals_host_resize(small_dataset, packed_batch, whole_batch):
    spec = data_spec.load_data_spec(small_dataset)
    batch, (images, targets) = packed_batch
    assert "image" not in batch and batch["pixels"].dtype == tf.int64
    assert batch["pixels"].shape.rank == 1 and batch["sizes"].shape == (8, 2)
    # No padding beyond each crop's last 8-pixel group: 3 words per group.
    groups = (tf.reduce_prod(batch["sizes"], 1) + 7) // 8
    assert batch["pixels"].shape[0] == 3 * int(tf.reduce_sum(groups))
    assert images.shape == (8, 32, 32, 3) and images.dtype == tf.float32
    host_images, host_targets = device_ops.make_batch_fn("uint8", 4, MIX)(whole_batch)
    # Same crops, flips and mixing; the host rounds its resize to uint8 (MixUp blends two).
    assert np.abs(images.numpy() - host_images.numpy()).max() <= 1.0 + 1e-3
    _assert_same(targets, host_targets)
    # Inside tf.data (--preprocess_on=host with the resize on "device") gives the same.
    both_host = dataclasses.replace(DEVICE_RESIZE, preprocess_on="host")
    host_batch = next(iter(train_ds(spec, both_host, InputShard(1, 0), 8, 8, **ORDER)))
    np.testing.assert_allclose(host_batch["image"].numpy(), images.numpy(), atol=1e-4)


@pytest.mark.slow  # 7 s (2 shared cores)
def test_resize_on_device_does_not_depend_on_the_split(small_dataset, packed_batch):
    spec = data_spec.load_data_spec(small_dataset)
    fn = device_ops.make_batch_fn("packed", 4, DEVICE_RESIZE)
    make = lambda shard, b: next(iter(train_ds(spec, DEVICE_RESIZE, shard, b, 8, **ORDER)))
    _, whole = packed_batch
    halves = [fn(make(InputShard(2, i), 4)) for i in range(2)]
    for k in range(2):
        np.testing.assert_allclose(
            np.concatenate([h[k].numpy() for h in halves]), whole[k].numpy(), rtol=1e-6
        )
