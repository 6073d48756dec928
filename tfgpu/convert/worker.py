"""The converter's worker side: write one whole shard of images, each checked and encoded by
``encode.encode_image`` (HDF5 rows read a chunk at a time, files read as they come).

Nothing here imports TensorFlow. Workers are started fresh (``forkserver``), and importing
TensorFlow would cost each of them seconds and hundreds of MB; records are serialized and
framed by ``tfgpu/data/recordformat.py`` (the format the reader reads), which needs no
TensorFlow either.
"""

import os
from collections.abc import Iterator
from dataclasses import asdict

import numpy as np
from threadpoolctl import threadpool_limits

from tfgpu import compat
from tfgpu.convert import fingerprint
from tfgpu.convert.encode import encode_image, read_file, too_many_pixels
from tfgpu.convert.manifest import ArrayRow, BadImage, EncodeOptions
from tfgpu.files import open_new, write_json
from tfgpu.data.recordformat import encode_example, short_side_bucket, write_record

_H5_READ_BYTES = 64 << 20  # HDF5 rows are read this many bytes' worth at a time (one read)
_H5_MAX_ROWS = 64  # ... and at most this many rows: small images need no bigger reads
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
    if name.isascii():  # most names, once an image with the check on: a flag, not a copy
        return name
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
                    prints.add(look[0], look[1], item.label, display_name(item.filename), side)
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
        # Small products: BLAS threads would only spin. Short-lived arrays: ordinary pages.
        with threadpool_limits(1, "blas"), compat.numpy_small_pages():
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
                    yield item, read_file(source, options.max_file_mb)
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
            bad = BadImage(too_many_pixels((width, height), options.max_megapixels * 1_000_000))
            out.update({ArrayRow(path, key, i): bad for i in wanted})
            continue
        block = dataset[wanted]  # h5py needs increasing indices
        for index, row in zip(wanted, block):
            out[ArrayRow(path, key, index)] = row
    return out


def _close_h5_files() -> None:
    while _h5_files:
        _h5_files.popitem()[1].close()
