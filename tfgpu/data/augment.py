"""Augmentation policies that honour the determinism contract: RandAugment, TrivialAugmentWide
and AutoAugment (``--augment_policy``), and random erasing (``--random_erasing``).

Each example's random choices (which ops, their arguments, the erase box and its noise seed)
are drawn on the host from its stateless seed (``draw``: the per-example pipeline gives it
``host_ops`` streams, the in-memory path the same draws as vectors over an epoch) and ride
with the batch as small tensors, {"augment": {"op" int32 [N, L], "arg" float32 [N, L]},
"erase": {"box" int32 [N, 4], "seed" int64 [N, 2]}}; the device only applies them
(``apply``, vectorized over the batch: ``augment_ops.py``). So what an example becomes
depends on (seed, epoch, position) alone, never on how the global batch is split.

Magnitudes are timm's (``timm/data/auto_augment.py``):

- ``randaugment``: ``--randaugment_ops`` N layers, each a uniform choice (with replacement)
  of timm's 15 ops, applied with probability 0.5, magnitude M (``--randaugment_magnitude``,
  0..10 scale) + N(0, ``--randaugment_magnitude_std``) clipped to [0, max(10, M)]: timm's
  ``rand-m9-mstd0.5`` by default (M > 10 is timm's ``mmax``), arguments negated half the
  time for signed ops. Not offered: timm's uniform magnitudes (mstd > 100), its op weights
  (``w0``) and its ``inc`` variants.
- ``trivialaugment``: TrivialAugmentWide (Mueller & Hutter 2021, torchvision's ranges): one of
  14 ops (identity included), a uniform bin of 31 magnitudes; bilinear and fill 128 as the
  other policies (torchvision's defaults are nearest and 0).
- ``autoaugment``: timm's ``original`` ImageNet policy (Cubuk et al. 2019): one of its 25
  sub-policies, each op applied with its probability at its fixed magnitude.

Random erasing is timm's RandomErasing with its train script's defaults (``--reprob`` P,
``--remode pixel``, one box): area 2%-1/3 of the image, aspect 0.3-3.3 (log-uniform), 10
attempts; the box gets per-pixel normal noise (``augment_ops.erase``). It runs after the
policy and before MixUp/CutMix, as in timm.
"""

import math

import tensorflow as tf

from tfgpu.data import augment_ops as ops
from tfgpu.data import streams

# Stream ids of the draws (``streams.AUGMENT``); the caller's ``key(stream)`` turns them into
# stateless seeds.
_CHOICE, _APPLY, _LEVEL, _SIGN, _ERASE, _AREA, _ASPECT, _ERASE_Y, _ERASE_X, _NOISE = (
    streams.AUGMENT.values()
)

# How a level in [0, 1] becomes an op's argument: offset + factor x rounding(level x scale),
# negated half the time when signed. (op, scale, offset, factor, rounding, signed)
_FLOAT, _TRUNC, _ROUND = 0, 1, 2
_ENHANCE = (1.8, 0.1, 1.0, _FLOAT, False)
_TIMM = {  # timm's LEVEL_TO_ARG (level = magnitude / 10)
    "AutoContrast": (ops.AUTO_CONTRAST, 0.0, 0.0, 1.0, _FLOAT, False),
    "Equalize": (ops.EQUALIZE, 0.0, 0.0, 1.0, _FLOAT, False),
    "Invert": (ops.INVERT, 0.0, 0.0, 1.0, _FLOAT, False),
    "Rotate": (ops.ROTATE, 30.0, 0.0, 1.0, _FLOAT, True),
    "Posterize": (ops.POSTERIZE, 4.0, 0.0, 1.0, _TRUNC, False),
    "PosterizeOriginal": (ops.POSTERIZE, 4.0, 4.0, 1.0, _TRUNC, False),
    "Solarize": (ops.SOLARIZE, 256.0, 0.0, 1.0, _TRUNC, False),
    "SolarizeAdd": (ops.SOLARIZE_ADD, 110.0, 0.0, 1.0, _TRUNC, False),
    "Color": (ops.COLOR,) + _ENHANCE,
    "Contrast": (ops.CONTRAST,) + _ENHANCE,
    "Brightness": (ops.BRIGHTNESS,) + _ENHANCE,
    "Sharpness": (ops.SHARPNESS,) + _ENHANCE,
    "ShearX": (ops.SHEAR_X, 0.3, 0.0, 1.0, _FLOAT, True),
    "ShearY": (ops.SHEAR_Y, 0.3, 0.0, 1.0, _FLOAT, True),
    "TranslateXRel": (ops.TRANSLATE_X, 0.45, 0.0, 1.0, _FLOAT, True),
    "TranslateYRel": (ops.TRANSLATE_Y, 0.45, 0.0, 1.0, _FLOAT, True),
}
RAND_OPS = tuple(name for name in _TIMM if name != "PosterizeOriginal")  # timm's 15


