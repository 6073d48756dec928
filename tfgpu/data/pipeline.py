"""TFRecords -> uint8 batches on the host, in the order of TF's official ResNet input function.

Train: files (shuffled per epoch) -> parallel interleave -> shuffle blocks -> [shard] ->
parallel map(decode the crop window, resize) -> batch -> prefetch.
Eval: the same, without randomness, with a center crop, each example once, padded with
weight-0 examples so every replica and worker runs the same number of steps.

Every function takes ``data``, the run's ``config.DataConfig`` as it is, and the run-wide
``seed`` and ``deterministic``. Randomness is drawn on the host from stateless seeds keyed by
(seed, epoch, position in the epoch), so what an example becomes never depends on how the
global batch is split. The host only draws the dice; the float work (flip, cast, the
augmentation policy, MixUp/CutMix) runs on the accelerator, see ``device_ops.py``.
"""

import os

import tensorflow as tf

from tfgpu.data import augment, broken, dct, device_ops, host_ops, packing, records, sampling
from tfgpu.data.spec import DataSpec
from tfgpu.data.stream import Stream
from tfgpu.distribute import InputShard

AUTOTUNE = tf.data.AUTOTUNE


def train_layout(data) -> str:
    """The layout (``batches.TRAIN_LAYOUTS``) of the train batches ``data`` makes."""
    if data.preprocess_on == "host":
        return "float"
    return _crops_layout(data)


def _crops_layout(data) -> str:
    """What the per-example map makes: packed crops (resized in the step) or resized ones."""
    return "packed" if data.resize_on == "device" else "uint8"


def dataset_options(deterministic: bool, data) -> tf.data.Options:
    """The tf.data.Options of every tfgpu pipeline (the benchmark gives them to its ceiling too)."""
    options = tf.data.Options()
    options.deterministic = deterministic
    options.autotune.enabled = True
    if data.ram_budget_mb:
        options.autotune.ram_budget = data.ram_budget_mb * 1024 * 1024
    options.experimental_optimization.map_parallelization = True
    options.experimental_optimization.parallel_batch = True
    # tfgpu shards by itself (per worker, by file or by position); tf.distribute must not.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if data.data_threads:
        options.threading.private_threadpool_size = data.data_threads
    # Parallelism comes from the map's many examples at once; splitting one example's resize
    # across threads as well only adds hand-offs (measured: -4% host CPU per image).
    options.threading.max_intra_op_parallelism = 1
    return options


def decode_train_example(example: dict, data, seed: int, report=None) -> dict:
    """One training example {epoch, position, encoded, label, valid}
    (``records.train_examples``) -> one row of a "uint8" batch {image uint8 [S,S,3], label,
    flip, weight (0: broken image)} or, with ``--resize_on=device``, of a "packed" one
    {pixels, sizes [2] (h, w), ...}: ``pixels`` are the un-resized crop's uint8 pixels, flat,
    wrapped in a scalar variant for ``packing.flat_batches`` (which packs the batch into int64
    words). With MixUp/CutMix, also the example's ``mix`` draws (``host_ops.draw_mixing``);
    with a policy or erasing, its ``augment`` and ``erase`` draws (``augment.draw``)."""
    example_seed = host_ops.example_seed(seed, example["epoch"], example["position"])
    window = lambda s: host_ops.random_crop_window(s, example_seed, data.crop_min_area)
    scaled = _dct(data)
    encoded, valid = example["encoded"], example["valid"]
    if data.resize_on == "device":
        pixels, sizes = host_ops.decode_window_packed(encoded, valid, window, **scaled)
        out = {"pixels": packing.to_variant(pixels), "sizes": sizes}
    else:
        image = host_ops.decode_window_resized(encoded, valid, window, data.image_size, **scaled)
        out = {"image": image}
    out |= {
        "label": example["label"],
        "flip": tf.logical_and(_flip(example, example_seed, data, seed), data.random_flip),
        "weight": broken.weight(valid, example["origin"], report),
    }
    if data.mixing:
        out["mix"] = host_ops.draw_mixing(
            example_seed, data.image_size, data.mixup_alpha, data.cutmix_alpha
        )
    return out | augment.draw(host_ops.stream_keys(example_seed), [], data)


def _flip(example: dict, example_seed, data, seed: int) -> tf.Tensor:
    """Whether the example is mirrored: a coin of its seed, or with --alternating_flips
    every other epoch (``host_ops.alternating_flip``)."""
    if data.alternating_flips:
        return host_ops.alternating_flip(seed, example["epoch"], example["origin"])
    return host_ops.draw_flip(example_seed)


