"""The float work of preprocessing: pure tensor -> tensor functions run inside the train step.

Batches arrive as uint8 (a quarter of float32's host-to-device traffic) with the random
choices already drawn on the host (``image_ops.py``: flip, MixUp/CutMix draws), so what an
example becomes depends only on (seed, epoch, position); here they are applied on the
accelerator. Normalization belongs to the model (its first layer), so exported models take
plain pixels. With ``--preprocess_on=host`` the same functions run in tf.data instead. With
``--resize_on=device`` the training crops arrive un-resized (packed pixels + sizes) and the
bilinear resize runs here too, first (``resize_flat``).

MixUp/CutMix partners: example ``2k`` mixes with ``2k+1`` of the same batch (and vice versa).
Global batches are split across workers, replicas and micro-batches at even positions (the
per-replica batch must be even, ``check_mixing_batch``) and mixing runs before the step splits
micro-batches, so pairs never depend on the split.
"""

import keras
import tensorflow as tf

from tfgpu import image_ops


def apply_flip(images: tf.Tensor, flip: tf.Tensor) -> tf.Tensor:
    """Mirrors left-right the images of a batch [N, H, W, C] whose ``flip`` [N] is true."""
    return tf.where(flip[:, None, None, None], tf.reverse(images, axis=[2]), images)


def to_float(images: tf.Tensor) -> tf.Tensor:
    """uint8 [0, 255] -> float32 [0, 255]; the model's first layer normalizes."""
    return tf.cast(images, tf.float32)


def unpack_rgb(words: tf.Tensor) -> tf.Tensor:
    """int64 words (``image_ops.pack_pixels``) -> uint8 [P, 3], one RGB pixel per row."""
    return tf.reshape(tf.bitcast(words, tf.uint8), [-1, 3])


def resize_flat(words: tf.Tensor, sizes: tf.Tensor, image_size: int) -> tf.Tensor:
    """``--resize_on=device``: a batch of un-resized crops -> float32 [N, S, S, 3] in [0, 255].

    ``words`` int64 [total] are the crops' (h, w, 3) pixels packed one after the other
    (``image_ops.pack_pixels``: each padded to whole 8-pixel groups); ``sizes`` [N, 2] their
    (h, w). Bilinear with half-pixel centers, the arithmetic of TensorFlow's ResizeBilinear
    kernel (``tf.image.resize``) in float32, as 4 gathers of whole RGB pixels; each output
    pixel reads only its own crop, so the result never depends on the batch.
    """
    sizes = tf.cast(sizes, tf.int64)
    height, width = sizes[:, 0], sizes[:, 1]
    group = image_ops.WORD_PIXELS
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
    # 0..255 and half of float32's memory (tests/test_gpu_kernels.py).
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


def resize_in_batch(batch: dict, image_size: int) -> dict:
    """A batch with un-resized crops (``pixels``, ``sizes``) -> the same batch with float32
    ``image`` [N, S, S, 3] instead (``resize_flat``); any other batch unchanged."""
    if "pixels" not in batch:
        return batch
    rest = {k: v for k, v in batch.items() if k not in ("pixels", "sizes")}
    return {**rest, "image": resize_flat(batch["pixels"], batch["sizes"], image_size)}


def batch_images(batch: dict, image_size: int) -> tf.Tensor:
    """The batch's images at ``image_size``: as they came (uint8, or float once resized), or
    resized here (float)."""
    return resize_in_batch(batch, image_size)["image"]


def train_batch(batch: dict) -> tuple[tf.Tensor, tf.Tensor]:
    """A host batch {image uint8, label, flip} -> (float images, int labels)."""
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
    """One-hot [N, K] float targets; weight-0 (broken) examples get all-zero rows, which give
    zero loss and zero gradient in a softmax cross-entropy."""
    return tf.one_hot(labels, num_classes) * weight[:, None]


def check_mixing_batch(per_replica_batch: int) -> None:
    """MixUp/CutMix pairs (2k, 2k+1) must not straddle replicas: the batch must be even."""
    if per_replica_batch % 2:
        raise ValueError(
            f"MixUp/CutMix need an even per-replica batch, got {per_replica_batch}: "
            "change --global_batch_size"
        )


def make_batch_fn(
    num_classes: int,
    randaugment_ops: int = 0,
    randaugment_magnitude: float = 0.5,
    image_size: int | None = None,
):
    """``fn(batch) -> (float images [N,H,W,3], soft targets [N,K])`` for a host batch
    {image uint8 | pixels + sizes (``resize_flat`` to ``image_size``), label, flip, weight
    [, mix_lam, cut_box, use_cut]}.

    RandAugment (``randaugment_ops`` > 0) uses ``keras.layers.RandAugment``, whose random
    choices come from Keras' own generator per batch: it does NOT honour the determinism
    contract (the result depends on how the global batch is split) and is off by default.
    """
    rand_augment = None
    if randaugment_ops:
        rand_augment = keras.layers.RandAugment(
            value_range=(0, 255), num_ops=randaugment_ops, factor=randaugment_magnitude
        )

    def fn(batch):
        # Cast first: float has a GPU kernel for every op here, uint8 not always, and TensorFlow
        # would quietly run such an op on the CPU (tests/test_gpu_kernels.py).
        images = apply_flip(to_float(batch_images(batch, image_size)), batch["flip"])
        if rand_augment is not None:
            images = tf.cast(rand_augment(images, training=True), tf.float32)
        weight = batch.get("weight", tf.ones(tf.shape(batch["label"]), tf.float32))
        targets = soft_targets(batch["label"], weight, num_classes)
        if "mix_lam" in batch:
            images, targets = mix_batch(
                images, targets, batch["mix_lam"], batch["cut_box"], batch["use_cut"]
            )
        return images, targets

    return fn


def host_batch_fn(num_classes: int, cfg):
    """For ``--preprocess_on=host``: the batch fn as a tf.data map, batch -> {image float32,
    target, weight}; the step then takes them as they are (``from_host``)."""
    fn = make_batch_fn(num_classes, cfg.randaugment_ops, cfg.randaugment_magnitude, cfg.image_size)

    def host(batch):
        images, targets = fn(batch)
        return {"image": images, "target": targets, "weight": batch["weight"]}

    return host


def from_host(batch: dict) -> tuple[tf.Tensor, tf.Tensor]:
    """The device side of ``--preprocess_on=host``: nothing left to do."""
    return batch["image"], batch["target"]


def device_fn(num_classes: int, cfg):
    """The ``preprocess_fn`` for TrainStep, given the run's PipelineConfig ``cfg``."""
    if cfg.preprocess_on == "host":
        return from_host
    return make_batch_fn(
        num_classes, cfg.randaugment_ops, cfg.randaugment_magnitude, cfg.image_size
    )
