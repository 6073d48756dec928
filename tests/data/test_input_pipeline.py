import inspect

import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    eval_ds,
    make_image_arrays,
    train_ds,
)

from tfgpu.data.config import DataConfig
from tfgpu.data import recordformat
from tfgpu.data import device_ops, host_ops, pipeline, readers, stream
from tfgpu.data import spec as data_spec
from tfgpu.distribute import InputShard

CFG = DataConfig(image_size=32, shuffle_buffer=16)
ORDER = dict(seed=3, deterministic=True)  # the run-wide settings the pipeline takes


def _spec(data_dir):
    return data_spec.load_data_spec(data_dir)


@pytest.mark.fast
@pytest.mark.parametrize("reader", readers.READERS, ids=lambda m: m.__name__.rsplit(".")[-1])
def test_every_train_reader_takes_what_the_protocol_names(reader):
    """The file, in-memory and service readers are interchangeable for ``readers.train_maker``:
    each ``make_train_dataset`` takes ``TrainReader``'s parameters, of the same kinds and
    defaults (more, with defaults, are its own)."""
    wanted = inspect.signature(stream.TrainReader.make_train_dataset).parameters
    given = inspect.signature(reader.make_train_dataset).parameters
    for name, param in list(wanted.items())[2:]:  # self and the source are named freely
        assert name in given, f"{reader.__name__} lacks {name}"
        assert (given[name].kind, given[name].default) == (param.kind, param.default), name
    extra = [p for n, p in given.items() if n not in wanted and p.default is p.empty]
    assert len(extra) == 1, extra  # the source


@pytest.mark.fast
def test_train_batches_are_uint8_of_the_right_shape(small_dataset):
    ds = train_ds(_spec(small_dataset), CFG, InputShard(1, 0), 8, 8, **ORDER)
    batch = next(iter(ds))
    assert batch["image"].shape == (8, 32, 32, 3) and batch["image"].dtype == tf.uint8
    assert batch["label"].shape == (8,) and batch["label"].dtype == tf.int32
    assert batch["flip"].dtype == tf.bool
    assert batch["weight"].dtype == tf.float32 and batch["weight"].numpy().all()


@pytest.mark.slow  # 5 s (2 shared cores)
def test_deterministic_stream_is_repeatable_and_resumable(small_dataset):
    spec = _spec(small_dataset)
    take = lambda ds, n: [b["image"].numpy() for b in ds.take(n)]  # noqa: E731
    a = take(train_ds(spec, CFG, InputShard(1, 0), 8, 8, **ORDER), 30)
    b = take(train_ds(spec, CFG, InputShard(1, 0), 8, 8, **ORDER), 30)
    resumed = take(train_ds(spec, CFG, InputShard(1, 0), 8, 8, **ORDER, start_index=17 * 8), 13)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert all(np.array_equal(x, y) for x, y in zip(a[17:], resumed))


@pytest.mark.slow  # 6 s (2 shared cores)
def test_two_pipelines_split_each_global_batch_without_overlap(small_dataset):
    spec = _spec(small_dataset)
    whole = next(iter(train_ds(spec, CFG, InputShard(1, 0), 8, 8, **ORDER)))["image"].numpy()
    halves = [
        next(iter(train_ds(spec, CFG, InputShard(2, i), 4, 8, **ORDER)))["image"].numpy()
        for i in range(2)
    ]
    np.testing.assert_array_equal(np.concatenate(halves), whole)


@pytest.mark.fast
def test_eval_sees_every_example_once_padded_to_full_batches(small_dataset):
    spec = _spec(small_dataset)
    labels, weights = [], []
    for i in range(2):
        for batch in eval_ds(spec, CFG, InputShard(2, i), 5, 10):
            assert batch["image"].shape == (5, 32, 32, 3)
            labels += list(batch["label"].numpy())
            weights += list(batch["weight"].numpy())
    assert sum(weights) == spec.num_eval == 24
    assert len(weights) == pipeline.eval_steps(24, 10) * 10


