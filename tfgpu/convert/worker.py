"""The converter's worker side: check and encode images, write one whole shard.

Nothing here imports TensorFlow. Workers are started fresh (``forkserver``), and importing
TensorFlow would cost each of them seconds and hundreds of MB; records are serialized and
framed by ``tfgpu/recordformat.py``, which needs no TensorFlow either.
"""

import io
import os
from collections.abc import Iterator

import numpy as np
from PIL import Image, UnidentifiedImageError

from tfgpu.convert.items import ArrayRow, BadImage, EncodeOptions
from tfgpu.files import open_new, write_json
from tfgpu.recordformat import encode_example, short_side_bucket, write_record

_JPEG_MAGIC = b"\xff\xd8\xff"
_H5_CHUNK = 64  # rows read from HDF5 at once: one read per chunk, memory stays small


# --- images ---------------------------------------------------------------------------------


def encode_image(source, jpeg_quality: int = 95, lossless: bool = False, max_side: int = 0):
    """Returns ``(encoded, format, height, width)`` for one image, or raises BadImage.

    ``source`` is encoded bytes, a uint8 array or a file path. RGB JPEGs that need no
    resizing pass through byte for byte once they decode; anything else (PNG, grayscale,
    CMYK, alpha, BMP, GIF, arrays) becomes RGB JPEG, or PNG if ``lossless``.
    """
    data = _read_file(source) if isinstance(source, str) else source
    if isinstance(data, np.ndarray):
        image = _from_array(data)
    elif not data:
        raise BadImage("empty file")
    elif data[:3] == _JPEG_MAGIC:
        mode, height, width = _verify_jpeg(data)
        if mode == "RGB" and not _too_big((width, height), max_side):
            return bytes(data), "JPEG", height, width
        image = _decode(data)  # grayscale, CMYK or too big: re-encoded below
    else:
        image = _decode(data)
    try:
        return _reencode(image, jpeg_quality, lossless, max_side)
    except Exception as err:  # noqa: BLE001 - an odd mode PIL cannot convert: skip, go on
        raise BadImage(f"cannot convert to RGB: {err}") from None


def _reencode(image: Image.Image, jpeg_quality: int, lossless: bool, max_side: int):
    image = _to_rgb(image)
    if _too_big(image.size, max_side):
        image.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    if lossless:
        image.save(out, format="PNG")
    else:
        image.save(out, format="JPEG", quality=jpeg_quality)
    return out.getvalue(), "PNG" if lossless else "JPEG", image.height, image.width