def _trivial_wide(image_size: int) -> tuple:
    """TrivialAugmentWide's 14 ops (torchvision), level = bin / 30: translations are whole
    pixels (32 at most), as a fraction of the side; Posterize 8 - round(6 level) bits;
    Solarize at 255 (1 - level); enhancements 1 +- 0.99 level."""
    enhance = (0.99, 1.0, 1.0, _FLOAT, True)
    return (
        (ops.IDENTITY, 0.0, 0.0, 1.0, _FLOAT, False),
        (ops.SHEAR_X, 0.99, 0.0, 1.0, _FLOAT, True),
        (ops.SHEAR_Y, 0.99, 0.0, 1.0, _FLOAT, True),
        (ops.TRANSLATE_X, 32.0, 0.0, 1.0 / image_size, _TRUNC, True),
        (ops.TRANSLATE_Y, 32.0, 0.0, 1.0 / image_size, _TRUNC, True),
        (ops.ROTATE, 135.0, 0.0, 1.0, _FLOAT, True),
        (ops.BRIGHTNESS,) + enhance,
        (ops.COLOR,) + enhance,
        (ops.CONTRAST,) + enhance,
        (ops.SHARPNESS,) + enhance,
        (ops.POSTERIZE, 6.0, 8.0, -1.0, _ROUND, False),
        (ops.SOLARIZE, 255.0, 255.0, -1.0, _FLOAT, False),
        (ops.AUTO_CONTRAST, 0.0, 0.0, 1.0, _FLOAT, False),
        (ops.EQUALIZE, 0.0, 0.0, 1.0, _FLOAT, False),
    )


# timm's auto_augment_policy_original: (op, probability, magnitude) pairs.
AUTOAUGMENT = (
    (("PosterizeOriginal", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
    (("PosterizeOriginal", 0.6, 7), ("PosterizeOriginal", 0.6, 6)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, 4), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, 7)),
    (("PosterizeOriginal", 0.8, 5), ("Equalize", 1.0, 2)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, 8), ("PosterizeOriginal", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, 2)),
    (("Equalize", 0.0, 7), ("Equalize", 0.8, 8)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, 8)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, 9)),
    (("Color", 0.4, 0), ("Equalize", 0.6, 3)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
)


def num_slots(data) -> int:
    """Ops applied one after the other per image (L): N for RandAugment, 1 for
    TrivialAugment, 2 for AutoAugment's sub-policies, 0 without a policy."""
    policy = data.augment_policy
    return {"none": 0, "randaugment": data.randaugment_ops, "trivialaugment": 1}.get(policy, 2)


def describe(data) -> str:
    """The start-up line's words, e.g. "randaugment n2 m9 mstd0.5, random erasing 0.25";
    empty without a policy or erasing."""
    words = []
    if data.augment_policy == "randaugment":
        m, std = data.randaugment_magnitude, data.randaugment_magnitude_std
        words.append(f"randaugment n{data.randaugment_ops} m{m:g} mstd{std:g}")
    elif data.augment_policy != "none":
        words.append(data.augment_policy)
    if data.random_erasing > 0:
        words.append(f"random erasing {data.random_erasing:g}")
    return ", ".join(words)


def _arguments(rows, choice, level, sign):
    """The op ids and arguments of ``choice`` (indices into ``rows``, the table above) at
    ``level`` in [0, 1] with ``sign`` (+-1): (int32, float32), shaped as ``choice``."""
    table = tf.constant([row[1:5] for row in rows], tf.float32)
    op = tf.gather(tf.constant([row[0] for row in rows], tf.int32), choice)
    scale, offset, factor, rounding = tf.unstack(tf.gather(table, choice), axis=-1)
    signed = tf.gather(tf.constant([row[5] for row in rows]), choice)
    value = level * scale
    value = tf.where(rounding == _TRUNC, tf.floor(value), value)
    value = tf.where(rounding == _ROUND, tf.round(value), value)
    value = factor * value * tf.where(signed, sign, 1.0)
    return op, offset + value


