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

from dataclasses import dataclass

import tensorflow as tf

from tfgpu import image_ops, preprocess
from tfgpu.data_sources import (  # noqa: F401  (re-exported: the pipeline's public names)
    DataError,
    DataSpec,
    count_records,
    load_data_spec,
    load_tfds_spec,
)
from tfgpu.distribute import InputShard
from tfgpu.image_ops import center_crop_window, example_seed, random_crop_window  # noqa: F401

AUTOTUNE = tf.data.AUTOTUNE


def dataset_options(
    deterministic: bool, threadpool_size: int, ram_budget_mb: int
) -> tf.data.Options:
    """The tf.data.Options of every tfgpu pipeline (the benchmark gives them to its ceiling too)."""
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
    # Parallelism comes from the map's many examples at once; splitting one example's resize
    # across threads as well only adds hand-offs (measured: -4% host CPU per image).
    options.threading.max_intra_op_parallelism = 1
    return options


@dataclass(frozen=True)
class PipelineConfig:
    """The pipeline's knobs, a slice of the run's Config."""

    image_size: int
    seed: int = 0
    deterministic: bool = False
    random_flip: bool = True
    crop_min_area: float = 0.08
    dct_scaled_decode: bool = False  # large windows decoded at 1/2-1/8 scale (decode_crop)
    eval_crop_fraction: float = 0.875
    shuffle_buffer: int = 10_000
    cycle_length: int = 8
    block_length: int = 1
    threadpool_size: int = 0
    ram_budget_mb: int = 0
    cache_eval: bool = False
    eval_snapshot_dir: str = ""  # decoded eval crops written once, read by later runs
    skip_truncated: bool = False  # read truncated shards up to the break instead of failing
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    preprocess_on: str = "device"  # or "host": the float work in tf.data (see preprocess.py)
    resize_on: str = "host"  # or "device": train crops cross un-resized (preprocess.resize_flat)
    randaugment_ops: int = 0
    randaugment_magnitude: float = 0.5


def preprocess_train(example: dict, cfg: PipelineConfig) -> dict:
    """One training example {epoch, position, encoded, label, valid} (``_train_records``) ->
    {image uint8 [S,S,3], label, flip, weight (0: broken image)} plus, with MixUp/CutMix, the
    example's mixing draw (``image_ops.draw_mixing``).

    With ``resize_on="device"``, {pixels, sizes [2] (h, w)} of the crop instead of ``image``:
    ``pixels`` are the un-resized crop packed into int64 words (``image_ops.pack_pixels``) and
    wrapped in a scalar variant for ``_flat_batches``; resized on the accelerator
    (``preprocess.resize_flat``)."""
    seed = example_seed(cfg.seed, example["epoch"], example["position"])
    window = lambda s: random_crop_window(s, seed, cfg.crop_min_area)
    min_side = _dct_min_side(cfg)
    encoded, valid = example["encoded"], example["valid"]
    if cfg.resize_on == "device":
        pixels, sizes = image_ops.decode_window_packed(encoded, valid, window, min_side)
        out = {"pixels": _to_variant(pixels), "sizes": sizes}
    else:
        image = image_ops.decode_window_resized(encoded, valid, window, cfg.image_size, min_side)
        out = {"image": image}
    out |= {
        "label": example["label"],
        "flip": tf.logical_and(image_ops.draw_flip(seed), cfg.random_flip),
        "weight": tf.cast(valid, tf.float32),
    }
    if cfg.mixup_alpha > 0 or cfg.cutmix_alpha > 0:
        out.update(image_ops.draw_mixing(seed, cfg.image_size, cfg.mixup_alpha, cfg.cutmix_alpha))
    return out


def _dct_min_side(cfg: PipelineConfig) -> int:
    """``decode_crop``'s ``min_side``: the output size with ``--dct_scaled_decode``, else 0."""
    return cfg.image_size if cfg.dct_scaled_decode else 0


