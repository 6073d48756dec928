"""The in-memory small-dataset path (tfgpu/data/memory.py): the per-example path's contract
(layout, determinism, exact resume, split invariance) from a decoded uint8 array."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from conftest import make_image_arrays

from tfgpu.data.config import DataConfig
from tfgpu.data import recordformat
from tfgpu.data import device_ops, memory
from tfgpu.data import spec as data_spec
from tfgpu.data.stream import Stream
from tfgpu.distribute import InputShard

CFG = DataConfig(image_size=32, in_memory="on")
MIX = DataConfig(image_size=32, in_memory="on", mixup_alpha=0.4, cutmix_alpha=1.0)
WHOLE = DataConfig(image_size=32, in_memory="on", crop_padding=0, random_flip=False)


@pytest.fixture(scope="module")
def mem(small_dataset):
    return memory.load(data_spec.load_data_spec(small_dataset), CFG)


@pytest.fixture(scope="module")
def mem0(small_dataset):
    """Stored without padding, for --crop_padding=0."""
    return memory.load(data_spec.load_data_spec(small_dataset), WHOLE)


ONE = InputShard(1, 0)


def _stream(mem, data, shard=ONE, batch=8, global_batch=8, **kw):
    stream = Stream(batch, global_batch, seed=kw.pop("seed", 3), deterministic=True, **kw)
    return memory.make_train_dataset(mem, data, shard, stream)


def _take(ds, n, key="image"):
    return [b[key].numpy() for b in ds.take(n)]


@pytest.mark.fast
def test_batches_have_the_uint8_layout_with_mix_draws(mem):
    assert mem.num_examples == 96 and mem.image_size == 32  # 40x40 resized once, then padded
    assert mem.images.shape == (96, 40, 40, 3)
    batch = next(iter(_stream(mem, MIX)))
    assert batch["image"].shape == (8, 32, 32, 3) and batch["image"].dtype == tf.uint8
    assert batch["label"].dtype == tf.int32 and batch["flip"].dtype == tf.bool
    assert batch["weight"].dtype == tf.float32 and batch["weight"].numpy().all()
    mix = batch["mix"]
    assert mix["mix_lam"].shape == (8,) and mix["cut_box"].shape == (8, 4)
    assert mix["use_cut"].dtype == tf.bool
    assert "mix" not in next(iter(_stream(mem, CFG)))


@pytest.mark.fast
def test_deterministic_stream_is_repeatable_and_resumes_exactly_across_epochs(mem):
    # 96 examples, batches of 8: 30 batches run 2.5 epochs; the resume starts mid-epoch 1.
    a = _take(_stream(mem, CFG), 30)
    b = _take(_stream(mem, CFG), 30)
    resumed = _take(_stream(mem, CFG, start_index=17 * 8), 13)
    np.testing.assert_array_equal(np.stack(a), np.stack(b))
    np.testing.assert_array_equal(np.stack(a[17:]), np.stack(resumed))
    other = np.stack(_take(_stream(mem, CFG, seed=4), 30))
    assert other.shape == np.stack(a).shape and not np.array_equal(other, a)


@pytest.mark.fast
def test_every_example_once_per_epoch_also_across_a_batch_that_ends_the_epoch(mem0):
    """Global batches of 10 over 96 examples: batch 9 ends epoch 0 and begins epoch 1."""
    everything = {img.tobytes() for img in mem0.images.numpy()}
    images = [
        img.tobytes()
        for x in _take(_stream(mem0, WHOLE, batch=10, global_batch=10), 20)
        for img in x
    ]
    assert set(images[:96]) == everything and len(set(images[:96])) == 96
    assert set(images[96:192]) == everything
    assert images[:96] != images[96:192]  # each epoch its own order


@pytest.mark.slow  # 6 s (2 shared cores)
def test_two_pipelines_split_each_global_batch_also_after_mixing(mem):
    """One pipeline with 2 replica batches of 4 per global batch of 8, or two pipelines of one
    replica batch each: the same examples, draws and mixed images."""
    prepare = device_ops.make_batch_fn("uint8", 4, MIX)
    whole = list(_stream(mem, MIX, batch=4, global_batch=8).take(6))
    halves = [list(_stream(mem, MIX, InputShard(2, i), 4, 8).take(3)) for i in range(2)]
    for step in range(3):
        parts = [halves[0][step], halves[1][step]]
        assert [p["image"].numpy().tobytes() for p in parts] == [
            w["image"].numpy().tobytes() for w in whole[2 * step : 2 * step + 2]
        ]
        for part, w in zip(parts, whole[2 * step : 2 * step + 2], strict=True):
            images, targets = prepare(part)
            expected_images, expected_targets = prepare(w)
            np.testing.assert_array_equal(images.numpy(), expected_images.numpy())
            np.testing.assert_array_equal(targets.numpy(), expected_targets.numpy())


@pytest.mark.fast
def test_draws_depend_only_on_seed_epoch_and_position(mem):
    """Batches of 8 or of 12, from the start or resumed: position p of epoch e becomes the
    same crop, flip and MixUp/CutMix draw."""

    def positions(batch, count, start=0):
        ds = _stream(mem, MIX, batch=batch, global_batch=batch, start_index=start)
        batches = list(ds.take(count))
        flat = lambda key: np.concatenate([b[key].numpy() for b in batches])  # noqa: E731
        mix = lambda key: np.concatenate([b["mix"][key].numpy() for b in batches])  # noqa: E731
        return [flat("image"), flat("flip"), mix("mix_lam"), mix("cut_box"), mix("use_cut")]

    by_8, by_12 = positions(8, 30), positions(12, 20)  # 240 positions, 2.5 epochs
    resumed = positions(12, 12, start=96)  # epoch 1 on
    for a, b, c in zip(by_8, by_12, resumed, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a[96:240], c)


@pytest.mark.parametrize("mixup, cutmix", [(0.4, 0.0), (0.0, 1.0), (0.4, 1.0)])
@pytest.mark.fast
def test_mixing_draws_follow_draw_mixing(mixup, cutmix):
    """host_ops.draw_mixing's rules on vectors: CutMix keeps 1 - the box's area, MixUp a
    Beta(alpha, alpha) share and no box; with both, each example picks one at even odds."""
    key = lambda stream: tf.constant([7, -stream], tf.int64)  # noqa: E731
    draws = {k: v.numpy() for k, v in memory.mixing_draws(key, 4000, 32, mixup, cutmix).items()}
    cut, lam, box = draws["use_cut"], draws["mix_lam"], draws["cut_box"]
    assert cut.mean() == pytest.approx(0.5 if mixup and cutmix else float(cutmix > 0), abs=0.03)
    area = (box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1]) / 32**2
    np.testing.assert_allclose(lam[cut], 1 - area[cut], atol=1e-6)
    assert (box[~cut] == 0).all() and ((0 <= box) & (box <= 32)).all()
    assert ((0 <= lam) & (lam <= 1)).all()
    if mixup:  # Beta(0.4, 0.4): symmetric around 1/2, mostly near 0 or 1
        assert lam[~cut].mean() == pytest.approx(0.5, abs=0.05)
        assert ((lam[~cut] < 0.1) | (lam[~cut] > 0.9)).mean() > 0.4


@pytest.mark.fast
def test_images_are_stored_padded_by_reflection(mem, mem0):
    inner = mem0.images.numpy()
    np.testing.assert_array_equal(mem.images.numpy()[:, 4:36, 4:36], inner)
    reflected = np.pad(inner, [(0, 0), (4, 4), (4, 4), (0, 0)], mode="reflect")
    np.testing.assert_array_equal(mem.images.numpy(), reflected)


@pytest.mark.fast
def test_padded_crop_matches_numpy_eagerly_and_in_tf_data():
    images = np.random.default_rng(0).integers(1, 256, (5, 6, 6, 2), dtype=np.uint8)
    padded = np.pad(images, [(0, 0), (2, 2), (2, 2), (0, 0)])
    index, offsets = np.array([3, 0, 3, 4]), np.array([[0, 0], [4, 1], [2, 3], [4, 4]])
    expected = np.stack([padded[i, y : y + 6, x : x + 6] for i, (y, x) in zip(index, offsets)])
    eager = memory.crop(tf.constant(padded), tf.constant(index), tf.constant(offsets), 6).numpy()
    graph = next(
        iter(
            tf.data.Dataset.from_tensors((padded, index, offsets)).map(
                lambda x, i, o: memory.crop(x, i, o, 6)
            )
        )
    ).numpy()
    np.testing.assert_array_equal(eager, expected)
    np.testing.assert_array_equal(graph, expected)
    assert not eager[0, :2].any() and not eager[1, 4:].any()  # this test pads with zeros
    np.testing.assert_array_equal(eager[2, :, :5], images[3, :, 1:])  # shifted by one column


@pytest.mark.fast
def test_flips_and_crop_offsets_are_drawn_and_applied(mem, mem0):
    batch = next(iter(_stream(mem, CFG, batch=96, global_batch=96)))
    assert 20 < batch["flip"].numpy().sum() < 76
    padded = mem.images.numpy()
    crops = {  # every image at every one of the 81 offsets
        padded[i, y : y + 32, x : x + 32].tobytes(): (y, x)
        for i in range(96)
        for y in range(9)
        for x in range(9)
    }
    offsets = [crops[image.tobytes()] for image in batch["image"].numpy()]
    assert len(set(offsets)) > 40 and offsets.count((4, 4)) < 10  # 1/81 are centred
    plain = next(iter(_stream(mem0, WHOLE, batch=96, global_batch=96)))
    assert not plain["flip"].numpy().any()
    assert {i.tobytes() for i in plain["image"].numpy()} == {
        i.tobytes() for i in mem0.images.numpy()
    }


@pytest.mark.fast
def test_packed_layout_for_a_step_that_resizes_on_the_device(mem):
    data = DataConfig(image_size=32, in_memory="on", resize_on="device", mixup_alpha=0.4)
    packed = next(iter(_stream(mem, data)))
    uint8 = next(iter(_stream(mem, dataclasses.replace(data, resize_on="host"))))
    assert set(packed) == {"pixels", "sizes", "label", "flip", "weight", "mix"}
    np.testing.assert_array_equal(packed["sizes"].numpy(), np.full((8, 2), 32))
    a = device_ops.make_batch_fn("packed", 4, data)(packed)
    b = device_ops.make_batch_fn("uint8", 4, data)(uint8)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.numpy(), y.numpy())


@pytest.mark.fast
def test_float_layout_for_preprocess_on_host(mem):
    data = DataConfig(image_size=32, in_memory="on", preprocess_on="host", mixup_alpha=0.4)
    host = next(iter(_stream(mem, data)))
    uint8 = next(iter(_stream(mem, dataclasses.replace(data, preprocess_on="device"))))
    assert set(host) == {"image", "target", "weight"} and host["image"].dtype == tf.float32
    images, targets = device_ops.make_batch_fn("uint8", 4, data)(uint8)
    np.testing.assert_array_equal(host["image"].numpy(), images.numpy())
    np.testing.assert_array_equal(host["target"].numpy(), targets.numpy())


@pytest.mark.fast
def test_broken_image_gets_weight_zero(tmp_path):
    images, _ = make_image_arrays(8)
    good = [tf.io.encode_jpeg(img).numpy() for img in images]
    payloads = good[:3] + [good[3][:-200], b"not an image"] + good[5:]
    with tf.io.TFRecordWriter(str(tmp_path / "train-00000-of-00001")) as writer:
        for i, data in enumerate(payloads):
            writer.write(recordformat.encode_example(data, i % 4, 40, 40, "JPEG", f"f{i}"))
    mem = memory.load(data_spec.load_data_spec(str(tmp_path), num_classes=4), CFG)
    np.testing.assert_array_equal(mem.weights.numpy(), [1, 1, 1, 0, 0, 1, 1, 1])
    assert not mem.images.numpy()[3:5].any() and mem.images.numpy()[5].any()
    batch = next(iter(_stream(mem, CFG)))
    broken = batch["weight"].numpy() == 0
    assert broken.sum() == 2 and not batch["image"].numpy()[broken].any()


@pytest.mark.fast
def test_auto_uses_memory_when_the_split_fits_the_budget(small_dataset):
    spec = data_spec.load_data_spec(small_dataset)  # 96 x 40 x 40 x 3 bytes (padded): 0.44 MB
    fits = DataConfig(image_size=32)
    too_small = DataConfig(image_size=32, in_memory_mb=0)
    assert memory.decide(spec, fits) == (True, "train split in memory (96 images, 0.4 MB)")
    assert not memory.decide(spec, too_small).use
    assert "> --in_memory_mb=0" in memory.decide(spec, too_small).reason
    assert memory.load(spec, too_small) is None
    assert memory.load(spec, DataConfig(image_size=32, in_memory="off")) is None
    assert memory.decide(spec, DataConfig(image_size=32, in_memory="on", in_memory_mb=0)).use
    assert memory.load(spec, fits).describe() == "train split in memory (96 images, 0.4 MB)"
