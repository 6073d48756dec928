"""The small-dataset path: the train split decoded once into a uint8 array, and every batch cut
from it by a few vectorized ops per batch, not per example.

Small images (CIFAR, digits, MNIST-like) spend most of the per-example path's time in
per-example overhead (parse, decode, crop, resize one image at a time). Here the train split is
decoded once (``load``) into uint8 [N, S + 2p, S + 2p, 3] (padded by p = ``--crop_padding``
already, by reflection), labels and weights; each batch is then one gather of the crops' rows
and a column crop by offset groups (``crop``), with the flip and MixUp/CutMix draws
(``make_train_dataset``). The padded random crop replaces the per-example path's
random-resized crop: it is the usual augmentation of 32x32 data. Reflection, not zeros: a
black band at a random edge is a feature the network must first learn to ignore (tests'
quadrant images: the loss fell 2-4x slower in 40 updates with zeros; reflection learnt as fast
as the per-example path).

The determinism contract is the per-example path's (``pipeline.py``): every choice depends only
on (seed, epoch, position in the epoch). An epoch's order, flips, crop offsets and MixUp/CutMix
draws are drawn once per epoch, as whole vectors, from stateless keys of (seed, epoch), and
indexed by position. Global batches count positions across epoch boundaries as the per-example
path does, and each input pipeline keeps its contiguous part of each global batch, so nothing
depends on the split, and ``start_index`` resumes exactly. The stream is the same with or
without ``--deterministic``: being deterministic costs nothing here.

The array stays in host memory, also with a GPU. tf.data runs on the host, so an array placed
on a GPU would be copied back for every batch; keeping it there needs the step itself to gather
(batches of indices and draws instead of images), which this path does not do. It would save
little: a batch costs ~0.004 ms of host CPU per 32x32 image (bench/small_images.py), so 20,000
images/s (a fast GPU on CIFAR) take <10% of one core and 60 MB/s of uint8 over PCIe.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgpu.data import augment, broken, device_ops, host_ops, pipeline, sampling, rng_streams
from tfgpu.data.spec import DataError, DataSpec
from tfgpu.data.stream import Stream
from tfgpu.distribute import InputShard

AUTOTUNE = tf.data.AUTOTUNE
MB = 1 << 20

# Streams of an epoch's stateless key, one per vector drawn for the whole epoch (the
# policies' draws share the key: rng_streams.AUGMENT).
_ORDER, _FLIP, _CROP, _MIX_KIND, _GAMMA_A, _GAMMA_B, _CUT_Y, _CUT_X, _, _, _ALTERNATING = (
    rng_streams.EPOCH.values()
)


AUTO_MAX_SIDE = 64  # --in_memory=auto takes small images only (CIFAR, digits, MNIST-like)


@dataclass(frozen=True)
class InMemory:
    """A decoded train split, in host memory."""

    images: tf.Tensor  # uint8 [N, S + 2p, S + 2p, 3]: padded by p on every side (reflected)
    labels: tf.Tensor  # int32 [N]
    weights: tf.Tensor  # float32 [N]: 0 for a broken image (no loss, no gradient)
    num_classes: int
    padding: int  # p, the --crop_padding the images were stored with

    @property
    def image_size(self) -> int:
        return int(self.images.shape[1]) - 2 * self.padding

    @property
    def num_examples(self) -> int:
        return int(self.images.shape[0])

    def describe(self) -> str:
        """The start-up line's words: "train split in memory (1,438 images, 5.3 MB)"."""
        mb = self.images.shape.num_elements() / MB  # as stored, padded
        return f"train split in memory ({self.num_examples:,} images, {mb:.1f} MB)"


class Decision(NamedTuple):
    """Whether the train split goes into memory, and why (for the start-up line)."""

    use: bool
    reason: str


def decoded_mb(num_examples: int, image_size: int, padding: int) -> float:
    """MB of ``num_examples`` decoded uint8 RGB images of ``image_size`` squared, stored padded
    by ``padding`` on every side."""
    return num_examples * (image_size + 2 * padding) ** 2 * 3 / MB


