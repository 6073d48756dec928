import numpy as np
import tensorflow as tf

from tfgpu import input_pipeline as ip
from tfgpu import preprocess
from tfgpu.distribute import InputShard

CFG = ip.PipelineConfig(image_size=32, seed=3, deterministic=True, shuffle_buffer=16)


def _spec(data_dir):
    return ip.load_data_spec(data_dir)


def test_train_batches_are_uint8_of_the_right_shape(small_dataset):
    ds = ip.make_train_dataset(_spec(small_dataset), CFG, InputShard(1, 0), 8, 8)
    batch = next(iter(ds))
    assert batch["image"].shape == (8, 32, 32, 3) and batch["image"].dtype == tf.uint8
    assert batch["label"].shape == (8,) and batch["label"].dtype == tf.int32
    assert batch["flip"].dtype == tf.bool


def test_deterministic_stream_is_repeatable_and_resumable(small_dataset):
    spec = _spec(small_dataset)
    take = lambda ds, n: [b["image"].numpy() for b in ds.take(n)]  # noqa: E731
    a = take(ip.make_train_dataset(spec, CFG, InputShard(1, 0), 8, 8), 30)
    b = take(ip.make_train_dataset(spec, CFG, InputShard(1, 0), 8, 8), 30)
    resumed = take(ip.make_train_dataset(spec, CFG, InputShard(1, 0), 8, 8, start_index=17 * 8), 13)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert all(np.array_equal(x, y) for x, y in zip(a[17:], resumed))


def test_two_pipelines_split_each_global_batch_without_overlap(small_dataset):
    spec = _spec(small_dataset)
    whole = next(iter(ip.make_train_dataset(spec, CFG, InputShard(1, 0), 8, 8)))["image"].numpy()
    halves = [
        next(iter(ip.make_train_dataset(spec, CFG, InputShard(2, i), 4, 8)))["image"].numpy()
        for i in range(2)
    ]
    np.testing.assert_array_equal(np.concatenate(halves), whole)


def test_eval_sees_every_example_once_padded_to_full_batches(small_dataset):
    spec = _spec(small_dataset)
    labels, weights = [], []
    for i in range(2):
        for batch in ip.make_eval_dataset(spec, CFG, InputShard(2, i), 5, 10):
            assert batch["image"].shape == (5, 32, 32, 3)
            labels += list(batch["label"].numpy())
            weights += list(batch["weight"].numpy())
    assert sum(weights) == spec.num_eval == 24
    assert len(weights) == ip.eval_steps(24, 10) * 10


def test_crop_windows_lie_inside_the_image_eager_and_in_tf_data():
    shape = tf.constant([40, 60, 3])
    seed = ip.example_seed(1, tf.constant(0), tf.constant(5))
    eager = ip.random_crop_window(shape, seed, 0.3).numpy()
    graph = next(iter(tf.data.Dataset.from_tensors(shape).map(lambda s: ip.random_crop_window(s, seed, 0.3))))
    np.testing.assert_array_equal(eager, graph.numpy())
    y, x, h, w = eager
    assert 0 <= y and 0 <= x and y + h <= 40 and x + w <= 60 and h * w >= 0.3 * 40 * 60 * 0.99
    center = ip.center_crop_window(shape, 0.5).numpy()
    np.testing.assert_array_equal(center, [10, 20, 20, 20])


def test_flip_eager_and_in_tf_data():
    images = tf.reshape(tf.range(2 * 2 * 3 * 1, dtype=tf.int32), [2, 2, 3, 1])
    flip = tf.constant([True, False])
    eager = preprocess.apply_flip(images, flip).numpy()
    graph = next(iter(tf.data.Dataset.from_tensors((images, flip)).map(preprocess.apply_flip))).numpy()
    np.testing.assert_array_equal(eager, graph)
    np.testing.assert_array_equal(eager[0], images.numpy()[0, :, ::-1])
    np.testing.assert_array_equal(eager[1], images.numpy()[1])
