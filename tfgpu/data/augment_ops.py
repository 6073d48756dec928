"""The augmentation policies' ops, in one registry (``OPS``): PIL's image ops as timm's
``auto_augment.py`` calls them, each written for a whole batch, each image with its own
argument (``augment.py`` draws them and applies them, in three batched stages).

An op is one entry of ``OPS``, an ``Op``: its stage ("table", "blend" or "affine") and its
batched implementation, the Pillow call it reproduces (``tests/data/test_augment.py`` checks every
entry against it, eagerly and inside tf.data), and how each policy's level in [0, 1] becomes
its argument (a ``Level``, as timm's level functions). Its id, which the batch carries, is its
position in ``OPS``: ids live only in batches (never in checkpoints or files), and "Identity"
is 0, what batches without a policy hold. Which ops a policy draws, in which order, is the
policy's (``augment.py``: timm's and torchvision's lists).

Images are float32 [N, H, W, 3] holding whole numbers in [0, 255], as PIL's uint8 would, and
every op rounds as PIL does, so chains of ops stay within a grey level of PIL's.
"""

import dataclasses
import importlib
import math
from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from tfgpu import compat

FILL = 128.0  # timm's fill of geometric ops (its img_mean default)
STAGES = ("identity", "table", "blend", "affine")  # "identity": no stage, no fn


@dataclasses.dataclass(frozen=True)
class Level:
    """How a policy's level in [0, 1] becomes an op's argument, as timm's level functions:
    offset + factor x rounding(level x scale), negated half the time when ``signed``.
    ``rounding``: "none", "trunc" (Python's ``int``) or "round"; ``per_side``: the value is
    in pixels and the op takes a fraction of the side (the factor is divided by the size)."""

    scale: float = 0.0
    offset: float = 0.0
    factor: float = 1.0
    rounding: str = "none"
    signed: bool = False
    per_side: bool = False


NO_ARG = Level()  # an op that takes no argument: 0


class Tables(NamedTuple):
    """What a "table" op builds its tables from: ``levels`` float [1, 1, 256] (0..255),
    ``arg`` float [N, 1, 1], ``hist`` int32 [N, 3, 256] (each image's channel histograms),
    ``mean`` float [N, 1, 1] (its grey image's mean, rounded as PIL's ``int(m + 0.5)``)."""

    levels: tf.Tensor
    arg: tf.Tensor
    hist: tf.Tensor
    mean: tf.Tensor


@dataclasses.dataclass(frozen=True)
class Op:
    """One augmentation op. ``fn``, by ``stage``:

    - "table": ``fn(Tables) -> float [N or 1, 3 or 1, 256]``: each image's channel tables;
    - "blend": ``fn(images, grey) -> images``: what PIL's ``Image.blend`` mixes each image
      with (the op's argument is the blend's factor);
    - "affine": ``fn(arg [N], width, height) -> (a, b, c, d, e, f)``: PIL's
      ``Image.transform(AFFINE)`` data, output (x, y) reads input (a x + b y + c, d x + e y + f);
    - "identity": no ``fn``.

    ``pil(image, arg) -> image``: the Pillow call it reproduces (timm's), the tests' reference.
    Its level mappings (None: a policy cannot draw it): ``timm`` (timm's LEVEL_TO_ARG, for
    RandAugment and AutoAugment), ``original`` (AutoAugment's where the original paper's
    differs: timm's PosterizeOriginal), ``wide`` (TrivialAugmentWide's, torchvision's ranges).
    """

    stage: str
    fn: Callable | None
    pil: Callable
    timm: Level | None = None
    original: Level | None = None
    wide: Level | None = None


def select(mask, a, b):
    """``a`` where ``mask`` (bool [N] per image, or broadcastable to the images), else ``b``:
    as arithmetic, exact for whole numbers, because a broadcast ``tf.where`` over a batch
    costs ~10x an add on CPU (Select copies the mask out; measured 29 against 3 ms at 64 x
    224^2)."""
    m = tf.cast(mask, tf.float32)
    if m.shape.rank == 1:
        m = m[:, None, None, None]
    return b + m * (a - b)


def blend(degenerate, image, factor):
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
    return select(inside[None, :, :, None], padded, images)


# --- the ops' batched implementations -------------------------------------------------------