def decide(spec: DataSpec, data) -> Decision:
    """What ``load`` will do with ``spec``'s train split under ``data`` (a config.DataConfig),
    decided from the settings and the split's size alone, before anything is decoded."""
    if data.synthetic_data:
        return Decision(False, "synthetic batches")
    mb = decoded_mb(spec.num_train, data.image_size, data.crop_padding)
    size = f"{spec.num_train:,} images, {mb:,.1f} MB"
    if data.in_memory == "off":
        return Decision(False, "train split read per example (--in_memory=off)")
    if data.in_memory == "auto" and data.image_size > AUTO_MAX_SIDE:
        # Its augmentation is the small-image padded crop, not a random-resized crop.
        return Decision(
            False, f"train split read per example (--image_size > {AUTO_MAX_SIDE}; --in_memory=on)"
        )
    if data.in_memory == "auto" and mb > data.in_memory_mb:
        return Decision(
            False, f"train split read per example ({size} > --in_memory_mb={data.in_memory_mb})"
        )
    return Decision(True, f"train split in memory ({size})")


def load(spec: DataSpec, data) -> InMemory | None:
    """``spec``'s train split decoded into host memory when ``decide`` says so, else None.

    Each image is decoded whole and resized to --image_size squared once (an identity when it
    has that size; other aspect ratios are stretched, which suits square small-image sets),
    then stored padded by --crop_padding, by reflection (``reflect_border``).
    An image that fails ``host_ops.looks_whole`` becomes zeros with weight 0, as on the
    per-example path; one that passes and still fails to decode stops the run with
    TensorFlow's error. Records keep the order of the files, then of each file.
    """
    if not decide(spec, data).use:
        return None
    images, labels, weights = _decode_split(spec, data)
    if not len(labels):
        raise DataError(f"{spec.data_dir}: the train split holds no readable examples")
    with tf.device("/cpu:0"):
        return InMemory(
            images=tf.constant(images),
            labels=tf.constant(labels),
            weights=tf.constant(weights),
            num_classes=spec.num_classes,
            padding=data.crop_padding,
        )


