"""The device half of the augmentation policies (``augment.py`` draws, this module applies):
PIL's image ops as timm's ``auto_augment.py`` calls them, on a whole batch at once, each
image with its own op and argument.

Images are float32 [N, H, W, 3] holding whole numbers in [0, 255], as PIL's uint8 would, and
every op rounds as PIL does, so chains of ops stay within a grey level of PIL's (tested
against Pillow, tests/test_augment.py). One op per image per call (``apply_ops``), in three
batched stages, each the identity for images whose op belongs to another stage:

- lookup tables: AutoContrast, Equalize, Invert, Posterize, Solarize, SolarizeAdd, Contrast,
  Brightness are, in PIL too, a 256-entry table per channel; here one table per image x
  channel [N, 3, 256] is built (from per-image histograms where needed) and applied with one
  gather;
- blends: Color (with the image's grey) and Sharpness (with its 3x3 SMOOTH), masked per image;
- geometry: Rotate, ShearX/Y, TranslateX/Y as one ``ImageProjectiveTransformV3`` over the
  batch, an affine matrix per image (the identity for the others), fill 128 as timm; bilinear
  (timm picks bilinear or bicubic at random; TensorFlow's op has no bicubic).

Every op is masked, not partitioned by op (``tf.dynamic_partition``): the shapes stay static
(no group sizes that change every batch), a slot costs the same whatever its images drew, and
each image's result is exact integer arithmetic or a per-pixel formula, so it never depends on
the other images of the batch. The transform has no XLA kernel: under ``--jit_compile`` the
step applies the policy before XLA (``device_ops.augmented``).
"""

import math

import tensorflow as tf

from tfgpu import compat
from tfgpu.constants import IMAGENET_MEAN, IMAGENET_STD

# Op ids, as the batch carries them ("augment" "op"); IDENTITY leaves an image as it is.
(
    IDENTITY,
    AUTO_CONTRAST,
    EQUALIZE,
    INVERT,
    ROTATE,
    POSTERIZE,
    SOLARIZE,
    SOLARIZE_ADD,
    COLOR,
    CONTRAST,
    BRIGHTNESS,
    SHARPNESS,
    SHEAR_X,
    SHEAR_Y,
    TRANSLATE_X,
    TRANSLATE_Y,
) = range(16)
NUM_OPS = 16
FILL = 128.0  # timm's fill of geometric ops (its img_mean default)


def _select(mask, a, b):
    """``a`` where ``mask`` (bool [N] per image, or broadcastable to the images), else ``b``:
    as arithmetic, exact for whole numbers, because a broadcast ``tf.where`` over a batch
    costs ~10x an add on CPU (Select copies the mask out; measured 29 against 3 ms at 64 x
    224^2)."""
    m = tf.cast(mask, tf.float32)
    if m.shape.rank == 1:
        m = m[:, None, None, None]
    return b + m * (a - b)


def _blend(degenerate, image, factor):
    """PIL's ``Image.blend(degenerate, image, factor)`` on uint8: float32 arithmetic,
    truncated, clipped to [0, 255]."""
    return tf.clip_by_value(tf.floor(degenerate + factor * (image - degenerate)), 0.0, 255.0)


def grey(images):
    """PIL's ``convert("L")`` of RGB: [N, H, W, 3] -> [N, H, W, 1], its integer formula
    (exact in float32: the sums stay below 2^24)."""
    weighted = images[..., :1] * 19595 + images[..., 1:2] * 38470 + images[..., 2:] * 7471
    return tf.floor((weighted + 32768.0) / 65536.0)