def preprocess_eval(serialized, cfg: PipelineConfig, spec: DataSpec) -> dict:
    """One evaluation record -> {image uint8 [S,S,3], label, weight (0: broken image)}."""
    example = spec.parse(serialized)
    valid = image_ops.looks_whole(example["encoded"])
    image = image_ops.decode_window_resized(
        example["encoded"],
        valid,
        lambda s: center_crop_window(s, cfg.eval_crop_fraction),
        cfg.image_size,
        _dct_min_side(cfg),
    )
    return {"image": image, "label": example["label"], "weight": tf.cast(valid, tf.float32)}


def _records(files, cfg: PipelineConfig, epoch_seed=None) -> tf.data.Dataset:
    """Parallel interleave over ``files``, their order shuffled by ``epoch_seed`` when given."""
    names = tf.constant(list(files))
    if epoch_seed is not None:
        names = tf.random.experimental.stateless_shuffle(names, seed=epoch_seed)

    def read(name):
        # 1 MB reads: an 8 MB buffer cost +0.02 ms of host CPU per record (cache misses).
        ds = tf.data.TFRecordDataset(name, buffer_size=1 << 20)
        # load_data_spec has already named truncated shards; here they end at the break.
        return ds.ignore_errors() if cfg.skip_truncated else ds

    return tf.data.Dataset.from_tensor_slices(names).interleave(
        read,
        cycle_length=min(cfg.cycle_length, len(files)),
        block_length=cfg.block_length,
        num_parallel_calls=AUTOTUNE,
        deterministic=cfg.deterministic,
    )


def _blocks(ds, size: int, epoch_seed, shuffle: bool, spec: DataSpec) -> tf.data.Dataset:
    """One epoch's records as (block index, block of up to ``size`` parsed examples
    {encoded, label, valid}), each block shuffled statelessly when ``shuffle``.

    A hand-made block shuffle because ``Dataset.shuffle`` draws from a stateful generator: a
    stateless one makes epoch k the same whether or not the run was restarted before it (exact
    resume without replaying earlier epochs). Whole blocks are the unit so that the caller can
    prefetch the next one (see ``_train_records``), and so that parsing and the byte check run
    once per block, vectorized (measured: 5-8% more images/s than one record at a time).
    """

    def parsed(i, block):
        example = spec.parse(block)
        example["valid"] = image_ops.looks_whole(example["encoded"])
        if shuffle:
            order = tf.range(tf.shape(block)[0])
            order = tf.random.experimental.stateless_shuffle(order, seed=epoch_seed + [0, i + 1])
            example = {k: tf.gather(v, order) for k, v in example.items()}
        return i, example

    return ds.batch(size).enumerate().map(parsed)


def _train_records(files, cfg: PipelineConfig, spec: DataSpec, first_epoch) -> tf.data.Dataset:
    """The endless stream of examples {epoch, position in the epoch, encoded, label, valid}
    from ``first_epoch`` on.

    Blocks are read and shuffled one ahead of the decoder (``prefetch(1)`` outside the
    per-epoch ``flat_map``): without it, the decoders sat idle while each block, and above all
    each epoch's first block, was read (a stall of ``shuffle_buffer`` reads; measured 10-30%
    of throughput with 1,000-image epochs). Costs one more block of encoded records in RAM.
    """
    size = max(cfg.shuffle_buffer, 256)

    def one_epoch(epoch):
        epoch_seed = tf.stack([tf.cast(cfg.seed, tf.int64), epoch * 1_000_003])
        records = _records(files, cfg, epoch_seed)
        blocks = _blocks(records, size, epoch_seed, cfg.shuffle_buffer > 1, spec)
        return blocks.map(lambda i, block: (epoch, i, block))

    def examples_of(epoch, i, block):
        count = tf.shape(block["label"], out_type=tf.int64)[0]
        positions = tf.range(count) + i * size  # blocks are full except an epoch's last
        return tf.data.Dataset.from_tensor_slices(
            {"epoch": tf.fill([count], epoch), "position": positions, **block}
        )

    blocks = tf.data.Dataset.counter(first_epoch).flat_map(one_epoch)
    return blocks.prefetch(1).flat_map(examples_of)


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
    if cfg.mixup_alpha > 0 or cfg.cutmix_alpha > 0:
        preprocess.check_mixing_batch(batch_size)
    files = spec.train_files
    by_file = not cfg.deterministic and len(files) >= shard.count
    if by_file:
        files = files[shard.index :: shard.count]

    epoch_size = spec.num_train // (shard.count if by_file else 1)
    first_epoch = start_index // max(epoch_size, 1)
    ds = _train_records(files, cfg, spec, first_epoch)
    ds = ds.skip(start_index - first_epoch * epoch_size)
    if not by_file and shard.count > 1:
        per_pipeline = global_batch_size // shard.count
        ds = ds.enumerate().filter(
            lambda i, _: (i % global_batch_size) // per_pipeline == shard.index
        )
        ds = ds.map(lambda _, element: element)
    ds = ds.map(
        lambda example: preprocess_train(example, cfg),
        num_parallel_calls=AUTOTUNE,
        deterministic=cfg.deterministic,
    )
    if cfg.resize_on == "device":
        ds = _flat_batches(ds, batch_size, cfg.deterministic)
    else:
        ds = ds.batch(batch_size, drop_remainder=True)
    if cfg.preprocess_on == "host":
        ds = ds.map(preprocess.host_batch_fn(spec.num_classes, cfg), num_parallel_calls=AUTOTUNE)
    ds = ds.prefetch(AUTOTUNE)
    return ds.with_options(
        dataset_options(cfg.deterministic, cfg.threadpool_size, cfg.ram_budget_mb)
    )


