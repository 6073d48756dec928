"""Near-copies planted for the duplicate check, made one way by its tests
(tests/convert/test_near_copies_small.py) and its recall benchmark (bench/near_copies.py,
which puts tests/ on its path for this module): the transformations a copy of an image goes
through before it lands in a dataset again, and the bytes the converter reads.

``copy(tile, how, rng)`` makes one copy, ``how`` one of:

  q60        decoded, saved as JPEG at quality 60, decoded again
  resize     resized to 80-120% (uniform), bicubic
  resizeNN   resized to NN% (resize80, resize120), bicubic
  crop       each side cut by 0-5% of it (uniform, independently)
  crop5      one side (random) cut by 5%
  flip       mirrored left to right
  all        resize, crop, flip and q60, in that order

or several of them joined by ``+`` (applied in that order: ``resize120+crop+flip+q60``).
"""

import io

import numpy as np
from PIL import Image

ALL = "resize+crop+flip+q60"


def copy(tile: np.ndarray, how: str, rng: np.random.Generator) -> np.ndarray:
    """The copy ``how`` (module docstring) makes of ``tile``, a uint8 RGB (or L) array;
    ``rng`` draws the resize factor and the crops."""
    if how == "all":
        how = ALL
    if "+" in how:
        for step in how.split("+"):
            tile = copy(tile, step, rng)
        return tile
    image = Image.fromarray(tile)
    if how == "q60":
        decoded = Image.open(io.BytesIO(stored(tile, "jpeg", 60)))
        return np.asarray(decoded.convert(image.mode))
    if how.startswith("resize"):
        f = rng.uniform(0.8, 1.2) if how == "resize" else int(how[6:]) / 100
        size = (max(1, round(image.width * f)), max(1, round(image.height * f)))
        return np.asarray(image.resize(size, Image.BICUBIC))
    if how in ("crop", "crop5"):
        cut = rng.uniform(0, 0.05, 4) if how == "crop" else np.eye(4)[rng.integers(4)] * 0.05
        w, h = image.size
        box = (round(cut[0] * w), round(cut[1] * h), w - round(cut[2] * w), h - round(cut[3] * h))
        return np.asarray(image.crop(box))
    if how == "flip":
        return np.ascontiguousarray(tile[:, ::-1])
    raise ValueError(f"no such copy: {how!r} (q60, resize, resizeNN, crop, crop5, flip, all)")


def stored(tile: np.ndarray, fmt: str, quality: int = 90):
    """What the converter reads of ``tile`` stored as ``fmt``: JPEG (at ``quality``) or PNG
    bytes, or (``raw``) the array itself, as .npz, IDX and CIFAR inputs give them."""
    if fmt == "raw":
        return np.ascontiguousarray(tile)
    out = io.BytesIO()
    Image.fromarray(tile).save(out, "JPEG" if fmt == "jpeg" else "PNG", quality=quality)
    return out.getvalue()