def histograms(images, sorted_counts: bool | None = None):
    """int32 [N, 3, 256]: each image's per-channel histogram. Hand-written because TensorFlow
    has no batched histogram op (``tf.histogram_fixed_width`` counts one tensor as a whole).

    One bincount over the batch (each value offset by 256 x (image x 3 + channel)), except
    under op determinism (``--deterministic``) with a GPU, where TensorFlow refuses Bincount
    (its atomics): there each channel is sorted and the bin edges looked up (``sorted_counts``;
    None: decided so). Both count exactly the same; on a CPU sorting is ~30x slower (1.1 s
    against 0.04 s for 64 images of 224^2, measured), and Bincount is deterministic there."""
    n = images.shape[0] or tf.shape(images)[0]  # static when known: XLA needs the length
    if sorted_counts is None:
        sorted_counts = compat.op_determinism_enabled() and bool(
            tf.config.list_logical_devices("GPU")
        )
    if sorted_counts:
        return _histograms_by_sorting(images, n)
    offset = tf.reshape(tf.range(n * 3) * 256, [-1, 1, 1, 3])
    values = tf.cast(images, tf.int32) + offset
    counts = tf.raw_ops.DenseBincount(  # the raw op: XLA needs the size as it is, not a max
        input=tf.reshape(values, [-1]), size=n * 768, weights=tf.zeros([0], tf.int32)
    )
    return tf.reshape(counts, [n, 3, 256])


def _histograms_by_sorting(images, n):
    """The histograms from each channel's sorted values: count of bin b = (first position
    of a value > b) - (first position of a value >= b), every op deterministic on a GPU."""
    rows = tf.reshape(tf.transpose(tf.cast(images, tf.int32), [0, 3, 1, 2]), [n * 3, -1])
    ordered = tf.sort(rows, axis=-1)
    edges = tf.broadcast_to(tf.range(257, dtype=tf.int32), [n * 3, 257])
    first = tf.searchsorted(ordered, edges, side="left")  # [rows, 257]: first >= edge
    return tf.reshape(first[:, 1:] - first[:, :-1], [n, 3, 256])


def _auto_contrast_lut(hist, levels):
    """``ImageOps.autocontrast`` (cutoff 0): each channel stretched from its [lo, hi] to
    [0, 255]; float64 as PIL's Python floats, so the truncation agrees."""
    present = tf.cast(hist > 0, tf.float32)  # ArgMax has no GPU kernel for int32
    lo = tf.cast(tf.argmax(present, -1), tf.float64)[..., None]
    hi = 255.0 - tf.cast(tf.argmax(present[..., ::-1], -1), tf.float64)[..., None]
    scale = 255.0 / tf.maximum(hi - lo, 1.0)
    stretched = tf.clip_by_value(tf.floor(tf.cast(levels, tf.float64) * scale - lo * scale), 0, 255)
    return tf.where(hi > lo, tf.cast(stretched, tf.float32), levels)