def draw(key, shape, data) -> dict:
    """One batch's worth of draws for examples of ``shape`` ([] per example, [n] for n of
    them), from the stateless seeds ``key(stream)``: {"augment": {op, arg} of shape + [L]}
    with a policy, {"erase": ``draw_erasing``} with ``--random_erasing``."""
    out = {}
    slots = num_slots(data)
    if slots:
        full = list(shape) + [slots]
        uniform = lambda stream: tf.random.stateless_uniform(full, key(stream))  # noqa: E731
        sign = tf.where(uniform(_SIGN) < 0.5, -1.0, 1.0)
        out["augment"] = _draw_policy(data, full, key, uniform, sign)
    if data.random_erasing > 0:
        out["erase"] = draw_erasing(key, shape, data.image_size, data.random_erasing)
    return out


def _draw_policy(data, full, key, uniform, sign) -> dict:
    """{op, arg} [*full] of ``data.augment_policy`` (see ``draw``)."""
    pick = lambda count, stream: tf.random.stateless_uniform(  # noqa: E731
        full, key(stream), maxval=count, dtype=tf.int32
    )
    if data.augment_policy == "randaugment":
        rows = [_TIMM[name] for name in RAND_OPS]
        choice = pick(len(rows), _CHOICE)
        m = data.randaugment_magnitude
        if data.randaugment_magnitude_std > 0:
            noise = tf.random.stateless_normal(full, key(_LEVEL))
            m = m + data.randaugment_magnitude_std * noise
        level = tf.clip_by_value(m, 0.0, max(10.0, data.randaugment_magnitude)) / 10.0
        op, arg = _arguments(rows, choice, level * tf.ones(full), sign)
        op = tf.where(uniform(_APPLY) < 0.5, op, ops.IDENTITY)
    elif data.augment_policy == "trivialaugment":
        rows = _trivial_wide(data.image_size)
        level = tf.cast(pick(31, _LEVEL), tf.float32) / 30.0
        op, arg = _arguments(rows, pick(len(rows), _CHOICE), level, sign)
    else:  # autoaugment: one sub-policy per example, the same for its two slots
        rows = [_TIMM[name] for sub in AUTOAUGMENT for name, _, _ in sub]
        sub = tf.random.stateless_uniform(
            full[:-1], key(_CHOICE), maxval=len(AUTOAUGMENT), dtype=tf.int32
        )
        choice = sub[..., None] * 2 + tf.range(2)
        level = tf.constant([m / 10 for s in AUTOAUGMENT for _, _, m in s], tf.float32)
        prob = tf.constant([p for s in AUTOAUGMENT for _, p, _ in s], tf.float32)
        op, arg = _arguments(rows, choice, tf.gather(level, choice), sign)
        op = tf.where(uniform(_APPLY) < tf.gather(prob, choice), op, ops.IDENTITY)
    return {"op": op, "arg": arg}


def draw_erasing(key, shape, image_size: int, probability: float) -> dict:
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


def identity_draws(batch_size: int, data) -> dict:
    """Draws that change nothing (synthetic batches), shaped as ``draw``'s for a batch."""
    out = {}
    if num_slots(data):
        shape = [batch_size, num_slots(data)]
        out["augment"] = {"op": tf.zeros(shape, tf.int32), "arg": tf.zeros(shape)}
    if data.random_erasing > 0:
        out["erase"] = {
            "box": tf.zeros([batch_size, 4], tf.int32),
            "seed": tf.zeros([batch_size, 2], tf.int64),
        }
    return out


def apply(images, batch: dict):
    """float32 images [N, H, W, 3] in [0, 255] -> the same with ``batch``'s draws applied:
    the policy's ops slot by slot (on the images rounded to whole numbers, as PIL's uint8),
    then random erasing. Batches without those draws pass through."""
    if "augment" in batch:
        images = tf.round(images)
        op, arg = batch["augment"]["op"], batch["augment"]["arg"]
        for slot in range(op.shape[1]):
            images = ops.apply_ops(images, op[:, slot], arg[:, slot])
    if "erase" in batch:
        images = ops.erase(images, batch["erase"]["box"], batch["erase"]["seed"])
    return images
