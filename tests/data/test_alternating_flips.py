"""--alternating_flips (airbench's): each training image mirrored in every other epoch, decided
per example and epoch, on the in-memory path (memory.alternating_flips) and the per-example
path (host_ops.alternating_flip), eagerly and inside tf.data, whatever the batch split."""

import numpy as np
import pytest
import tensorflow as tf

from tfgpu.config import ConfigError, config_from, validate
from tfgpu.data import host_ops, memory
from tfgpu.data import spec as data_spec
from tfgpu.data.config import DataConfig
from tfgpu.data.stream import Stream
from tfgpu.distribute import InputShard

pytestmark = pytest.mark.fast

ALTERNATING = DataConfig(image_size=32, in_memory="on", crop_padding=0, alternating_flips=True)


def test_each_example_is_mirrored_in_exactly_one_of_two_epochs():
    flips = np.stack([memory.alternating_flips(5, e, 1000).numpy() for e in range(4)])
    np.testing.assert_array_equal(flips[0], ~flips[1])
    np.testing.assert_array_equal(flips[0], flips[2])
    np.testing.assert_array_equal(flips[1], flips[3])
    assert 400 < flips[0].sum() < 600
    np.testing.assert_array_equal(flips[0], memory.alternating_flips(5, 0, 1000).numpy())
    assert (flips[0] != memory.alternating_flips(6, 0, 1000).numpy()).any()  # by seed


def test_epoch_draws_flip_each_position_as_its_example():
    index = tf.constant([3, 0, 7, 7, 1], tf.int64)
    for epoch in (0, 1):
        draws = memory.epoch_draws(
            tf.constant(epoch, tf.int64), 5, ALTERNATING, 9, index=index, num_examples=8
        )
        want = memory.alternating_flips(9, epoch, 8).numpy()[index.numpy()]
        np.testing.assert_array_equal(draws["flip"].numpy(), want)


def test_the_per_example_draw_is_the_same_eagerly_and_inside_tf_data():
    origins = tf.constant([0, 1, 2, (3 << 32) + 5, (1 << 32)], tf.int64)
    for epoch in (0, 1, 2):
        eager = [bool(host_ops.alternating_flip(4, epoch, o)) for o in origins]
        ds = tf.data.Dataset.from_tensor_slices(origins).map(
            lambda o, e=epoch: host_ops.alternating_flip(4, tf.constant(e, tf.int64), o)
        )
        assert [bool(x) for x in ds.as_numpy_iterator()] == eager
        if epoch:
            before = [bool(host_ops.alternating_flip(4, epoch - 1, o)) for o in origins]
            assert [not x for x in before] == eager


def test_in_memory_batches_split_across_pipelines_flip_as_the_whole(small_dataset):
    mem = memory.load(data_spec.load_data_spec(small_dataset), ALTERNATING)

    def flips(shard, batch):
        stream = Stream(batch, 16, seed=3, deterministic=True)
        ds = memory.make_train_dataset(mem, ALTERNATING, shard, stream)
        return [b["flip"].numpy() for b in ds.take(12)]  # two epochs of 96

    whole = np.concatenate(flips(InputShard(1, 0), 16))
    halves = [flips(InputShard(2, i), 8) for i in range(2)]
    split = np.concatenate([np.concatenate([a, b]) for a, b in zip(*halves)])
    np.testing.assert_array_equal(split, whole)
    # Epoch 2 shows each image the other way round: as many flipped as not, by example.
    first, second = whole[:96], whole[96:]
    assert first.sum() + second.sum() == 96


def test_alternating_flips_need_random_flips():
    with pytest.raises(ConfigError, match="--alternating_flips is a way of --random_flip"):
        validate(config_from(alternating_flips=True, random_flip=False))
