"""The float work on a batch: pure tensor -> tensor functions, run inside the train step on
the accelerator (``--preprocess_on=device``, the default) or as a tf.data map (``host``).

Batches arrive as uint8 (a quarter of float32's host-to-device traffic) with the random
choices already drawn on the host (``host_ops.py``: flip, MixUp/CutMix draws; ``augment.py``:
the policy's ops and arguments, erase boxes), so what an example becomes depends only on
(seed, epoch, position); here they are applied.
Normalization belongs to the model (its first layer), so exported models take plain pixels.
With ``--resize_on=device`` the training crops arrive un-resized (the "packed" layout of
``batches.PackedTrainBatch``) and the bilinear resize runs here too, first (``resize_flat``).

MixUp/CutMix partners: example ``2k`` mixes with ``2k+1`` of the same batch (and vice versa).
Global batches are split across workers, replicas and micro-batches at even positions (the
per-replica batch must be even, ``check_mixing_batch``) and mixing runs before the step splits
micro-batches, so pairs never depend on the split.
"""

import tensorflow as tf

from tfgpu.batches import PackedTrainBatch, TrainBatch
from tfgpu.data import augment, host_ops


def apply_flip(images: tf.Tensor, flip: tf.Tensor) -> tf.Tensor:
    """Mirrors left-right the images of a batch [N, H, W, C] whose ``flip`` [N] is true."""
    return tf.where(flip[:, None, None, None], tf.reverse(images, axis=[2]), images)


def to_float(images: tf.Tensor) -> tf.Tensor:
    """uint8 (or float) [0, 255] -> float32 [0, 255]; the model's first layer normalizes."""
    return tf.cast(images, tf.float32)


def unpack_rgb(words: tf.Tensor) -> tf.Tensor:
    """int64 words (``host_ops.pack_pixels``) -> uint8 [P, 3], one RGB pixel per row."""
    return tf.reshape(tf.bitcast(words, tf.uint8), [-1, 3])