def _decode_split(spec: DataSpec, data) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(uint8 [N, S + 2p, S + 2p, 3], int32 [N], float32 [N]) of the train split, decoded by
    tf.data in parallel into one array allocated up front (no second copy at the end)."""
    size, pad = data.image_size, data.crop_padding

    names = tf.constant(list(spec.train_files))
    report = broken.reporter(spec.train_files)

    def read(index):
        ds = tf.data.TFRecordDataset(tf.gather(names, index), buffer_size=1 << 20)
        # load_data_spec has already named truncated shards; here they end at the break.
        ds = ds.ignore_errors() if data.skip_truncated_shards else ds
        return ds.enumerate().map(lambda i, r: (r, broken.origin(index, i)))

    def decode(serialized, origin):
        example = spec.parse(serialized, origin, spec.train_files)
        valid = host_ops.looks_whole(example["encoded"])
        whole = lambda shape: tf.stack([0, 0, shape[0], shape[1]])  # noqa: E731
        image = host_ops.decode_window_resized(example["encoded"], valid, whole, size)
        return image, example["label"], broken.weight(valid, origin, report)

    files = tf.data.Dataset.range(len(spec.train_files))
    ds = files.interleave(read, cycle_length=1, num_parallel_calls=1)  # files in order
    ds = ds.map(decode, num_parallel_calls=AUTOTUNE, deterministic=True)
    ds = ds.batch(1024).prefetch(1)
    images = np.zeros([spec.num_train, size + 2 * pad, size + 2 * pad, 3], np.uint8)
    labels = np.empty([spec.num_train], np.int32)
    weights = np.empty([spec.num_train], np.float32)
    count = 0
    for image, label, weight in ds.as_numpy_iterator():
        end = count + len(label)
        if end > len(labels):  # more records than the spec counted (rare): grow
            grown = max(end, 2 * len(labels))
            images, labels, weights = (
                np.resize(a, (grown, *a.shape[1:])) for a in (images, labels, weights)
            )
            images[count:] = 0
        images[count:end, pad : pad + size, pad : pad + size] = image
        reflect_border(images[count:end], pad)
        labels[count:end], weights[count:end] = label, weight
        count = end
    # Fewer when --skip_truncated_shards stopped a shard early.
    return images[:count], labels[:count], weights[:count]


def reflect_border(images: np.ndarray, pad: int) -> None:
    """Fills, in place, the ``pad``-wide border of images [N, S + 2 pad, S + 2 pad, C] from
    their inner S x S by reflection (``np.pad``'s "reflect": the edge pixel is not repeated)."""
    if not pad:
        return
    k = np.arange(1, pad + 1)
    first, last = pad, images.shape[1] - pad - 1  # the inner image's first and last row/column
    inner = slice(first, last + 1)
    images[:, first - k, inner] = images[:, first + k, inner]
    images[:, last + k, inner] = images[:, last - k, inner]
    images[:, :, first - k] = images[:, :, first + k]
    images[:, :, last + k] = images[:, :, last - k]


def _epoch_key(seed: int, epoch: tf.Tensor, stream: int) -> tf.Tensor:
    """The stateless key of one epoch-wide draw: a function of (seed, epoch) only. The second
    word is negative, so it never equals a ``host_ops.example_seed`` (position >= 0)."""
    return tf.stack([tf.cast(seed, tf.int64) * 1_000_003 + epoch, tf.constant(-stream, tf.int64)])


def epoch_index(epoch, n: int, data, seed: int, sampler: dict | None = None) -> tf.Tensor:
    """int64 [n]: the example at each position of epoch ``epoch``, a permutation drawn from
    (seed, epoch), or with a ``sampler`` (``sampling.class_sampler``) balanced draws."""
    key = lambda stream: _epoch_key(seed, epoch, stream)  # noqa: E731
    if sampler is not None:
        return sampling.balanced_index(key, n, sampler)
    index = tf.range(n, dtype=tf.int64)
    if data.shuffle_buffer > 1:  # as on the per-example path, 0 or 1 keeps the files' order
        index = tf.random.experimental.stateless_shuffle(index, seed=key(_ORDER))
    return index


def epoch_draws(
    epoch, n: int, data, seed: int, sampler=None, index=None, num_examples: int = 0
) -> dict:
    """Everything random of epoch ``epoch``, as vectors over its ``n`` positions: {index of
    the example at each position int64 [n] (``index``, else ``epoch_index``), flip bool [n],
    offset int32 [n, 2] (crop y, x in [0, 2 * --crop_padding]), and with MixUp/CutMix ``mix``
    (``mixing_draws``)}. Drawn once per epoch, from keys of (seed, epoch): position p's draws
    depend on (seed, epoch, p); with --alternating_flips the flips depend on the example
    (``alternating_flips``; ``num_examples``: the split's, when not ``n``)."""
    key = lambda stream: _epoch_key(seed, epoch, stream)  # noqa: E731
    index = epoch_index(epoch, n, data, seed, sampler) if index is None else index
    flip = tf.random.stateless_uniform([n], key(_FLIP)) < 0.5
    if data.alternating_flips:
        flip = tf.gather(alternating_flips(seed, epoch, num_examples or n), index)
    span = 2 * data.crop_padding + 1
    offset = tf.random.stateless_uniform([n, 2], key(_CROP), maxval=span, dtype=tf.int32)
    draws = {"index": index, "flip": tf.logical_and(flip, data.random_flip), "offset": offset}
    if data.mixing:
        draws["mix"] = mixing_draws(key, n, data.image_size, data.mixup_alpha, data.cutmix_alpha)
    return draws | augment.draw(key, [n], data)


def alternating_flips(seed: int, epoch, num_examples: int) -> tf.Tensor:
    """bool [num_examples]: which examples are mirrored in ``epoch`` under --alternating_flips
    (airbench's): a coin per example, drawn once from (seed), says whether it is in even
    epochs; in odd ones the others are. Each image is seen both ways every two epochs."""
    first = tf.random.stateless_uniform([num_examples], _epoch_key(seed, 0, _ALTERNATING)) < 0.5
    return tf.not_equal(first, tf.math.floormod(tf.cast(epoch, tf.int64), 2) == 1)


def mixing_draws(key, n: int, image_size: int, mixup_alpha: float, cutmix_alpha: float) -> dict:
    """``n`` MixUp/CutMix draws {mix_lam [n], cut_box [n, 4], use_cut [n]} (``batches.MixDraws``)
    from the stateless keys ``key(stream)``: the formulas of ``host_ops.draw_mixing``, on
    vectors. Not its values: those come from one seed per example, and stateless random ops
    take one seed per call (a tf.map_fn over each batch cost 0.07 ms of host CPU per image,
    against 0.004 for this whole path; tf.vectorized_map falls back to a slower loop)."""
    if mixup_alpha > 0 and cutmix_alpha > 0:
        use_cut = tf.random.stateless_uniform([n], key(_MIX_KIND)) < 0.5
    else:
        use_cut = tf.fill([n], cutmix_alpha > 0)
    alpha = tf.where(use_cut, max(cutmix_alpha, 1e-3), max(mixup_alpha, 1e-3))
    a = tf.random.stateless_gamma([n], key(_GAMMA_A), alpha=alpha)
    b = tf.random.stateless_gamma([n], key(_GAMMA_B), alpha=alpha)
    lam = a / tf.maximum(a + b, 1e-12)  # Beta(alpha, alpha)
    side = float(image_size)
    half = side * tf.sqrt(1.0 - lam) / 2
    cy = tf.random.stateless_uniform([n], key(_CUT_Y)) * side
    cx = tf.random.stateless_uniform([n], key(_CUT_X)) * side
    corners = tf.stack([cy - half, cx - half, cy + half, cx + half], axis=1)
    box = tf.cast(tf.round(tf.clip_by_value(corners, 0, side)), tf.int32)
    area = tf.cast((box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1]), tf.float32) / side**2
    return {
        "mix_lam": tf.where(use_cut, 1.0 - area, lam),
        "cut_box": tf.where(use_cut[:, None], box, 0),
        "use_cut": use_cut,
    }


