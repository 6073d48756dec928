"""The converter's worker side: check and encode images, write one whole shard.

Nothing here imports TensorFlow. Workers are started fresh (``forkserver``), and importing
TensorFlow would cost each of them seconds and hundreds of MB; records are serialized and
framed by ``tfgpu/recordformat.py``, which needs no TensorFlow either.
"""

import io
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import asdict

import numpy as np
from PIL import Image, UnidentifiedImageError
from threadpoolctl import threadpool_limits

from tfgpu.convert import fingerprint
from tfgpu.convert.manifest import (
    DEFAULT_MAX_FILE_MB,
    DEFAULT_MAX_MEGAPIXELS,
    ArrayRow,
    BadImage,
    EncodeOptions,
    not_regular_reason,
)
from tfgpu.files import open_new, write_json
from tfgpu.recordformat import encode_example, short_side_bucket, write_record

_JPEG_MAGIC = b"\xff\xd8\xff"
_H5_READ_BYTES = 64 << 20  # HDF5 rows are read this many bytes' worth at a time (one read)
_H5_MAX_ROWS = 64  # ... and at most this many rows: small images need no bigger reads
_MB = 1 << 20


# --- images ---------------------------------------------------------------------------------


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
    data = _read_file(source, max_file_mb) if isinstance(source, str) else source
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


