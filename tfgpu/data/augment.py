"""Augmentation policies that honour the determinism contract: RandAugment, TrivialAugmentWide
and AutoAugment (``--augment_policy``), then random erasing (``--random_erasing``,
``erasing.py``).

Each example's random choices (which ops, their arguments, the erase box and its noise seed)
are drawn on the host from its stateless seed (``draw``: the per-example pipeline gives it
``host_ops`` streams, the in-memory path the same draws as vectors over an epoch) and ride
with the batch as small tensors, {"augment": {"op" int32 [N, L], "arg" float32 [N, L]},
"erase": {"box" int32 [N, 4], "seed" int64 [N, 2]}}; the device only applies them
(``apply``, vectorized over the batch). So what an example becomes depends on (seed, epoch,
position) alone, never on how the global batch is split.

The ops are ``augment_ops.OPS`` (one entry each); a policy names the ones it draws, in its
order (the draws index these lists, so an op joins a policy only on purpose), and takes each
op's argument from the op's ``Level`` for it. Magnitudes are timm's
(``timm/data/auto_augment.py``):

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

The ops of a slot are applied in three batched stages (``apply_ops``), each the identity for
images whose op belongs to another stage:

- "table" ops (AutoContrast, Equalize, Invert, Posterize, Solarize, SolarizeAdd, Contrast,
  Brightness) are, in PIL too, a 256-entry table per channel; here one table per image x
  channel [N, 3, 256] is built (from per-image histograms where needed) and applied with one
  gather;
- "blend" ops (Color with the image's grey, Sharpness with its 3x3 SMOOTH), masked per image;
- "affine" ops (Rotate, ShearX/Y, TranslateX/Y) as one ``ImageProjectiveTransformV3`` over
  the batch, an affine matrix per image (the identity for the others), fill 128 as timm;
  bilinear (timm picks bilinear or bicubic at random; TensorFlow's op has no bicubic).

Every op is masked, not partitioned by op (``tf.dynamic_partition``): the shapes stay static
(no group sizes that change every batch), a slot costs the same whatever its images drew, and
each image's result is exact integer arithmetic or a per-pixel formula, so it never depends on
the other images of the batch. The transform has no XLA kernel: under ``--jit_compile`` the
step applies the policy before XLA (``device_ops.augmented``).
"""

import tensorflow as tf

from tfgpu.data import erasing, rng_streams
from tfgpu.data.augment_ops import (
    FILL,
    IDENTITY,
    IDS,
    OPS,
    Tables,
    blend,
    grey,
    histograms,
    select,
)

# Stream ids of the draws (``rng_streams.AUGMENT``); the caller's ``key(stream)`` turns them into
# stateless seeds.
_CHOICE, _APPLY, _LEVEL, _SIGN = (
    rng_streams.AUGMENT[k] for k in ("choice", "apply", "level", "sign")
)

# timm's _RAND_TRANSFORMS: RandAugment's ops, in its order.
RAND_OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
# torchvision's TrivialAugmentWide._augmentation_space, in its order.
WIDE_OPS = (
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
)
# timm's auto_augment_policy_original: (op, probability, magnitude) pairs. Its
# PosterizeOriginal is Posterize at the original paper's levels (``Op.original``).
AUTOAUGMENT = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
    (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, 4), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, 7)),
    (("Posterize", 0.8, 5), ("Equalize", 1.0, 2)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, 8), ("Posterize", 0.4, 6)),
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
# Which of an op's level mappings (``augment_ops.Op``) each policy reads.
LEVELS = {
    "randaugment": lambda op: op.timm,
    "trivialaugment": lambda op: op.wide,
    "autoaugment": lambda op: op.original or op.timm,
}
_FLOAT, _TRUNC, _ROUND = 0, 1, 2
_ROUNDING = {"none": _FLOAT, "trunc": _TRUNC, "round": _ROUND}


def level_table(policy: str, names, image_size: int) -> list:
    """[(op id, scale, offset, factor, rounding, signed)]: the ``Level`` of each op of
    ``names`` under ``policy``, levels in pixels made fractions of ``image_size``."""
    out = []
    for name in names:
        level = LEVELS[policy](OPS[name])
        factor = level.factor / image_size if level.per_side else level.factor
        rounding = _ROUNDING[level.rounding]
        out.append((IDS[name], level.scale, level.offset, factor, rounding, level.signed))
    return out


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
    """The op ids and arguments of ``choice`` (indices into ``rows``, a ``level_table``) at
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
    with a policy, {"erase": ``erasing.draw``} with ``--random_erasing``."""
    out = {}
    slots = num_slots(data)
    if slots:
        full = list(shape) + [slots]
        uniform = lambda stream: tf.random.stateless_uniform(full, key(stream))  # noqa: E731
        sign = tf.where(uniform(_SIGN) < 0.5, -1.0, 1.0)
        out["augment"] = _draw_policy(data, full, key, uniform, sign)
    if data.random_erasing > 0:
        out["erase"] = erasing.draw(key, shape, data.image_size, data.random_erasing)
    return out