def _draw_batches(
    n: int, data, seed: int, batch_size: int, start_index: int, sampler=None, repeats=1, chunk=1
) -> tf.data.Dataset:
    """The endless stream of ``epoch_draws`` cut into batches of ``batch_size`` positions from
    global position ``start_index`` on: positions run on across epoch boundaries, as the
    per-example path counts them (a batch may end one epoch and begin the next). With
    ``repeats`` > 1 an epoch has ``repeats`` x n positions, laid out by chunks of ``chunk``
    (``sampling.repeated_index``)."""
    m = n * repeats
    first_epoch, skip = divmod(start_index, m)
    source = lambda e: epoch_index(e, n, data, seed, sampler)  # noqa: E731

    def epoch(e):
        begin = tf.where(e == first_epoch, skip, 0)
        index = None if repeats == 1 else sampling.repeated_index(e, n, repeats, chunk, source)
        draws = epoch_draws(e, m, data, seed, sampler, index, num_examples=n)
        return tf.nest.map_structure(lambda v: v[begin:], draws)

    # rebatch cuts the epochs' vectors into batches with slice copies, not row by row.
    return tf.data.Dataset.counter(first_epoch).map(epoch).rebatch(batch_size, drop_remainder=True)


def crop(images: tf.Tensor, index: tf.Tensor, offsets: tf.Tensor, size: int) -> tf.Tensor:
    """images [N, S + 2p, S + 2p, C] (padded), index int [B], offsets int [B, 2] in [0, 2p] ->
    [B, S, S, C] with S = ``size``: image ``index[i]`` cropped at its offset (y, x).

    One gather of whole rows (the crop's S rows of each image), then the columns: examples
    grouped by their x offset (2p + 1 groups), each group one slice. Per-pixel gathers, or a
    pad of each batch, cost 2-3x more (measured: 0.5 against 1.5 ms per batch of 128 at 32x32).
    """
    side = images.shape[1]
    if side == size:
        return tf.gather(images, index)
    count = tf.shape(index)[0]
    rows = tf.reshape(images, [-1, side, images.shape[3]])  # every image's rows, one after another
    row = tf.cast(index, tf.int64)[:, None] * side + tf.cast(offsets[:, :1], tf.int64)
    picked = tf.gather(rows, tf.reshape(row + tf.range(size, dtype=tf.int64)[None], [-1]))
    picked = tf.reshape(picked, [count, size, side, images.shape[3]])
    groups = side - size + 1
    x = tf.cast(offsets[:, 1], tf.int32)
    parts = tf.dynamic_partition(picked, x, groups)
    where = tf.dynamic_partition(tf.range(count), x, groups)
    return tf.dynamic_stitch(where, [part[:, :, o : o + size] for o, part in enumerate(parts)])


