"""TFRecords -> uint8 batches on the host, in the order of TF's official ResNet input function.

Train: files (shuffled per epoch) -> parallel interleave -> shuffle buffer -> [shard] ->
parallel map(parse, fused decode-and-crop, resize) -> batch -> prefetch.
Eval: the same, without randomness, with a center crop, each example once, padded with
weight-0 examples so every replica and worker runs the same number of steps.

Randomness is drawn on the host from stateless seeds keyed by (seed, epoch, position in the
epoch), so what an example becomes never depends on how the global batch is split. The host
only draws the dice; the float work (flip, cast, normalization) runs on the accelerator, see
``preprocess.py``.
"""

import json
import os
from dataclasses import dataclass

import tensorflow as tf

from tfgpu import records
from tfgpu.convert import INFO_FILE
from tfgpu.distribute import InputShard

AUTOTUNE = tf.data.AUTOTUNE


class DataError(ValueError):
    """A dataset that cannot be read as asked; the message is one line naming the file or flag."""


@dataclass(frozen=True)
class DataSpec:
    """What the pipeline needs to know about a converted dataset."""

    data_dir: str
    num_classes: int
    label_offset: int
    train_files: tuple
    eval_files: tuple
    num_train: int
    num_eval: int


def _split_files(data_dir: str, info: dict, split: str) -> tuple:
    if info and split in info.get("splits", {}):
        names = [s["file"] for s in info["splits"][split]["shards"]]
        files = [os.path.join(data_dir, n) for n in names]
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            raise DataError(f"{missing[0]} is listed in {INFO_FILE} but does not exist")
        return tuple(files)
    return tuple(sorted(tf.io.gfile.glob(os.path.join(data_dir, f"{split}-*"))))


def load_data_spec(data_dir: str, num_classes: int = 0, label_offset: int = -1) -> DataSpec:
    """Reads ``dataset_info.json`` (optional) and lists the shards of ``data_dir``.

    ``num_classes`` > 0 and ``label_offset`` >= 0 override the info file; without an info file
    (e.g. TensorFlow's official ImageNet records) ``num_classes`` is required.
    """
    if not os.path.isdir(data_dir):
        raise DataError(f"--data_dir={data_dir} is not a directory")
    info = {}
    info_path = os.path.join(data_dir, INFO_FILE)
    if os.path.exists(info_path):
        try:
            with open(info_path, encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError) as err:
            raise DataError(f"{info_path} is not valid JSON: {err}") from None
    train = _split_files(data_dir, info, "train")
    evaluation = _split_files(data_dir, info, "validation")
    if not train:
        raise DataError(f"--data_dir={data_dir} holds no train-* shards (write them with tools/to_tfrecord.py)")
    classes = num_classes or int(info.get("num_classes", 0))
    if classes <= 0:
        raise DataError(f"--data_dir={data_dir} has no {INFO_FILE}: set --num_classes")
    counts = {k: v.get("num_examples", 0) for k, v in info.get("splits", {}).items()}
    return DataSpec(
        data_dir=data_dir,
        num_classes=classes,
        label_offset=label_offset if label_offset >= 0 else int(info.get("label_offset", 0)),
        train_files=train,
        eval_files=evaluation,
        num_train=counts.get("train") or _count(train),
        num_eval=counts.get("validation") or _count(evaluation),
    )


def _count(files) -> int:
    """Counts records by reading them: only for datasets without a dataset_info.json."""
    if not files:
        return 0
    return int(tf.data.TFRecordDataset(list(files)).reduce(0, lambda n, _: n + 1))


def _options(deterministic: bool, threadpool_size: int, ram_budget_mb: int) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = deterministic
    options.autotune.enabled = True
    if ram_budget_mb:
        options.autotune.ram_budget = ram_budget_mb * 1024 * 1024
    options.experimental_optimization.map_parallelization = True
    options.experimental_optimization.parallel_batch = True
    # tfgpu shards by itself (per worker, by file or by position); tf.distribute must not.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if threadpool_size:
        options.threading.private_threadpool_size = threadpool_size
    return options


@dataclass(frozen=True)
class PipelineConfig:
    """The pipeline's knobs, a slice of the run's Config."""

    image_size: int
    seed: int = 0
    deterministic: bool = False
    random_flip: bool = True
    crop_min_area: float = 0.08
    eval_crop_fraction: float = 0.875
    shuffle_buffer: int = 10_000
    cycle_length: int = 8
    block_length: int = 1
    threadpool_size: int = 0
    ram_budget_mb: int = 0
    cache_eval: bool = False