def _verify_jpeg(data: bytes) -> tuple[str, int, int]:
    """(mode, height, width) of a JPEG that decodes; raises BadImage otherwise.

    It decodes at 1/8 scale (libjpeg's DCT scaling): the entropy decoder still walks every
    coefficient of every block, which is where truncated or corrupt data fails, but the
    full-size inverse DCT and colour conversion, which cannot fail on well-formed
    coefficients, are skipped. That makes the check ~40% cheaper than a full decode
    (0.60 against 0.95-1.0 CPU ms on 350-500 px JPEGs) and catches the same files (tests).
    """
    try:
        image = Image.open(io.BytesIO(data))
        mode, (width, height) = image.mode, image.size
        image.draft(mode, (max(1, width // 8), max(1, height // 8)))
        image.load()
    except UnidentifiedImageError:
        raise BadImage("not an image (unknown format)") from None
    except Exception as err:  # noqa: BLE001 - PIL raises many types for bad data
        raise BadImage(f"cannot decode: {err}") from None
    return mode, height, width


def _decode(data: bytes) -> Image.Image:
    """A fully decoded image, or BadImage with the reason."""
    try:
        image = Image.open(io.BytesIO(data))
        image.load()  # decodes fully: truncated or corrupt data fails here
        return image
    except UnidentifiedImageError:
        raise BadImage("not an image (unknown format)") from None
    except Exception as err:  # noqa: BLE001 - PIL raises many types for bad data
        raise BadImage(f"cannot decode: {err}") from None


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise BadImage(f"cannot read: {err.strerror or err}") from None


def _from_array(array: np.ndarray) -> Image.Image:
    if (
        array.dtype != np.uint8
        or array.ndim not in (2, 3)
        or array.ndim == 3
        and array.shape[2] not in (1, 3, 4)
    ):
        raise BadImage(
            f"expected a uint8 HxW or HxWxC (C=1,3,4) array, got {array.dtype} {array.shape}"
        )
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


# --- shards ---------------------------------------------------------------------------------

_progress = None  # a shared counter of images done, set by init_worker
_h5_files: dict = {}  # HDF5 files open while a shard is written, by path


def init_worker(progress) -> None:
    """Pool initializer: keep the shared progress counter; leave Ctrl-C to the parent, which
    stops the pool itself (workers that each print a KeyboardInterrupt help nobody)."""
    import signal
    import warnings

    global _progress
    _progress = progress
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # PIL warns about odd metadata (EXIF, ICC) of images that decode fine; in N workers
    # those lines would bury the progress bar. Undecodable images are reported anyway.
    warnings.simplefilter("ignore")


def display_name(name: str) -> str:
    """``name`` printable and JSON-safe: undecodable bytes of a file name become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def done_marker(name: str) -> str:
    """The hidden file that records a finished shard's counts until the dataset is done."""
    return f".{name}.json"


def write_shard(output_dir: str, name: str, items: list, options: EncodeOptions) -> dict:
    """Encodes ``items`` in order into the shard ``output_dir/name`` and returns its counts.

    The shard is written as ``name.tmp``, synced and renamed when complete, then a done
    marker with the returned dict (``file``, ``num_examples``, ``per_class`` by label,
    ``short_sides`` {bucket: count}, ``skipped``) is written beside it, so an interrupted
    run can keep it.
    """
    path = os.path.join(output_dir, name)
    count, per_class, skipped, sides = 0, {}, [], {}
    with open_new(path + ".tmp") as f:
        for item, data in _load(items):
            try:
                if isinstance(data, BadImage):
                    raise data
                encoded, fmt, height, width = encode_image(
                    data, options.jpeg_quality, options.lossless, options.max_side
                )
            except BadImage as err:
                skipped.append({"file": display_name(item.filename), "reason": str(err)})
            else:
                record = encode_example(encoded, item.label, height, width, fmt, item.filename)
                write_record(f, record)
                count += 1
                per_class[item.label] = per_class.get(item.label, 0) + 1
                side = short_side_bucket(height, width)
                sides[side] = sides.get(side, 0) + 1
            if _progress is not None:
                with _progress.get_lock():
                    _progress.value += 1
        f.flush()
        os.fsync(f.fileno())  # the rename must not outlive the data in a crash
    _close_h5_files()
    os.replace(path + ".tmp", path)
    result = {
        "file": name,
        "num_examples": count,
        "per_class": per_class,
        "short_sides": {str(k): v for k, v in sorted(sides.items())},
        "skipped": skipped,
    }
    write_json(os.path.join(output_dir, done_marker(name)), result)
    return result


def _load(items: list) -> Iterator[tuple]:
    """Yields ``(item, data)``: bytes or an array to encode, or the BadImage it raised.

    HDF5 rows are read ``_H5_CHUNK`` at a time with one sorted read per chunk.
    """
    for start in range(0, len(items), _H5_CHUNK):
        chunk = items[start : start + _H5_CHUNK]
        rows = _read_rows([it.source for it in chunk if isinstance(it.source, ArrayRow)])
        for item in chunk:
            source = item.source
            try:
                if isinstance(source, str):
                    yield item, _read_file(source)
                elif isinstance(source, ArrayRow):
                    yield item, rows[source]
                else:
                    yield item, source
            except BadImage as err:
                yield item, err


def _read_rows(refs: list) -> dict:
    if not refs:
        return {}
    import h5py

    out = {}
    for path, key in {(r.path, r.key) for r in refs}:
        if path not in _h5_files:
            _h5_files[path] = h5py.File(path, "r")
        wanted = sorted({r.index for r in refs if r.path == path and r.key == key})
        block = _h5_files[path][key][wanted]  # h5py needs increasing indices
        for index, row in zip(wanted, block):
            out[ArrayRow(path, key, index)] = row
    return out


def _close_h5_files() -> None:
    while _h5_files:
        _h5_files.popitem()[1].close()