def cut_batch(arrays, draws: dict, size: int) -> dict:
    """(images, labels, weights) of the whole split and one batch of ``epoch_draws`` -> a
    "uint8" batch (``batches.TrainBatch``) of ``size`` squared crops: image, label, flip,
    weight, and ``mix`` draws when MixUp/CutMix are on."""
    images, labels, weights = arrays
    index = draws["index"]
    batch = {
        "image": crop(images, index, draws["offset"], size),
        "label": tf.gather(labels, index),
        "flip": draws["flip"],
        "weight": tf.gather(weights, index),
    }
    for name in ("mix", "augment", "erase"):
        if name in draws:
            batch[name] = draws[name]
    return batch


def packed(batch: dict) -> dict:
    """A "uint8" batch as a "packed" one (``batches.PackedTrainBatch``) for a step built for
    ``--resize_on=device``: every image packed whole (``host_ops.pack_pixels``'s words, one
    image after the other) with its size; the step's resize from S to S leaves pixels as
    they are."""
    image = batch["image"]
    count, side = tf.shape(image)[0], image.shape[1]
    flat = tf.reshape(image, [count, side * side * 3])
    flat = tf.pad(flat, [[0, 0], [0, -(side * side * 3) % (3 * host_ops.WORD_PIXELS)]])
    words = tf.bitcast(tf.reshape(flat, [-1, 8]), tf.int64)
    rest = {k: v for k, v in batch.items() if k != "image"}
    return {**rest, "pixels": tf.reshape(words, [-1]), "sizes": tf.fill([count, 2], side)}


def make_train_dataset(mem: InMemory, data, shard: InputShard, stream: Stream) -> tf.data.Dataset:
    """The endless training stream of one input pipeline from ``mem``, batched
    ``stream.batch_size`` per replica in the layout ``pipeline.train_layout(data)`` names: the
    contract of ``pipeline.make_train_dataset`` (``TrainReader``).

    Each of ``shard.count`` pipelines keeps its contiguous part of every global batch (the
    replica batches ``shard.index * k .. + k - 1`` of it, k = global / (batch_size x count)),
    whatever ``stream.deterministic`` says: the stream is deterministic either way, at no
    cost. ``stream.start_index`` global examples are skipped (resume); ``stream.repeats``: each
    example that many times (``sampling.py``).
    """
    if (mem.padding, mem.image_size) != (data.crop_padding, data.image_size):
        raise ValueError(
            f"the split was loaded for --crop_padding={mem.padding} --image_size="
            f"{mem.image_size}, not {data.crop_padding} and {data.image_size}"
        )
    if data.mixing:
        device_ops.check_mixing_batch(stream.batch_size)
    sampler = sampling.class_sampler(mem, data.sampling_power) if data.balanced_sampling else None
    sampling.check(stream.repeats, stream.global_batch_size, mem.num_examples)
    n, chunk = mem.num_examples, stream.global_batch_size
    draws = _draw_batches(
        n, data, stream.seed, stream.batch_size, stream.start_index, sampler, stream.repeats, chunk
    )
    if shard.count > 1:
        draws = sampling.slice_of_each_batch(
            draws, stream.global_batch_size // stream.batch_size, shard
        )
    # The array enters as a dataset element (from_tensors, repeated: no copy), not as a
    # constant captured by the map function, which would be serialized into its graph.
    arrays = tf.data.Dataset.from_tensors((mem.images, mem.labels, mem.weights)).repeat()
    ds = tf.data.Dataset.zip(arrays, draws).map(
        lambda a, d: cut_batch(a, d, data.image_size),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )
    layout = pipeline.train_layout(data)
    if layout == "packed":
        ds = ds.map(packed, num_parallel_calls=AUTOTUNE)
    elif layout == "float":
        ds = ds.map(
            device_ops.host_batch_fn("uint8", mem.num_classes, data), num_parallel_calls=AUTOTUNE
        )
    ds = ds.prefetch(AUTOTUNE)
    return ds.with_options(pipeline.dataset_options(True, data))