def _equalize_lut(hist, levels):
    """``ImageOps.equalize``: PIL's integer formula per channel, lut[i] = (step // 2 +
    pixels below i) // step, step = (pixels - pixels of the top level) // 255."""
    present = tf.cast(hist > 0, tf.float32)  # ArgMax has no GPU kernel for int32
    top = 255 - tf.argmax(present[..., ::-1], -1, output_type=tf.int32)
    last = tf.gather(hist, top, batch_dims=2)[..., None]
    step = (tf.reduce_sum(hist, -1, keepdims=True) - last) // 255
    below = tf.cumsum(hist, -1, exclusive=True)
    lut = tf.cast((step // 2 + below) // tf.maximum(step, 1), tf.float32)
    keep = (step > 0) & (tf.reduce_sum(present, -1, keepdims=True) > 1)
    return tf.where(keep, tf.minimum(lut, 255.0), levels)


def _lookup_tables(images, gray, op, arg):
    """[N, 3, 256] float tables: each image's op if it is one of the table ops, else the
    identity. ``gray`` [N, H, W, 1] is ``grey(images)`` (Contrast's mean)."""
    levels = tf.range(256, dtype=tf.float32)[None, None, :]
    a = arg[:, None, None]
    pixels = tf.cast(tf.reduce_prod(tf.shape(gray)[1:3]), tf.int32)
    total = tf.reduce_sum(tf.cast(gray, tf.int32), [1, 2, 3])
    mean = tf.cast((2 * total + pixels) // (2 * pixels), tf.float32)[:, None, None]  # int(m+.5)
    drop = tf.pow(2.0, 8.0 - tf.clip_by_value(a, 0.0, 8.0))  # Posterize: keep the top bits
    hist = histograms(images)
    tables = {
        AUTO_CONTRAST: lambda: _auto_contrast_lut(hist, levels),
        EQUALIZE: lambda: _equalize_lut(hist, levels),
        INVERT: lambda: 255.0 - levels,
        POSTERIZE: lambda: tf.floor(levels / drop) * drop,
        SOLARIZE: lambda: tf.where(levels < a, levels, 255.0 - levels),
        SOLARIZE_ADD: lambda: tf.where(levels < 128, tf.minimum(levels + a, 255.0), levels),
        CONTRAST: lambda: _blend(mean, levels, a),
        BRIGHTNESS: lambda: _blend(0.0, levels, a),
    }
    lut = tf.broadcast_to(levels, [tf.shape(op)[0], 3, 256])
    for kind, table in tables.items():
        lut = tf.where((op == kind)[:, None, None], table(), lut)
    return lut


def _apply_tables(images, lut):
    """One gather: pixel v of channel c of image i -> lut[i, c, v]."""
    n = tf.shape(images)[0]
    offset = tf.reshape(tf.range(n * 3) * 256, [-1, 1, 1, 3])
    return tf.gather(tf.reshape(lut, [-1]), tf.cast(images, tf.int32) + offset)


def smooth(images):
    """PIL's ``ImageFilter.SMOOTH`` (3x3, centre 5, others 1, / 13, rounded); its one-pixel
    border keeps the input's pixels, as PIL's filter does."""
    kernel = tf.constant([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0
    kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
    inner = tf.nn.depthwise_conv2d(images, kernel, [1, 1, 1, 1], "VALID")
    inner = tf.clip_by_value(tf.floor(inner + 0.5), 0.0, 255.0)
    padded = tf.pad(inner, [[0, 0], [1, 1], [1, 1], [0, 0]])
    height, width = tf.shape(images)[1], tf.shape(images)[2]
    ys, xs = tf.range(height)[:, None], tf.range(width)[None, :]
    inside = (ys > 0) & (ys < height - 1) & (xs > 0) & (xs < width - 1)
    return _select(inside[None, :, :, None], padded, images)


def _blends(images, gray, op, arg):
    """Color (blend with the grey image) and Sharpness (with ``smooth``) in one blend; the
    other images blend with themselves, which leaves them exact (whole numbers)."""
    degenerate = _select(op == COLOR, gray, images)
    degenerate = _select(op == SHARPNESS, smooth(images), degenerate)
    return _blend(degenerate, images, arg[:, None, None, None])


def affine_rows(op, arg, height, width):
    """[N, 6] PIL ``Image.transform(AFFINE)`` data (a, b, c, d, e, f): output (x, y) reads
    input (a x + b y + c, d x + e y + f), pixel centres at +0.5 as PIL. Rotate about the
    centre by ``arg`` degrees counter-clockwise (``Image.rotate``), Shear by ``arg``,
    Translate by ``arg`` x the side; the identity for other ops."""
    w, h = tf.cast(width, tf.float32), tf.cast(height, tf.float32)
    angle = -arg * (math.pi / 180.0)
    cos, sin = tf.cos(angle), tf.sin(angle)
    rot_c = -cos * w / 2 - sin * h / 2 + w / 2  # Image.rotate: about (w / 2, h / 2)
    rot_f = sin * w / 2 - cos * h / 2 + h / 2
    zero, one = tf.zeros_like(arg), tf.ones_like(arg)
    rotate = op == ROTATE

    def pick(*pairs, default):
        out = default
        for mask, value in pairs:
            out = tf.where(mask, value, out)
        return out

    a = pick((rotate, cos), default=one)
    b = pick((rotate, sin), (op == SHEAR_X, arg), default=zero)
    c = pick((rotate, rot_c), (op == TRANSLATE_X, arg * w), default=zero)
    d = pick((rotate, -sin), (op == SHEAR_Y, arg), default=zero)
    f = pick((rotate, rot_f), (op == TRANSLATE_Y, arg * h), default=zero)
    return tf.stack([a, b, c, d, a, f], axis=1)


def _geometry(images, op, arg):
    """One projective transform of the batch: PIL's affine rows, moved from PIL's pixel
    centres (+0.5) to TensorFlow's pixel indices, bilinear, fill 128, rounded to uint8."""
    height, width = tf.shape(images)[1], tf.shape(images)[2]
    a, b, c, d, e, f = tf.unstack(affine_rows(op, arg, height, width), axis=1)
    zero = tf.zeros_like(a)
    transforms = tf.stack(
        [a, b, c + (a + b - 1) / 2, d, e, f + (d + e - 1) / 2, zero, zero], axis=1
    )
    moved = tf.raw_ops.ImageProjectiveTransformV3(
        images=images,
        transforms=transforms,
        output_shape=tf.shape(images)[1:3],
        fill_value=FILL,
        interpolation="BILINEAR",
        fill_mode="CONSTANT",
    )
    return tf.clip_by_value(tf.floor(moved + 0.5), 0.0, 255.0)


def apply_ops(images, op, arg):
    """images float32 [N, H, W, 3] (whole numbers in [0, 255]), op int32 [N] (ids above),
    arg float32 [N] (the op's argument: degrees, bits, threshold, factor, shear, fraction
    of the side) -> the images, each with its op applied."""
    gray = grey(images)
    images = _apply_tables(images, _lookup_tables(images, gray, op, arg))
    images = _blends(images, gray, op, arg)
    return _geometry(images, op, arg)


# --- random erasing: noise from a per-example seed, on the device -----------------------------

_MASK32 = 0xFFFFFFFF


def _shift(x, bits: int):
    return tf.bitwise.right_shift(x, tf.constant(bits, x.dtype))


def _hash32(x, rounds: int = 2):
    """A 32-bit integer mix (``rounds`` of a multiply-xorshift hash) of int64 values in
    [0, 2^32); the multiplier < 2^27 keeps every product inside int64."""
    for _ in range(rounds):
        x = tf.bitwise.bitwise_and(tf.bitwise.bitwise_xor(x, _shift(x, 16)) * 0x45D9F3B, _MASK32)
    return tf.bitwise.bitwise_xor(x, _shift(x, 16))


def pixel_noise(seeds, height, width):
    """seeds int64 [N, 2] -> float32 [N, H, W, 3] standard normal noise that depends only on
    each image's seed and the pixel's (y, x, channel): a counter hash and Box-Muller, since
    stateless random ops take one seed per call, not one per image.

    Per image and pair of values, one round of the hash on (the counter's own hash xor the
    image's key) gives two 16-bit uniforms, and Box-Muller two normals (cos and sin): the
    noise is ~15 passes over the batch, not ~40 (on CPU it is most of erasing's cost).
    """
    low = tf.bitwise.bitwise_and(seeds, _MASK32)
    key = _hash32(tf.bitwise.bitwise_xor(_hash32(low[:, 0]), low[:, 1]))
    key = tf.bitwise.bitwise_xor(key, tf.bitwise.bitwise_and(_shift(seeds[:, 0], 32), _MASK32))
    size = tf.cast(height * width * 3, tf.int64)
    counters = _hash32(tf.range((size + 1) // 2))  # the same for every image
    bits = _hash32(tf.bitwise.bitwise_xor(counters[None], key[:, None]), rounds=1)
    u1 = (tf.cast(_shift(bits, 16), tf.float32) + 0.5) / 65536.0
    u2 = (tf.cast(tf.bitwise.bitwise_and(bits, 0xFFFF), tf.float32) + 0.5) / 65536.0
    radius, angle = tf.sqrt(-2.0 * tf.math.log(u1)), 2.0 * math.pi * u2
    z = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], axis=1)[:, :size]
    return tf.reshape(z, tf.stack([-1, height, width, 3]))


def erase(images, box, seeds):
    """timm's RandomErasing (mode "pixel") applied: images float [N, H, W, 3], box int32
    [N, 4] (y0, x0, y1, x1; empty: not erased), seeds int64 [N, 2] -> the images with each
    box filled with per-pixel normal noise, in pixels: ImageNet mean + std x N(0, 1), i.e.
    timm's N(0, 1) after the model's ImageNet normalization."""
    height, width = tf.shape(images)[1], tf.shape(images)[2]
    ys = tf.range(height)[None, :, None]
    xs = tf.range(width)[None, None, :]
    b = [box[:, i, None, None] for i in range(4)]
    inside = (ys >= b[0]) & (ys < b[2]) & (xs >= b[1]) & (xs < b[3])
    noise = pixel_noise(seeds, height, width) * IMAGENET_STD + IMAGENET_MEAN
    return _select(inside[..., None], noise, images)