def _window_to_crop(begin, size):
    return tf.stack([begin[0], begin[1], size[0], size[1]])


def _decode_crop(encoded: tf.Tensor, crop_window_fn) -> tf.Tensor:
    """Decodes only the window ``crop_window_fn(shape)`` picks: fused for JPEG, sliced otherwise."""

    def jpeg():
        window = crop_window_fn(tf.image.extract_jpeg_shape(encoded))
        return tf.image.decode_and_crop_jpeg(encoded, window, channels=3)

    def other():
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        window = crop_window_fn(tf.shape(image))
        return tf.slice(image, [window[0], window[1], 0], [window[2], window[3], 3])

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def _resize_uint8(image: tf.Tensor, image_size: int) -> tf.Tensor:
    resized = tf.image.resize(image, [image_size, image_size], method="bilinear")
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)


def example_seed(seed: int, epoch: tf.Tensor, position: tf.Tensor) -> tf.Tensor:
    """The stateless seed of one example: a function of (seed, epoch, position) only."""
    epoch = tf.cast(epoch, tf.int64)
    return tf.stack([tf.cast(seed, tf.int64) * 1_000_003 + epoch, tf.cast(position, tf.int64)])


def random_crop_window(shape, seed, min_area: float):
    """Random-resized-crop window (Inception style) ``[y, x, h, w]`` for an image ``shape``."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(min_area, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return _window_to_crop(begin, size)


def center_crop_window(shape, crop_fraction: float):
    """The central square of ``crop_fraction`` of the shorter side (resized afterwards)."""
    height, width = shape[0], shape[1]
    side = tf.cast(crop_fraction * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def preprocess_train(serialized, epoch, position, cfg: PipelineConfig, label_offset: int):
    """One training record -> {image uint8 [S,S,3], label, flip}."""
    example = records.parse_example(serialized, label_offset)
    seed = example_seed(cfg.seed, epoch, position)
    crop = _decode_crop(example["encoded"], lambda s: random_crop_window(s, seed, cfg.crop_min_area))
    flip = tf.random.stateless_uniform([], seed=seed + [0, 1 << 40]) < 0.5
    return {
        "image": _resize_uint8(crop, cfg.image_size),
        "label": example["label"],
        "flip": tf.logical_and(flip, cfg.random_flip),
    }


def preprocess_eval(serialized, cfg: PipelineConfig, label_offset: int):
    """One evaluation record -> {image uint8 [S,S,3], label, weight=1}."""
    example = records.parse_example(serialized, label_offset)
    window_fn = lambda s: center_crop_window(s, cfg.eval_crop_fraction)  # noqa: E731
    crop = _decode_crop(example["encoded"], window_fn)
    return {
        "image": _resize_uint8(crop, cfg.image_size),
        "label": example["label"],
        "weight": tf.constant(1.0),
    }


def _records(files, cfg: PipelineConfig, epoch_seed=None) -> tf.data.Dataset:
    """Parallel interleave over ``files``, their order shuffled by ``epoch_seed`` when given."""
    names = tf.constant(list(files))
    if epoch_seed is not None:
        names = tf.random.experimental.stateless_shuffle(names, seed=epoch_seed)
    return tf.data.Dataset.from_tensor_slices(names).interleave(
        lambda f: tf.data.TFRecordDataset(f, buffer_size=8 << 20),
        cycle_length=min(cfg.cycle_length, len(files)),
        block_length=cfg.block_length,
        num_parallel_calls=AUTOTUNE,
        deterministic=cfg.deterministic,
    )


def _block_shuffle(ds: tf.data.Dataset, size: int, epoch_seed) -> tf.data.Dataset:
    """Shuffles within consecutive blocks of ``size`` records, statelessly.

    Written by hand because ``Dataset.shuffle`` cannot take a per-epoch tensor seed while a
    global seed is set; a stateless shuffle makes epoch k the same whether or not the run
    was restarted before it (exact resume without replaying earlier epochs).
    """
    blocks = ds.batch(size).enumerate()
    return blocks.flat_map(
        lambda i, block: tf.data.Dataset.from_tensor_slices(
            tf.random.experimental.stateless_shuffle(block, seed=epoch_seed + [0, i + 1])
        )
    )


def make_train_dataset(
    spec: DataSpec,
    cfg: PipelineConfig,
    shard: InputShard,
    batch_size: int,
    global_batch_size: int,
    start_index: int = 0,
) -> tf.data.Dataset:
    """The endless training stream of one input pipeline, batched ``batch_size`` per replica.

    With ``cfg.deterministic`` (or fewer files than pipelines) every pipeline reads the same
    global order and keeps its own contiguous slice of each global batch, so the examples of
    an update do not depend on the number of workers; otherwise each pipeline reads its own
    files. ``start_index`` global examples are skipped (resume).
    """
    files = spec.train_files
    by_file = not cfg.deterministic and len(files) >= shard.count
    if by_file:
        files = files[shard.index :: shard.count]

    def one_epoch(epoch):
        epoch_seed = tf.stack([tf.cast(cfg.seed, tf.int64), epoch * 1_000_003])
        records_ds = _records(files, cfg, epoch_seed)
        if cfg.shuffle_buffer > 1:
            records_ds = _block_shuffle(records_ds, cfg.shuffle_buffer, epoch_seed)
        return records_ds.enumerate().map(lambda pos, rec: (epoch, pos, rec))

    epoch_size = spec.num_train // (shard.count if by_file else 1)
    first_epoch = start_index // max(epoch_size, 1)
    ds = tf.data.Dataset.counter(first_epoch).flat_map(one_epoch)
    ds = ds.skip(start_index - first_epoch * epoch_size)
    if not by_file and shard.count > 1:
        per_pipeline = global_batch_size // shard.count
        ds = ds.enumerate().filter(
            lambda i, _: (i % global_batch_size) // per_pipeline == shard.index
        )
        ds = ds.map(lambda _, element: element)
    ds = ds.map(
        lambda epoch, pos, rec: preprocess_train(rec, epoch, pos, cfg, spec.label_offset),
        num_parallel_calls=AUTOTUNE,
        deterministic=cfg.deterministic,
    )
    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.prefetch(AUTOTUNE)
    return ds.with_options(_options(cfg.deterministic, cfg.threadpool_size, cfg.ram_budget_mb))


def eval_steps(num_examples: int, global_batch_size: int) -> int:
    """Steps that cover every evaluation example once (the last one padded)."""
    return -(-num_examples // global_batch_size)


def make_eval_dataset(
    spec: DataSpec, cfg: PipelineConfig, shard: InputShard, batch_size: int, global_batch_size: int
) -> tf.data.Dataset:
    """Each evaluation example exactly once across pipelines, padded with weight-0 examples to
    ``eval_steps`` full batches per replica."""
    ds = _records(spec.eval_files, cfg)
    if shard.count > 1:
        ds = ds.shard(shard.count, shard.index)
    ds = ds.map(
        lambda rec: preprocess_eval(rec, cfg, spec.label_offset), num_parallel_calls=AUTOTUNE
    )
    if cfg.cache_eval:
        ds = ds.cache()
    padding = {
        "image": tf.zeros([cfg.image_size, cfg.image_size, 3], tf.uint8),
        "label": tf.constant(0, tf.int32),
        "weight": tf.constant(0.0),
    }
    per_pipeline = eval_steps(spec.num_eval, global_batch_size) * (global_batch_size // shard.count)
    ds = ds.concatenate(tf.data.Dataset.from_tensors(padding).repeat()).take(per_pipeline)
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(AUTOTUNE)
    return ds.with_options(_options(True, cfg.threadpool_size, cfg.ram_budget_mb))


def make_synthetic_dataset(batch_size: int, image_size: int, num_classes: int) -> tf.data.Dataset:
    """One fixed random batch, repeated: times the model and the step without any I/O."""
    images = tf.random.stateless_uniform(
        [batch_size, image_size, image_size, 3], seed=[0, 1], maxval=256, dtype=tf.int32
    )
    batch = {
        "image": tf.cast(images, tf.uint8),
        "label": tf.random.stateless_uniform(
            [batch_size], seed=[0, 2], maxval=num_classes, dtype=tf.int32
        ),
        "flip": tf.zeros([batch_size], tf.bool),
    }
    return tf.data.Dataset.from_tensors(batch).repeat().prefetch(AUTOTUNE)