@pytest.mark.fast
def test_crop_windows_lie_inside_the_image_eager_and_in_tf_data():
    shape = tf.constant([40, 60, 3])
    seed = host_ops.example_seed(1, tf.constant(0), tf.constant(5))
    eager = host_ops.random_crop_window(shape, seed, 0.3).numpy()
    graph = next(
        iter(
            tf.data.Dataset.from_tensors(shape).map(
                lambda s: host_ops.random_crop_window(s, seed, 0.3)
            )
        )
    )
    np.testing.assert_array_equal(eager, graph.numpy())
    y, x, h, w = eager
    assert 0 <= y and 0 <= x and y + h <= 40 and x + w <= 60 and h * w >= 0.3 * 40 * 60 * 0.99
    center = host_ops.center_crop_window(shape, 0.5).numpy()
    np.testing.assert_array_equal(center, [10, 20, 20, 20])


@pytest.mark.fast
def test_flip_eager_and_in_tf_data():
    images = tf.reshape(tf.range(2 * 2 * 3 * 1, dtype=tf.int32), [2, 2, 3, 1])
    flip = tf.constant([True, False])
    eager = device_ops.apply_flip(images, flip).numpy()
    graph = next(
        iter(tf.data.Dataset.from_tensors((images, flip)).map(device_ops.apply_flip))
    ).numpy()
    np.testing.assert_array_equal(eager, graph)
    np.testing.assert_array_equal(eager[0], images.numpy()[0, :, ::-1])
    np.testing.assert_array_equal(eager[1], images.numpy()[1])


# --- worker shards, bad data, other sources --------------------------------------------------


def _epoch_images(spec, cfg, shard, batch, global_batch, deterministic):
    """One epoch of a pipeline's images, as bytes (crops cover the whole image, no flips)."""
    steps = spec.num_train // global_batch
    ds = train_ds(spec, cfg, shard, batch, global_batch, seed=3, deterministic=deterministic)
    return [img.tobytes() for b in ds.take(steps) for img in b["image"].numpy()]


@pytest.mark.slow  # 6 s (2 shared cores)
def test_two_workers_never_see_an_example_twice_in_an_epoch(small_dataset):
    spec = _spec(small_dataset)
    whole = dict(crop_min_area=1.0, random_flip=False)
    for deterministic in (True, False):  # by position / by file
        cfg = DataConfig(image_size=40, **whole)
        a, b = (_epoch_images(spec, cfg, InputShard(2, i), 4, 8, deterministic) for i in range(2))
        assert len(a) == len(b) == 48
        assert len(set(a) | set(b)) == 96 and not set(a) & set(b)


def _write_records(path, payloads, label_start=0):
    with tf.io.TFRecordWriter(path) as writer:
        for i, data in enumerate(payloads):
            label = i % 4 + label_start
            writer.write(recordformat.encode_example(data, label, 40, 40, "JPEG", f"f{i}"))


def _jpegs(n):
    images, _ = make_image_arrays(n)
    return [tf.io.encode_jpeg(img).numpy() for img in images]


@pytest.mark.fast
def test_broken_image_gets_weight_zero_and_the_stream_goes_on(tmp_path):
    good = _jpegs(8)
    payloads = good[:3] + [good[3][:-200], b"not an image"] + good[5:]
    _write_records(str(tmp_path / "train-00000-of-00001"), payloads)
    spec = data_spec.load_data_spec(str(tmp_path), num_classes=4)
    batch = next(iter(train_ds(spec, CFG, InputShard(1, 0), 8, 8, **ORDER)))
    assert sorted(batch["weight"].numpy()) == [0, 0, 1, 1, 1, 1, 1, 1]
    broken = batch["weight"].numpy() == 0
    assert not batch["image"].numpy()[broken].any()
    _, targets = device_ops.make_batch_fn("uint8", 4, CFG)(batch)
    assert not targets.numpy()[broken].any()  # zero targets: no loss, no gradient


@pytest.mark.fast
def test_broken_records_are_named_once_however_many_epochs(tmp_path, capfd):
    from tfgpu.data import broken

    good = _jpegs(8)
    _write_records(str(tmp_path / "train-00000-of-00001"), good[:5] + [good[5][:-200]] + good[6:])
    spec = data_spec.load_data_spec(str(tmp_path), num_classes=4)
    broken.forget()
    batches = list(train_ds(spec, CFG, InputShard(1, 0), 8, 8, **ORDER).take(4))  # 4 epochs
    assert sum(int((b["weight"].numpy() == 0).sum()) for b in batches) == 4  # once a pass
    name = str(tmp_path / "train-00000-of-00001")
    assert broken.found() == [{"file": name, "index": 5, "reason": broken.REASON}]
    warnings = [line for line in capfd.readouterr().err.splitlines() if "is broken" in line]
    assert warnings == [
        f"tfgpu: WARNING: record 5 of {name} is broken ({broken.REASON}): it is trained with "
        "weight 0, and named here once"
    ]