def _look(data, image: Image.Image) -> list:
    """The duplicate check's view of a decoded ``image`` (``fingerprint.py``), from the
    array it was made of when ``data`` is one (cheaper than PIL's copy of its pixels)."""
    if isinstance(data, np.ndarray):
        return list(fingerprint.of_array(data, image))
    return [fingerprint.exact_key(image), fingerprint.view(image)]


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
        raise BadImage(_too_many_pixels(claimed and int(claimed[1]), max_pixels)) from None
    except Exception as err:  # noqa: BLE001 - PIL raises many types for bad data
        raise BadImage(f"cannot decode: {err}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise BadImage(_too_many_pixels((width, height), max_pixels))
    return image


def _too_many_pixels(size, max_pixels: int) -> str:
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


def _read_file(path: str, max_file_mb: int = DEFAULT_MAX_FILE_MB) -> bytes:
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
        raise BadImage(_too_many_pixels(array.shape[1::-1], max_pixels))
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
    # those lines would bury the progress bar. Undecodable images are reported anyway, and
    # images over --max_megapixels (PIL's bomb warning) are skipped by name.
    warnings.simplefilter("ignore")


def serve(tasks, results, progress, output_dir: str, options: EncodeOptions) -> None:
    """A worker process's loop: takes ``(name, items)`` from ``tasks`` until None, writes each
    shard, and puts ``("start", name, pid, None)`` before it and ``("done", name, pid,
    counts)`` or ``("error", name, pid, why)`` after it on ``results``, so the parent knows
    which shard a worker that dies (the out-of-memory killer) was writing."""
    init_worker(progress)
    pid = os.getpid()
    while (task := tasks.get()) is not None:
        name, items = task
        results.put(("start", name, pid, None))
        try:
            results.put(("done", name, pid, write_shard(output_dir, name, items, options)))
        except Exception as err:  # noqa: BLE001 - reported by the parent in one line
            results.put(("error", name, pid, f"{type(err).__name__}: {err}"))


def display_name(name: str) -> str:
    """``name`` printable and JSON-safe: undecodable bytes of a file name become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def done_marker(name: str) -> str:
    """The hidden file that records a finished shard's counts until the dataset is done."""
    return f".{name}.json"


def fingerprints_file(name: str) -> str:
    """The hidden file beside the done marker that holds the duplicate check's arrays."""
    return f".{name}.npy"


def write_shard(output_dir: str, name: str, items: list, options: EncodeOptions) -> dict:
    """Encodes ``items`` in order into the shard ``output_dir/name`` and returns its counts.

    The shard is written as ``name.tmp``, synced and renamed when complete, then a done
    marker with the returned dict (``file``, ``num_examples``, ``per_class`` by label,
    ``short_sides`` {bucket: count}, ``skipped``, and with ``options.check_duplicates`` the
    records' ``fingerprints``, whose arrays go to a file of their own) is written beside
    it, so an interrupted run can keep it.
    """
    path = os.path.join(output_dir, name)
    count, per_class, skipped, sides = 0, {}, [], {}
    encode_options = asdict(options)
    check = encode_options.pop("check_duplicates")
    prints = fingerprint.Collector() if check else None
    with open_new(path + ".tmp") as f:
        for item, data in _load(items, options):
            look = [] if check else None
            try:
                if isinstance(data, BadImage):
                    raise data
                encoded, fmt, height, width = encode_image(data, **encode_options, look=look)
            except BadImage as err:
                skipped.append({"file": display_name(item.filename), "reason": str(err)})
            else:
                record = encode_example(encoded, item.label, height, width, fmt, item.filename)
                write_record(f, record)
                count += 1
                per_class[item.label] = per_class.get(item.label, 0) + 1
                side = short_side_bucket(height, width)
                sides[side] = sides.get(side, 0) + 1
                if check:
                    prints.add(*look, item.label, display_name(item.filename), side)
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
    return _mark_done(output_dir, name, result, prints)


def _mark_done(output_dir: str, name: str, result: dict, prints) -> dict:
    """Writes shard ``name``'s done marker (``result``) and, with ``prints`` (a
    ``fingerprint.Collector``), the check's arrays beside it (``fingerprints_file``);
    returns ``result``, with the fingerprints when there are some."""
    marker = result
    if prints is not None:
        with threadpool_limits(1, "blas"):  # small products: BLAS threads would only spin
            record = prints.record()
        rest = fingerprint.save(os.path.join(output_dir, fingerprints_file(name)), record)
        result, marker = dict(result, fingerprints=record), dict(result, fingerprints=rest)
    write_json(os.path.join(output_dir, done_marker(name)), marker, indent=None)
    return result


def _load(items: list, options: EncodeOptions) -> Iterator[tuple]:
    """Yields ``(item, data)``: bytes or an array to encode, or the BadImage it raised.

    HDF5 rows are read a chunk at a time (one sorted read per chunk), the chunk's rows
    chosen from the row size so that a read holds about ``_H5_READ_BYTES``; a row over the
    pixel cap is not read at all.
    """
    start = 0
    while start < len(items):
        chunk = items[start : start + _rows_per_read(items[start].source)]
        start += len(chunk)
        rows = _read_rows([it.source for it in chunk if isinstance(it.source, ArrayRow)], options)
        for item in chunk:
            source = item.source
            try:
                if isinstance(source, str):
                    yield item, _read_file(source, options.max_file_mb)
                elif isinstance(source, ArrayRow):
                    yield item, rows[source]
                else:
                    yield item, source
            except BadImage as err:
                yield item, err


def _h5_dataset(row: ArrayRow):
    import h5py

    if row.path not in _h5_files:
        _h5_files[row.path] = h5py.File(row.path, "r")
    return _h5_files[row.path][row.key]


def _row_bytes(dataset) -> int:
    return int(np.prod(dataset.shape[1:], dtype=object)) * dataset.dtype.itemsize


def _rows_per_read(source) -> int:
    """How many items to take at once: as many HDF5 rows as fit ``_H5_READ_BYTES``."""
    if not isinstance(source, ArrayRow):
        return _H5_MAX_ROWS
    return max(1, min(_H5_MAX_ROWS, _H5_READ_BYTES // max(1, _row_bytes(_h5_dataset(source)))))


def _read_rows(refs: list, options: EncodeOptions) -> dict:
    """{ArrayRow: uint8 array, or the BadImage of a row that is not read}."""
    out = {}
    for path, key in {(r.path, r.key) for r in refs}:
        dataset = _h5_dataset(ArrayRow(path, key, 0))
        wanted = sorted({r.index for r in refs if r.path == path and r.key == key})
        height, width = dataset.shape[1:3]
        if height * width > options.max_megapixels * 1_000_000:
            bad = BadImage(_too_many_pixels((width, height), options.max_megapixels * 1_000_000))
            out.update({ArrayRow(path, key, i): bad for i in wanted})
            continue
        block = dataset[wanted]  # h5py needs increasing indices
        for index, row in zip(wanted, block):
            out[ArrayRow(path, key, index)] = row
    return out


def _close_h5_files() -> None:
    while _h5_files:
        _h5_files.popitem()[1].close()
