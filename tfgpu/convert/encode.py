"""One image checked and encoded for a shard (``encode_image``): read from its file without
blocking or reading past the size cap, its header checked against the pixel cap before it is
decoded, decoded whole, and passed through (an RGB JPEG that fits) or re-encoded as RGB JPEG
or PNG; the duplicate check's view of it taken from the pixels decoded anyway. The converter's
workers (``worker.write_shard``) call it for every image. No TensorFlow, as ``worker.py``.
"""

import io
import os
import re
import stat

import numpy as np
from PIL import Image, UnidentifiedImageError

from tfgpu.convert import fingerprint
from tfgpu.convert.manifest import (
    DEFAULT_MAX_FILE_MB,
    DEFAULT_MAX_MEGAPIXELS,
    BadImage,
    not_regular_reason,
)

_JPEG_MAGIC = b"\xff\xd8\xff"
_MB = 1 << 20


def encode_image(
    source,
    jpeg_quality: int = 95,
    lossless: bool = False,
    max_side: int = 0,
    max_file_mb: int = DEFAULT_MAX_FILE_MB,
    max_megapixels: int = DEFAULT_MAX_MEGAPIXELS,
    keep_grayscale: bool = False,
    look: list | None = None,
):
    """Returns ``(encoded, format, height, width)`` for one image, or raises BadImage.

    ``source`` is encoded bytes, a uint8 array or a file path. RGB JPEGs that need no
    resizing pass through byte for byte once they decode; anything else (PNG, grayscale,
    CMYK, alpha, BMP, GIF, arrays) becomes RGB JPEG, or PNG if ``lossless`` (an 8-bit
    grayscale one stays 1-channel with ``keep_grayscale``). A file that is
    not a regular one, or holds more than ``max_file_mb`` MB, is not read; an image of more
    than ``max_megapixels`` million pixels is not decoded (its header says its size).
    With a ``look`` list, the duplicate check's view of the image is appended to it: its
    exact key and what its 32x32 thumbnail is made of (``fingerprint.py``), from the pixels
    decoded anyway.
    """
    max_pixels = max_megapixels * 1_000_000
    # PIL refuses images over twice its own limit, whatever ours is: ours is the one.
    Image.MAX_IMAGE_PIXELS = max_pixels
    data = read_file(source, max_file_mb) if isinstance(source, str) else source
    if isinstance(data, np.ndarray):
        image = _from_array(data, max_pixels)
    elif not data:
        raise BadImage("empty file")
    elif len(data) > max_file_mb * _MB:
        raise BadImage(_too_many_bytes(len(data), max_file_mb))
    elif data[:3] == _JPEG_MAGIC:
        draft = _verify_jpeg(data, max_pixels)
        width, height = draft.info["size"]
        if draft.info["mode"] == "RGB" and not _too_big((width, height), max_side):
            if look is not None:  # the draft: each pixel a block's mean
                # libjpeg scales by 1/1, 1/2, 1/4 or 1/8, rounding sizes up
                step = next((s for s in (8, 4, 2, 1) if -(-width // s) == draft.width), 1)
                look += [fingerprint.jpeg_key(data), fingerprint.view(draft, step)]
            return bytes(data), "JPEG", height, width
        image = _decode(data, max_pixels)  # grayscale, CMYK or too big: re-encoded below
    else:
        image = _decode(data, max_pixels)
    if look is not None:
        look += _look(data, image)
    try:
        return _reencode(image, jpeg_quality, lossless, max_side, keep_grayscale)
    except Exception as err:  # noqa: BLE001 - an odd mode PIL cannot convert: skip, go on
        raise BadImage(f"cannot convert to RGB: {err}") from None


def _look(data, image: Image.Image) -> tuple:
    """The duplicate check's (exact key, view) of a decoded ``image`` (``fingerprint.py``),
    from the array it was made of when ``data`` is one (cheaper than PIL's copy of its
    pixels)."""
    if isinstance(data, np.ndarray):
        return fingerprint.of_array(data, image)
    return fingerprint.exact_key(image), fingerprint.view(image)


def _reencode(image: Image.Image, jpeg_quality, lossless, max_side, keep_grayscale=False):
    image = image if keep_grayscale and image.mode == "L" else _to_rgb(image)
    if _too_big(image.size, max_side):
        image.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    if lossless:
        image.save(out, format="PNG")
    else:
        image.save(out, format="JPEG", quality=jpeg_quality)
    return out.getvalue(), "PNG" if lossless else "JPEG", image.height, image.width


def _open(data: bytes, max_pixels: int) -> Image.Image:
    """The image ``data`` holds, its header read (nothing decoded yet); BadImage when it is
    not one, or when it has more than ``max_pixels`` pixels (a decompression bomb: a few kB
    of PNG can claim 100,000 x 100,000 pixels, 30 GB once decoded)."""
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise BadImage("not an image (unknown format)") from None
    except Image.DecompressionBombError as err:  # PIL's own check, at twice our cap
        claimed = re.search(r"\((\d+) pixels\)", str(err))
        raise BadImage(too_many_pixels(claimed and int(claimed[1]), max_pixels)) from None
    except Exception as err:  # noqa: BLE001 - PIL raises many types for bad data
        raise BadImage(f"cannot decode: {err}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise BadImage(too_many_pixels((width, height), max_pixels))
    return image


def too_many_pixels(size, max_pixels: int) -> str:
    """The skip reason of an image of ``size``: (width, height), a pixel count or None."""
    if isinstance(size, tuple):
        what = f"{size[0]}x{size[1]} pixels"
    else:
        what = f"{size} pixels" if size else "more pixels than PIL allows"
    return (
        f"image too large: {what}, over --max_megapixels={max_pixels // 1_000_000} "
        "(a decompression bomb?)"
    )


def _too_many_bytes(size: int, max_file_mb: int) -> str:
    return f"file too large: {size / _MB:.1f} MB, over --max_file_mb={max_file_mb}"


def _verify_jpeg(data: bytes, max_pixels: int) -> Image.Image:
    """A JPEG that decodes, decoded at reduced scale (1/8 from 256 px a side, less below:
    ``fingerprint.draft_size``), a colour one in grayscale (its full size
    and mode in ``info["size"]`` and ``info["mode"]``); raises BadImage otherwise.

    It decodes at reduced scale (libjpeg's DCT scaling): the entropy decoder still walks every
    coefficient of every block of every component, which is where truncated or corrupt
    data fails, but the full-size inverse DCT and colour conversion, which cannot fail on
    well-formed coefficients, are skipped. That makes the check ~40% cheaper than a full
    decode (0.72-0.74 against 1.2-1.3 CPU ms on 350-500 px JPEGs) and catches the same
    files (tests: truncated, cut and overwritten JPEGs, baseline and progressive). Only the
    luma of a colour JPEG is kept (it costs the same as the colour draft): it is the
    duplicate check's view of the image, with no conversion.
    """
    image = _open(data, max_pixels)
    try:
        mode, (width, height) = image.mode, image.size
        image.draft("L" if mode == "RGB" else mode, fingerprint.draft_size(width, height))
        image.load()
    except Exception as err:  # noqa: BLE001 - PIL raises many types for bad data
        raise BadImage(f"cannot decode: {err}") from None
    image.info.update(size=(width, height), mode=mode)
    return image


def _decode(data: bytes, max_pixels: int) -> Image.Image:
    """A fully decoded image, or BadImage with the reason."""
    image = _open(data, max_pixels)
    try:
        image.load()  # decodes fully: truncated or corrupt data fails here
        return image
    except Exception as err:  # noqa: BLE001 - PIL raises many types for bad data
        raise BadImage(f"cannot decode: {err}") from None


def read_file(path: str, max_file_mb: int = DEFAULT_MAX_FILE_MB) -> bytes:
    """The bytes of the regular file ``path``; BadImage for anything else (a FIFO would block
    for ever, /dev/zero never ends) and for a file over ``max_file_mb`` MB. Checked on the
    open file, whatever the listing saw: the entry may have been replaced since."""
    limit = max_file_mb * _MB
    try:
        # Non-blocking: opening a FIFO for reading would wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            os.close(fd)
            raise BadImage(
                not_regular_reason(info.st_mode)
                if not stat.S_ISREG(info.st_mode)
                else _too_many_bytes(info.st_size, max_file_mb)
            )
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)  # the file may grow while it is read
    except OSError as err:
        raise BadImage(f"cannot read: {err.strerror or err}") from None
    if len(data) > limit:
        raise BadImage(_too_many_bytes(len(data), max_file_mb))
    return data


def _from_array(array: np.ndarray, max_pixels: int) -> Image.Image:
    if (
        array.dtype != np.uint8
        or array.ndim not in (2, 3)
        or array.ndim == 3
        and array.shape[2] not in (1, 3, 4)
    ):
        raise BadImage(
            f"expected a uint8 HxW or HxWxC (C=1,3,4) array, got {array.dtype} {array.shape}"
        )
    if array.shape[0] * array.shape[1] > max_pixels:
        raise BadImage(too_many_pixels(array.shape[1::-1], max_pixels))
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    return Image.fromarray(np.ascontiguousarray(array))


def _too_big(size: tuple[int, int], max_side: int) -> bool:
    """True when an image of ``size`` (width, height) must shrink to fit ``--max_side``."""
    return max_side > 0 and max(size) > max_side


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        # Composite onto white: dropping alpha would expose arbitrary colours under it.
        image = image.convert("RGBA")
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image, mask=image.getchannel("A"))
        return background
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        # 16-bit/float grayscale: PIL's convert("RGB") would clip, not scale, to 8 bits.
        array = np.asarray(image, dtype=np.float64)
        top = array.max() or 1.0
        image = Image.fromarray(np.round(array * (255.0 / top)).astype(np.uint8))
    return image.convert("RGB")