@pytest.mark.fast
def test_truncated_shard_is_an_error_naming_it_or_skipped_under_the_flag(tmp_path):
    path = str(tmp_path / "train-00000-of-00001")
    _write_records(path, _jpegs(4))
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-100])
    with pytest.raises(data_spec.DataError, match="train-00000-of-00001 is truncated"):
        data_spec.load_data_spec(str(tmp_path), num_classes=4)
    spec = data_spec.load_data_spec(str(tmp_path), num_classes=4, skip_truncated=True)
    cfg = DataConfig(image_size=32, skip_truncated_shards=True, shuffle_buffer=1)
    batch = next(iter(train_ds(spec, cfg, InputShard(1, 0), 3, 3)))
    assert batch["image"].shape == (3, 32, 32, 3)


@pytest.mark.fast
def test_official_imagenet_records_labels_from_one(tmp_path):
    _write_records(str(tmp_path / "train-00000-of-00001"), _jpegs(8), label_start=1)
    with pytest.raises(data_spec.DataError, match="--num_classes"):
        data_spec.load_data_spec(str(tmp_path))
    spec = data_spec.load_data_spec(str(tmp_path), num_classes=4, label_offset=1)
    assert spec.num_train == 8
    labels = next(iter(train_ds(spec, CFG, InputShard(1, 0), 8, 8, **ORDER)))["label"]
    assert sorted(labels.numpy()) == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.fast
def test_tfds_dataset_read_from_its_files(tmp_path):
    import tensorflow_datasets as tfds  # noqa: PLC0415 (a dependency; seconds to import)

    class TinyShapes(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = {
                "image": tfds.features.Image(shape=(40, 40, 3)),
                "label": tfds.features.ClassLabel(num_classes=4),
            }
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(features),
                supervised_keys=("image", "label"),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(12), "test": self._generate_examples(4)}

        def _generate_examples(self, n):
            images, labels = make_image_arrays(n)
            for i in range(n):
                yield i, {"image": images[i], "label": int(labels[i])}

    TinyShapes(data_dir=str(tmp_path)).download_and_prepare()
    spec = data_spec.load_tfds_spec("tiny_shapes", str(tmp_path))
    assert (spec.num_classes, spec.num_train, spec.num_eval) == (4, 12, 4)
    batch = next(iter(train_ds(spec, CFG, InputShard(1, 0), 4, 4, **ORDER)))
    assert batch["image"].shape == (4, 32, 32, 3) and batch["weight"].numpy().all()
    evaluation = list(eval_ds(spec, CFG, InputShard(1, 0), 4, 4))
    assert sum(float(b["weight"].numpy().sum()) for b in evaluation) == 4


@pytest.mark.slow  # 5 s (2 shared cores)
def test_dct_scaled_decode_hands_over_large_crops_at_a_smaller_scale(small_dataset):
    """Same crop windows (same seed); with --dct_scaled_decode=on or auto those >= 2x the
    output on both sides arrive decoded at 1/2 or 1/4 scale, never below the output size, the
    others at full scale."""
    spec = data_spec.load_data_spec(small_dataset)
    sizes, S = {}, 12  # the output side: windows of the 40x40 images are ~1x to 3x it
    for dct in ("off", "on", "auto"):
        cfg = DataConfig(image_size=S, crop_min_area=0.1, resize_on="device", dct_scaled_decode=dct)
        # deterministic: on a loaded machine tf.data may hand the examples over in another order
        ds = train_ds(spec, cfg, InputShard(1, 0), 16, 16, **dict(ORDER, seed=1))
        sizes[dct] = next(iter(ds))["sizes"]
    full, scaled = sizes["off"].numpy(), sizes["on"].numpy()
    ratio = np.where(full.min(1) >= 4 * S, 4, np.where(full.min(1) >= 2 * S, 2, 1))
    assert (ratio > 1).any() and (ratio == 1).any()
    expected = -(-full // ratio[:, None])  # + 1 where the window is widened to whole pixels
    assert ((scaled >= expected) & (scaled <= expected + 1)).all(), (full, scaled)
    assert (scaled.min(1) >= S).all()
    np.testing.assert_array_equal(sizes["auto"].numpy(), scaled)  # the same, chosen per example
    assert DataConfig(dct_scaled_decode=True).dct_scaled_decode == "on"  # an older config.json