def _dct(data) -> dict:
    """``decode_crop``'s ``min_side`` (the output size with ``--dct_scaled_decode``, else 0)
    and ``dct_mode``."""
    on = data.dct_scaled_decode != "off"
    return {"min_side": data.image_size if on else 0, "dct_mode": data.dct_scaled_decode}


def decode_eval_image(encoded: tf.Tensor, data) -> tuple:
    """Evaluation's preprocessing of one encoded image (the one function of it: evaluation,
    ``tfgpu.evaluate`` and ``tfgpu.predict`` all call it): (uint8 [S,S,3] center crop resized,
    valid: ``host_ops.looks_whole``; zeros when not)."""
    valid = host_ops.looks_whole(encoded)
    image = host_ops.decode_window_resized(
        encoded,
        valid,
        lambda s: host_ops.center_crop_window(s, data.eval_crop_fraction),
        data.image_size,
        **_dct(data),
    )
    return image, valid


def decode_eval_example(record: dict, data, spec: DataSpec, report=None) -> dict:
    """One evaluation record {record, origin} -> one row of an ``EvalBatch`` {image uint8
    [S,S,3], label, weight (0: broken image, named by ``report``)}."""
    example = spec.parse(record["record"], records.origin(record), spec.eval_files)
    image, valid = decode_eval_image(example["encoded"], data)
    weight = broken.weight(valid, records.origin(record), report)
    return {"image": image, "label": example["label"], "weight": weight}


def make_named_eval_dataset(spec: DataSpec, data, batch_size: int) -> tf.data.Dataset:
    """The evaluation files of ``spec``, each record once, in order, preprocessed as evaluation
    does, batched: {image, valid, label, name (the stored file name, else "shard#index")}
    (``tfgpu.predict``, the report's gallery)."""
    names = tf.constant([os.path.basename(f) for f in spec.eval_files])
    feature = {"image/filename": tf.io.FixedLenFeature([], tf.string, default_value="")}

    def decode(record):
        example = spec.parse(record["record"], records.origin(record), spec.eval_files)
        image, valid = decode_eval_image(example["encoded"], data)
        stored = b""
        if spec.parser is None:  # tfgpu's (and TF's ImageNet) schema holds the file name
            stored = tf.io.parse_single_example(record["record"], feature)["image/filename"]
        origin = records.origin(record)
        where = tf.strings.join(
            [
                tf.gather(names, tf.bitwise.right_shift(origin, 32)),
                "#",
                tf.strings.as_string(tf.bitwise.bitwise_and(origin, 0xFFFFFFFF)),
            ]
        )
        name = tf.where(tf.equal(stored, b""), where, stored)
        return {"image": image, "valid": valid, "label": example["label"], "name": name}

    data = dct.resolved(data, spec.eval_sides, train=False)
    ds = records.read(spec.eval_files, data, deterministic=True)
    ds = ds.map(decode, num_parallel_calls=AUTOTUNE).batch(batch_size).prefetch(AUTOTUNE)
    return ds.with_options(dataset_options(True, data))


def make_train_dataset(
    spec: DataSpec, data, shard: InputShard, stream: Stream, *, name_broken: bool = True
) -> tf.data.Dataset:
    """The endless training stream of one input pipeline, batched ``stream.batch_size`` per
    replica, in the layout ``train_layout(data)`` names (``TrainReader``). Broken records get
    weight 0 and, with ``name_broken``, a warning naming each once (``broken.py``; not
    possible where the pipeline runs in another process, e.g. a tf.data service worker).

    With ``stream.deterministic`` (or fewer files than pipelines) every pipeline reads the same
    global order and keeps its own contiguous slice of each global batch, so the examples of
    an update do not depend on the number of workers; otherwise each pipeline reads its own
    files. ``stream.start_index`` global examples are skipped (resume); ``stream.repeats``: each
    example that many times (``sampling.py``).
    """
    if data.mixing:
        device_ops.check_mixing_batch(stream.batch_size)
    data = dct.resolved(data, spec.train_sides, train=True)
    files = spec.train_files
    by_file = not stream.deterministic and len(files) >= shard.count
    if by_file:
        files = files[shard.index :: shard.count]

    epoch_size = spec.num_train // (shard.count if by_file else 1)
    chunk = stream.global_batch_size // (shard.count if by_file else 1)  # --repeated_augment's unit
    sampling.check(stream.repeats, chunk, epoch_size)
    source_start, rest = sampling.split_start(stream.start_index, chunk, stream.repeats)
    first_epoch = source_start // max(epoch_size, 1)
    ds = records.train_examples(files, data, spec, first_epoch, stream.seed, stream.deterministic)
    ds = ds.skip(source_start - first_epoch * epoch_size)
    ds = sampling.repeat_examples(ds, stream.repeats, chunk).skip(rest)
    if not by_file and shard.count > 1:
        ds = sampling.slice_of_each_batch(ds, stream.global_batch_size, shard)
    report = broken.reporter(files) if name_broken else None
    ds = ds.map(
        lambda example: decode_train_example(example, data, stream.seed, report),
        num_parallel_calls=AUTOTUNE,
        deterministic=stream.deterministic,
    )
    return _batched(ds, spec, data, stream.batch_size, stream.deterministic)