def _auto_contrast(t: Tables):
    """``ImageOps.autocontrast`` (cutoff 0): each channel stretched from its [lo, hi] to
    [0, 255]; float64 as PIL's Python floats, so the truncation agrees."""
    present = tf.cast(t.hist > 0, tf.float32)  # ArgMax has no GPU kernel for int32
    lo = tf.cast(tf.argmax(present, -1), tf.float64)[..., None]
    hi = 255.0 - tf.cast(tf.argmax(present[..., ::-1], -1), tf.float64)[..., None]
    scale = 255.0 / tf.maximum(hi - lo, 1.0)
    levels = tf.cast(t.levels, tf.float64)
    stretched = tf.clip_by_value(tf.floor(levels * scale - lo * scale), 0, 255)
    return tf.where(hi > lo, tf.cast(stretched, tf.float32), t.levels)


def _equalize(t: Tables):
    """``ImageOps.equalize``: PIL's integer formula per channel, lut[i] = (step // 2 +
    pixels below i) // step, step = (pixels - pixels of the top level) // 255."""
    present = tf.cast(t.hist > 0, tf.float32)  # ArgMax has no GPU kernel for int32
    top = 255 - tf.argmax(present[..., ::-1], -1, output_type=tf.int32)
    last = tf.gather(t.hist, top, batch_dims=2)[..., None]
    step = (tf.reduce_sum(t.hist, -1, keepdims=True) - last) // 255
    below = tf.cumsum(t.hist, -1, exclusive=True)
    lut = tf.cast((step // 2 + below) // tf.maximum(step, 1), tf.float32)
    keep = (step > 0) & (tf.reduce_sum(present, -1, keepdims=True) > 1)
    return tf.where(keep, tf.minimum(lut, 255.0), t.levels)


def _posterize(t: Tables):
    """``ImageOps.posterize``: keep the top ``arg`` bits."""
    drop = tf.pow(2.0, 8.0 - tf.clip_by_value(t.arg, 0.0, 8.0))
    return tf.floor(t.levels / drop) * drop


def _rotate(arg, width, height):
    """``Image.rotate(arg)``: ``arg`` degrees counter-clockwise about (w / 2, h / 2)."""
    angle = -arg * (math.pi / 180.0)
    cos, sin = tf.cos(angle), tf.sin(angle)
    c = -cos * width / 2 - sin * height / 2 + width / 2
    f = sin * width / 2 - cos * height / 2 + height / 2
    return cos, sin, c, -sin, cos, f


# --- the Pillow calls they reproduce (imported only when a reference runs: the tests) -------


def _pil(module: str):
    return importlib.import_module(f"PIL.{module}")


def _pil_geometry():
    """timm's keywords of its geometric ops: bilinear, fill 128."""
    return dict(resample=_pil("Image").BILINEAR, fillcolor=(int(FILL),) * 3)


def _pil_affine(image, data):
    return image.transform(image.size, _pil("Image").AFFINE, data, **_pil_geometry())


def _pil_posterize(image, arg):
    # Pillow 13 refuses 0 bits, which timm's Posterize at magnitude < 2.5 asks for: black.
    return _pil("ImageOps").posterize(image, int(arg)) if arg else image.point([0] * 768)


def _pil_enhance(kind: str):
    return lambda image, arg: getattr(_pil("ImageEnhance"), kind)(image).enhance(arg)


def _image_ops(function: str, takes_arg: bool = False):
    """``ImageOps.<function>(image)``, or ``(image, arg)`` when it ``takes_arg``."""

    def call(image, arg):
        ops = _pil("ImageOps")
        return getattr(ops, function)(image, arg) if takes_arg else getattr(ops, function)(image)

    return call


# --- the registry: an op's id is its position here ------------------------------------------

_ENHANCE = Level(1.8, 0.1)  # timm: 0.1 + 1.8 level
_WIDE_ENHANCE = Level(0.99, 1.0, signed=True)  # torchvision: 1 +- 0.99 level
_SHEAR, _WIDE_SHEAR = Level(0.3, signed=True), Level(0.99, signed=True)
_TRANSLATE = Level(0.45, signed=True)  # timm's TranslateRel: a fraction of the side
_WIDE_TRANSLATE = Level(32.0, rounding="trunc", signed=True, per_side=True)  # whole pixels

OPS = {
    "Identity": Op("identity", None, lambda image, arg: image, wide=NO_ARG),
    "AutoContrast": Op(
        "table",
        _auto_contrast,
        _image_ops("autocontrast"),
        timm=NO_ARG,
        wide=NO_ARG,
    ),
    "Equalize": Op(
        "table",
        _equalize,
        _image_ops("equalize"),
        timm=NO_ARG,
        wide=NO_ARG,
    ),
    "Invert": Op(
        "table",
        lambda t: 255.0 - t.levels,
        _image_ops("invert"),
        timm=NO_ARG,
    ),
    "Rotate": Op(
        "affine",
        _rotate,
        lambda image, arg: image.rotate(arg, **_pil_geometry()),
        timm=Level(30.0, signed=True),
        wide=Level(135.0, signed=True),
    ),
    "Posterize": Op(
        "table",
        _posterize,
        _pil_posterize,
        timm=Level(4.0, rounding="trunc"),
        original=Level(4.0, 4.0, rounding="trunc"),
        wide=Level(6.0, 8.0, -1.0, rounding="round"),  # 8 - round(6 level) bits
    ),
    "Solarize": Op(
        "table",
        lambda t: tf.where(t.levels < t.arg, t.levels, 255.0 - t.levels),
        _image_ops("solarize", takes_arg=True),
        timm=Level(256.0, rounding="trunc"),
        wide=Level(255.0, 255.0, -1.0),  # at 255 (1 - level)
    ),
    "SolarizeAdd": Op(
        "table",
        lambda t: tf.where(t.levels < 128, tf.minimum(t.levels + t.arg, 255.0), t.levels),
        lambda image, arg: image.point(
            [min(255, i + int(arg)) if i < 128 else i for i in range(256)] * 3
        ),
        timm=Level(110.0, rounding="trunc"),
    ),
    "Color": Op(
        "blend", lambda images, gray: gray, _pil_enhance("Color"), timm=_ENHANCE, wide=_WIDE_ENHANCE
    ),
    "Contrast": Op(
        "table",
        lambda t: blend(t.mean, t.levels, t.arg),
        _pil_enhance("Contrast"),
        timm=_ENHANCE,
        wide=_WIDE_ENHANCE,
    ),
    "Brightness": Op(
        "table",
        lambda t: blend(0.0, t.levels, t.arg),
        _pil_enhance("Brightness"),
        timm=_ENHANCE,
        wide=_WIDE_ENHANCE,
    ),
    "Sharpness": Op(
        "blend",
        lambda images, gray: smooth(images),
        _pil_enhance("Sharpness"),
        timm=_ENHANCE,
        wide=_WIDE_ENHANCE,
    ),
    "ShearX": Op(
        "affine",
        lambda arg, width, height: (1.0, arg, 0.0, 0.0, 1.0, 0.0),
        lambda image, arg: _pil_affine(image, (1, arg, 0, 0, 1, 0)),
        timm=_SHEAR,
        wide=_WIDE_SHEAR,
    ),
    "ShearY": Op(
        "affine",
        lambda arg, width, height: (1.0, 0.0, 0.0, arg, 1.0, 0.0),
        lambda image, arg: _pil_affine(image, (1, 0, 0, arg, 1, 0)),
        timm=_SHEAR,
        wide=_WIDE_SHEAR,
    ),
    "TranslateXRel": Op(
        "affine",
        lambda arg, width, height: (1.0, 0.0, arg * width, 0.0, 1.0, 0.0),
        lambda image, arg: _pil_affine(image, (1, 0, arg * image.size[0], 0, 1, 0)),
        timm=_TRANSLATE,
        wide=_WIDE_TRANSLATE,
    ),
    "TranslateYRel": Op(
        "affine",
        lambda arg, width, height: (1.0, 0.0, 0.0, 0.0, 1.0, arg * height),
        lambda image, arg: _pil_affine(image, (1, 0, 0, 0, 1, arg * image.size[1])),
        timm=_TRANSLATE,
        wide=_WIDE_TRANSLATE,
    ),
}
IDS = {name: i for i, name in enumerate(OPS)}  # name -> the id the batch carries
IDENTITY = IDS["Identity"]  # 0: what draws that change nothing hold