def _draw_policy(data, full, key, uniform, sign) -> dict:
    """{op, arg} [*full] of ``data.augment_policy`` (see ``draw``)."""
    pick = lambda count, stream: tf.random.stateless_uniform(  # noqa: E731
        full, key(stream), maxval=count, dtype=tf.int32
    )
    if data.augment_policy == "randaugment":
        rows = level_table("randaugment", RAND_OPS, data.image_size)
        choice = pick(len(rows), _CHOICE)
        m = data.randaugment_magnitude
        if data.randaugment_magnitude_std > 0:
            noise = tf.random.stateless_normal(full, key(_LEVEL))
            m = m + data.randaugment_magnitude_std * noise
        level = tf.clip_by_value(m, 0.0, max(10.0, data.randaugment_magnitude)) / 10.0
        op, arg = _arguments(rows, choice, level * tf.ones(full), sign)
        op = tf.where(uniform(_APPLY) < 0.5, op, IDENTITY)
    elif data.augment_policy == "trivialaugment":
        rows = level_table("trivialaugment", WIDE_OPS, data.image_size)
        level = tf.cast(pick(31, _LEVEL), tf.float32) / 30.0
        op, arg = _arguments(rows, pick(len(rows), _CHOICE), level, sign)
    else:  # autoaugment: one sub-policy per example, the same for its two slots
        names = [name for sub in AUTOAUGMENT for name, _, _ in sub]
        rows = level_table("autoaugment", names, data.image_size)
        sub = tf.random.stateless_uniform(
            full[:-1], key(_CHOICE), maxval=len(AUTOAUGMENT), dtype=tf.int32
        )
        choice = sub[..., None] * 2 + tf.range(2)
        level = tf.constant([m / 10 for s in AUTOAUGMENT for _, _, m in s], tf.float32)
        prob = tf.constant([p for s in AUTOAUGMENT for _, p, _ in s], tf.float32)
        op, arg = _arguments(rows, choice, tf.gather(level, choice), sign)
        op = tf.where(uniform(_APPLY) < tf.gather(prob, choice), op, IDENTITY)
    return {"op": op, "arg": arg}


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
            images = apply_ops(images, op[:, slot], arg[:, slot])
    if "erase" in batch:
        images = erasing.erase(images, batch["erase"]["box"], batch["erase"]["seed"])
    return images


# --- applying them: one slot's ops in three batched stages ----------------------------------


def _stage(stage: str) -> list:
    """[(id, Op)] of the ops of ``stage``, in registry order."""
    return [(i, op) for i, op in enumerate(OPS.values()) if op.stage == stage]


def _lookup_tables(images, gray, op, arg):
    """[N, 3, 256] float tables: each image's op if it is a "table" op, else the identity.
    ``gray`` [N, H, W, 1] is ``grey(images)`` (Contrast's mean)."""
    levels = tf.range(256, dtype=tf.float32)[None, None, :]
    pixels = tf.cast(tf.reduce_prod(tf.shape(gray)[1:3]), tf.int32)
    total = tf.reduce_sum(tf.cast(gray, tf.int32), [1, 2, 3])
    mean = tf.cast((2 * total + pixels) // (2 * pixels), tf.float32)[:, None, None]  # int(m+.5)
    tables = Tables(levels, arg[:, None, None], histograms(images), mean)
    lut = tf.broadcast_to(levels, [tf.shape(op)[0], 3, 256])
    for kind, entry in _stage("table"):
        lut = tf.where((op == kind)[:, None, None], entry.fn(tables), lut)
    return lut


def _apply_tables(images, lut):
    """One gather: pixel v of channel c of image i -> lut[i, c, v]."""
    n = tf.shape(images)[0]
    offset = tf.reshape(tf.range(n * 3) * 256, [-1, 1, 1, 3])
    return tf.gather(tf.reshape(lut, [-1]), tf.cast(images, tf.int32) + offset)


def _blends(images, gray, op, arg):
    """The "blend" ops (Color with the grey image, Sharpness with ``smooth``) in one blend; the
    other images blend with themselves, which leaves them exact (whole numbers)."""
    degenerate = images
    for kind, entry in _stage("blend"):
        degenerate = select(op == kind, entry.fn(images, gray), degenerate)
    return blend(degenerate, images, arg[:, None, None, None])


def affine_rows(op, arg, height, width):
    """[N, 6] PIL ``Image.transform(AFFINE)`` data (a, b, c, d, e, f) of each image's
    "affine" op (``Op``), pixel centres at +0.5 as PIL; the identity for other ops."""
    w, h = tf.cast(width, tf.float32), tf.cast(height, tf.float32)
    one, zero = tf.ones_like(arg), tf.zeros_like(arg)
    rows = [one, zero, zero, zero, one, zero]
    for kind, entry in _stage("affine"):
        mask = op == kind
        values = entry.fn(arg, w, h)
        rows = [tf.where(mask, value, row) for value, row in zip(values, rows)]
    return tf.stack(rows, axis=1)


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
    """images float32 [N, H, W, 3] (whole numbers in [0, 255]), op int32 [N] (``IDS``),
    arg float32 [N] (the op's argument: degrees, bits, threshold, factor, shear, fraction
    of the side) -> the images, each with its op applied."""
    gray = grey(images)
    images = _apply_tables(images, _lookup_tables(images, gray, op, arg))
    images = _blends(images, gray, op, arg)
    return _geometry(images, op, arg)
