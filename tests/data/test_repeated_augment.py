"""--repeated_augment=K (tfgpu/data/sampling.py) on both train paths: each global batch holds
global_batch_size / K examples K times, copies global / K apart with their own draws; a
training epoch stays N positions; the stream resumes exactly. Default = mirrored = accumulation
with it: tests/e2e/test_equivalence.py."""

import collections

import numpy as np
import pytest
from conftest import train_ds

from tfgpu.config import ConfigError, config_from, validate
from tfgpu.data import memory
from tfgpu.data import spec as data_spec
from tfgpu.data.stream import Stream
from tfgpu.data.config import DataConfig
from tfgpu.distribute import InputShard

pytestmark = pytest.mark.fast
ONE = InputShard(1, 0)
MEM = DataConfig(image_size=32, in_memory="on")  # padded crops and flips: copies differ
WHOLE = DataConfig(image_size=32, in_memory="on", crop_padding=0, random_flip=False)


def _memory(mem, data, global_batch, k, start=0, batch=None):
    stream = Stream(batch or global_batch, global_batch, 3, True, start_index=start, repeats=k)
    return memory.make_train_dataset(mem, data, ONE, stream)


@pytest.fixture(scope="module")
def spec(small_dataset):
    return data_spec.load_data_spec(small_dataset)


def test_in_memory_copies_sit_global_over_k_apart_with_their_own_draws(spec):
    mem = memory.load(spec, MEM)
    batches = list(_memory(mem, MEM, 12, 3).take(4))
    for b in batches:
        labels, offsets = b["label"].numpy(), b["image"].numpy()
        for i in range(4):  # 4 examples, 3 copies each, at i, i + 4, i + 8
            assert labels[i] == labels[i + 4] == labels[i + 8]
        assert not np.array_equal(offsets[:4], offsets[4:8])  # own crops and flips
    resumed = list(_memory(mem, MEM, 12, 3, start=2 * 12).take(2))
    for a, b in zip(batches[2:], resumed, strict=True):
        np.testing.assert_array_equal(a["image"].numpy(), b["image"].numpy())


def test_in_memory_a_pass_over_the_data_holds_each_example_k_times(spec):
    """96 examples, K=2, global batch 20 (10 distinct each, not dividing 96): 10 global
    batches take 100 source examples, all of epoch 0 and 4 of the next, each twice; an
    epoch of 96 positions holds ~48 distinct examples."""
    mem = memory.load(spec, WHOLE)
    stored = {img.tobytes(): i for i, img in enumerate(mem.images.numpy())}
    seen = [
        stored[img.tobytes()]
        for b in _memory(mem, WHOLE, 20, 2).take(10)
        for img in b["image"].numpy()
    ]
    counts = collections.Counter(seen)
    assert set(counts) == set(range(96)) and all(c % 2 == 0 for c in counts.values())
    assert sorted(counts.values()).count(4) == 4
    assert 46 <= len(set(seen[:96])) <= 50
    # Two replicas of 10: the second holds the copies of the first's examples.
    first, second = (
        {img.tobytes() for img in b["image"].numpy()}
        for b in _memory(mem, WHOLE, 20, 2, batch=10).take(2)
    )
    assert first == second and len(first) == 10


def test_per_example_path_repeats_with_own_draws_and_resumes(spec):
    data = DataConfig(image_size=24, in_memory="off", shuffle_buffer=32)
    ds = train_ds(spec, data, ONE, 8, 8, seed=5, deterministic=True, repeats=2)
    batches = [b for b in ds.take(14)]  # 112 positions: 56 source examples of 96
    for b in batches:
        labels, images = b["label"].numpy(), b["image"].numpy()
        np.testing.assert_array_equal(labels[:4], labels[4:])
        assert not np.array_equal(images[:4], images[4:])  # each copy its own crop
    resumed = train_ds(spec, data, ONE, 8, 8, seed=5, deterministic=True, repeats=2, start_index=56)
    for a, b in zip(batches[7:], list(resumed.take(7)), strict=True):
        np.testing.assert_array_equal(a["image"].numpy(), b["image"].numpy())


def test_bad_settings_name_the_flag():
    with pytest.raises(
        ConfigError, match="--repeated_augment=3 must divide --global_batch_size=16"
    ):
        validate(config_from(repeated_augment=3, global_batch_size=16))
    with pytest.raises(ConfigError, match="--repeated_augment=0 must be in 1..64"):
        validate(config_from(repeated_augment=0))
    with pytest.raises(ConfigError, match="--repeated_augment and --synthetic_data"):
        validate(config_from(repeated_augment=2, synthetic_data=True, global_batch_size=16))