def _to_variant(words: tf.Tensor) -> tf.Tensor:
    """A 1-D tensor -> a scalar variant holding it (no copy), so examples of different
    lengths batch like scalars."""
    return tf.raw_ops.RaggedTensorToVariant(
        rt_nested_splits=[], rt_dense_values=words, batched_input=False
    )


def _flat_batches(ds: tf.data.Dataset, batch_size: int, deterministic: bool) -> tf.data.Dataset:
    """Batches examples whose packed ``pixels`` (variants, ``_to_variant``) differ in length:
    the batch's ``pixels`` become one int64 vector, the crops one after the other, no padding
    (``sizes`` say where each crop ends).

    What ``Dataset.ragged_batch`` does, by hand because it is slow here: it copies uint8 byte
    by byte and its concatenation runs on one thread (0.5 ms of host CPU per image, as much as
    the resize it saves). Int64 words, concatenated by a parallel map: ~0.15 (measured,
    bench/README.md). The rows of ``padded_batch`` cost as much and up to 4x the bytes.
    """

    def concat(batch):
        flat = tf.raw_ops.RaggedTensorFromVariant(
            encoded_ragged=batch["pixels"],
            input_ragged_rank=0,
            output_ragged_rank=1,
            Tvalues=tf.int64,
            Tsplits=tf.int64,
        ).output_dense_values
        return {**batch, "pixels": flat}

    ds = ds.batch(batch_size, drop_remainder=True)
    return ds.map(concat, num_parallel_calls=AUTOTUNE, deterministic=deterministic)


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
    ds = ds.map(lambda rec: preprocess_eval(rec, cfg, spec), num_parallel_calls=AUTOTUNE)
    if cfg.eval_snapshot_dir:
        ds = ds.snapshot(cfg.eval_snapshot_dir)
    elif cfg.cache_eval:
        ds = ds.cache()
    padding = {
        "image": tf.zeros([cfg.image_size, cfg.image_size, 3], tf.uint8),
        "label": tf.constant(0, tf.int32),
        "weight": tf.constant(0.0),
    }
    per_pipeline = eval_steps(spec.num_eval, global_batch_size) * (global_batch_size // shard.count)
    ds = ds.concatenate(tf.data.Dataset.from_tensors(padding).repeat()).take(per_pipeline)
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(AUTOTUNE)
    return ds.with_options(dataset_options(True, cfg.threadpool_size, cfg.ram_budget_mb))


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
        "weight": tf.ones([batch_size], tf.float32),
    }
    return tf.data.Dataset.from_tensors(batch).repeat().prefetch(AUTOTUNE)