def resize_flat(words: tf.Tensor, sizes: tf.Tensor, image_size: int) -> tf.Tensor:
    """``--resize_on=device``: a batch of un-resized crops -> float32 [N, S, S, 3] in [0, 255].

    ``words`` int64 [total] are the crops' (h, w, 3) pixels packed one after the other
    (``host_ops.pack_pixels``: each padded to whole 8-pixel groups); ``sizes`` [N, 2] their
    (h, w). Bilinear with half-pixel centers, the arithmetic of TensorFlow's ResizeBilinear
    kernel (``tf.image.resize``) in float32, as 4 gathers of whole RGB pixels; each output
    pixel reads only its own crop, so the result never depends on the batch.
    """
    sizes = tf.cast(sizes, tf.int64)
    height, width = sizes[:, 0], sizes[:, 1]
    group = host_ops.WORD_PIXELS
    starts = tf.cumsum((height * width + group - 1) // group * group, exclusive=True)
    out = tf.range(image_size, dtype=tf.float32)[None] + 0.5

    def axis(size):
        """[N] input sizes -> (lower, upper index, fraction), each [N, S]."""
        pos = out * (tf.cast(size, tf.float32) / image_size)[:, None] - 0.5
        floor = tf.floor(pos)
        lower = tf.maximum(tf.cast(floor, tf.int64), 0)
        upper = tf.minimum(tf.cast(tf.math.ceil(pos), tf.int64), size[:, None] - 1)
        return lower, upper, pos - floor

    top, bottom, y_frac = axis(height)
    left, right, x_frac = axis(width)
    # GPUs have no uint8 gather kernel (TensorFlow registers bool, int32, int64 and float
    # types), and TensorFlow would quietly run it on the CPU: gather float16, exact for
    # 0..255 and half of float32's memory (tests/step/test_gpu_kernels.py).
    rgb = tf.cast(unpack_rgb(words), tf.float16)

    def corner(rows, cols):  # [N, S] rows x [N, S] cols -> float [N, S, S, 3]
        index = (starts[:, None] + rows * width[:, None])[:, :, None] + cols[:, None, :]
        return tf.cast(tf.gather(rgb, index), tf.float32)

    def lerp(a, b, frac):
        return a + (b - a) * frac

    x_frac = x_frac[:, None, :, None]
    upper_row = lerp(corner(top, left), corner(top, right), x_frac)
    lower_row = lerp(corner(bottom, left), corner(bottom, right), x_frac)
    return lerp(upper_row, lower_row, y_frac[:, :, None, None])


def resized(batch: PackedTrainBatch, image_size: int) -> TrainBatch:
    """A "packed" batch (``batches.PackedTrainBatch``) -> the same batch with float32
    ``image`` [N, S, S, 3] in place of ``pixels`` and ``sizes`` (``resize_flat``)."""
    rest = {k: v for k, v in batch.items() if k not in ("pixels", "sizes")}
    return {**rest, "image": resize_flat(batch["pixels"], batch["sizes"], image_size)}


def augmented(batch: TrainBatch) -> TrainBatch:
    """A "uint8" batch (uint8 or already float images) with policy or erasing draws ->
    the same batch with float32 images flipped and augmented (``augment.apply``), no flips
    left and no draws, so ``make_batch_fn`` does not apply them again.

    The step runs this before XLA (``TrainStep``'s ``unpack``): ImageProjectiveTransformV3 has
    no XLA kernel, and under ``--jit_compile`` XLA compiles the rest of the preparation.
    """
    images = augment.apply(apply_flip(to_float(batch["image"]), batch["flip"]), batch)
    rest = {k: v for k, v in batch.items() if k not in ("augment", "erase")}
    return {**rest, "image": images, "flip": tf.zeros_like(batch["flip"])}


def train_batch(batch: TrainBatch) -> tuple[tf.Tensor, tf.Tensor]:
    """A "uint8" batch {image, label, flip} -> (float images, int labels): the step's
    default preparation when no other is given (no mixing, no broken images)."""
    return apply_flip(to_float(batch["image"]), batch["flip"]), batch["label"]


def pair_swap(x: tf.Tensor) -> tf.Tensor:
    """[N, ...] with N even -> each example's partner: rows (0,1)(2,3)... swapped."""
    shape = tf.shape(x)
    pairs = tf.reshape(x, tf.concat([[-1, 2], shape[1:]], 0))
    return tf.reshape(tf.reverse(pairs, axis=[1]), shape)


def mix_batch(images, targets, mix_lam, cut_box, use_cut):
    """MixUp/CutMix of each example with its partner (``pair_swap``).

    images [N,H,W,C] float, targets [N,K] float, mix_lam [N] (own share), cut_box [N,4] int
    (y0, x0, y1, x1: pasted from the partner), use_cut [N] bool -> (images, targets).
    """
    partner, partner_targets = pair_swap(images), pair_swap(targets)
    height, width = tf.shape(images)[1], tf.shape(images)[2]
    ys = tf.range(height)[None, :, None]
    xs = tf.range(width)[None, None, :]
    box = [cut_box[:, i, None, None] for i in range(4)]
    inside = (ys >= box[0]) & (ys < box[2]) & (xs >= box[1]) & (xs < box[3])
    lam = mix_lam[:, None, None, None]
    blended = lam * images + (1.0 - lam) * partner
    cut = tf.where(inside[..., None], partner, images)
    out = tf.where(use_cut[:, None, None, None], cut, blended)
    lam_t = mix_lam[:, None]
    return out, lam_t * targets + (1.0 - lam_t) * partner_targets


def soft_targets(labels, weight, num_classes: int) -> tf.Tensor:
    """One-hot [N, K] float targets; weight-0 (broken) examples get all-zero rows, to which
    the step's cross-entropy gives zero loss and zero gradient (``losses._cross_entropy``: the
    fused op alone would give them the gradient softmax)."""
    return tf.one_hot(labels, num_classes) * weight[:, None]


def check_mixing_batch(per_replica_batch: int) -> None:
    """MixUp/CutMix pairs (2k, 2k+1) must not straddle replicas: the batch must be even."""
    if per_replica_batch % 2:
        raise ValueError(
            f"MixUp/CutMix need an even per-replica batch, got {per_replica_batch}: "
            "change --global_batch_size"
        )


def make_batch_fn(layout: str, num_classes: int, data):
    """``fn(batch) -> (float images [N,S,S,3], soft targets [N,K])`` for batches of
    ``layout`` ("uint8", "packed" or "float", see ``batches``), as ``data`` (a
    config.DataConfig) says: flip, the augmentation policy and random erasing (their draws
    ride in the batch, ``augment.apply``), MixUp/CutMix.
    """
    if layout == "float":
        return lambda batch: (batch["image"], batch["target"])  # done in tf.data already

    def fn(batch):
        if layout == "packed":
            images = resize_flat(batch["pixels"], batch["sizes"], data.image_size)
        else:
            # Cast first: float has a GPU kernel for every op here, uint8 not always, and
            # TensorFlow would quietly run such an op on the CPU (tests/step/test_gpu_kernels.py).
            images = to_float(batch["image"])
        images = augment.apply(apply_flip(images, batch["flip"]), batch)
        targets = soft_targets(batch["label"], batch["weight"], num_classes)
        if data.mixing:
            images, targets = mix_batch(images, targets, **batch["mix"])
        return images, targets

    return fn


def host_batch_fn(layout: str, num_classes: int, data):
    """For ``--preprocess_on=host``: ``make_batch_fn`` as a tf.data map from a batch of
    ``layout`` ("uint8" or "packed") to a "float" one {image, target, weight}."""
    fn = make_batch_fn(layout, num_classes, data)

    def host(batch):
        images, targets = fn(batch)
        return {"image": images, "target": targets, "weight": batch["weight"]}

    return host