def _batched(ds, spec: DataSpec, data, batch_size: int, deterministic: bool) -> tf.data.Dataset:
    """Decoded train examples -> prefetched batches of ``batch_size`` in the train layout
    (packed crops, uint8 crops, or floats preprocessed on the host)."""
    if _crops_layout(data) == "packed":
        ds = packing.flat_batches(ds, batch_size, deterministic)
    else:
        ds = ds.batch(batch_size, drop_remainder=True)
    if data.preprocess_on == "host":
        host = device_ops.host_batch_fn(_crops_layout(data), spec.num_classes, data)
        ds = ds.map(host, num_parallel_calls=AUTOTUNE)
    ds = ds.prefetch(AUTOTUNE)
    return ds.with_options(dataset_options(deterministic, data))


def eval_steps(num_examples: int, global_batch_size: int) -> int:
    """Steps that cover every evaluation example once (the last one padded)."""
    return -(-num_examples // global_batch_size)


def make_eval_dataset(
    spec: DataSpec, data, shard: InputShard, *, batch_size: int, global_batch_size: int
) -> tf.data.Dataset:
    """Each evaluation example exactly once across pipelines, padded with weight-0 examples to
    ``eval_steps`` full batches per replica (``batches.EvalBatch``)."""
    data = dct.resolved(data, spec.eval_sides, train=False)
    ds = records.read(spec.eval_files, data, deterministic=True)
    if shard.count > 1:
        ds = ds.shard(shard.count, shard.index)
    report = broken.reporter(spec.eval_files)
    ds = ds.map(lambda r: decode_eval_example(r, data, spec, report), num_parallel_calls=AUTOTUNE)
    if data.eval_snapshot_dir:
        ds = ds.snapshot(data.eval_snapshot_dir)
    elif data.cache_eval:
        ds = ds.cache()
    padding = {
        "image": tf.zeros([data.image_size, data.image_size, 3], tf.uint8),
        "label": tf.constant(0, tf.int32),
        "weight": tf.constant(0.0),
    }
    per_pipeline = eval_steps(spec.num_eval, global_batch_size) * (global_batch_size // shard.count)
    ds = ds.concatenate(tf.data.Dataset.from_tensors(padding).repeat()).take(per_pipeline)
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(AUTOTUNE)
    return ds.with_options(dataset_options(True, data))


def make_synthetic_dataset(batch_size: int, num_classes: int, data) -> tf.data.Dataset:
    """One fixed random "uint8" batch, repeated: times the model and the step without any
    I/O (with MixUp/CutMix and augmentation draws that leave the images as they are, when
    those are on)."""
    size = data.image_size
    images = tf.random.stateless_uniform(
        [batch_size, size, size, 3], seed=[0, 1], maxval=256, dtype=tf.int32
    )
    batch = {
        "image": tf.cast(images, tf.uint8),
        "label": tf.random.stateless_uniform(
            [batch_size], seed=[0, 2], maxval=num_classes, dtype=tf.int32
        ),
        "flip": tf.zeros([batch_size], tf.bool),
        "weight": tf.ones([batch_size], tf.float32),
    }
    if data.mixing:
        batch["mix"] = {
            "mix_lam": tf.ones([batch_size]),
            "cut_box": tf.zeros([batch_size, 4], tf.int32),
            "use_cut": tf.zeros([batch_size], tf.bool),
        }
    batch |= augment.identity_draws(batch_size, data)
    return tf.data.Dataset.from_tensors(batch).repeat().prefetch(AUTOTUNE)
