"""Random erasing (``--random_erasing``): timm's RandomErasing with its train script's defaults
(``--reprob`` P, ``--remode pixel``, one box): area 2%-1/3 of the image, aspect 0.3-3.3
(log-uniform), 10 attempts; the box gets per-pixel normal noise. It runs after the policy and
before MixUp/CutMix, as in timm.

As the policies' (``augment.py``), its choices are drawn on the host from each example's
stateless seed (``draw``: the box and a noise seed) and ride with the batch; the device fills
the boxes (``erase``), with noise that depends on the noise seed and the pixel alone.
"""

import math

import tensorflow as tf

from tfgpu.data import rng_streams
from tfgpu.data.augment_ops import select
from tfgpu.imagenet import IMAGENET_MEAN, IMAGENET_STD

# Stream ids of the draws (``rng_streams.AUGMENT``); the caller's ``key(stream)`` turns them into
# stateless seeds.
_ERASE, _AREA, _ASPECT, _ERASE_Y, _ERASE_X, _NOISE = (
    rng_streams.AUGMENT[name] for name in ("erase", "area", "aspect", "erase_y", "erase_x", "noise")
)


def draw(key, shape, image_size: int, probability: float) -> dict:
    """timm's RandomErasing draws (one box, 10 attempts, see the module docstring) for
    examples of ``shape``: {box int32 shape + [4] (y0, x0, y1, x1; zeros: not erased),
    seed int64 shape + [2] (the noise's)}."""
    attempts = list(shape) + [10]
    side = float(image_size)
    area = tf.random.stateless_uniform(attempts, key(_AREA), 0.02, 1 / 3) * side * side
    log_ratio = tf.random.stateless_uniform(attempts, key(_ASPECT), math.log(0.3), -math.log(0.3))
    ratio = tf.exp(log_ratio)
    h = tf.cast(tf.round(tf.sqrt(area * ratio)), tf.int32)
    w = tf.cast(tf.round(tf.sqrt(area / ratio)), tf.int32)
    fits = (h < image_size) & (w < image_size)
    first = tf.argmax(tf.cast(fits, tf.int32), -1, output_type=tf.int32)[..., None]
    h = tf.gather(h, first, batch_dims=len(shape))[..., 0]
    w = tf.gather(w, first, batch_dims=len(shape))[..., 0]
    top = tf.random.stateless_uniform(list(shape), key(_ERASE_Y)) * tf.cast(
        image_size - h + 1, tf.float32
    )
    left = tf.random.stateless_uniform(list(shape), key(_ERASE_X)) * tf.cast(
        image_size - w + 1, tf.float32
    )
    top, left = tf.cast(top, tf.int32), tf.cast(left, tf.int32)
    box = tf.stack([top, left, top + h, left + w], -1)
    erased = tf.random.stateless_uniform(list(shape), key(_ERASE)) < probability
    erased &= tf.reduce_any(fits, -1)
    seed = tf.random.stateless_uniform(
        list(shape) + [2], key(_NOISE), minval=None, maxval=None, dtype=tf.int64
    )
    return {"box": tf.where(erased[..., None], box, 0), "seed": seed}


# --- the noise: per-pixel normal values from each image's seed, on the device --------------

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
    return select(inside[..., None], noise, images)
