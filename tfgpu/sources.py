"""Where the converter's images come from: image folders, HDF5 files, tensorflow-datasets.

Each ``*_source`` function checks its input, lists it without decoding anything, and returns
a ``Source``: class names, and per split a list of ``Item``s (file paths, HDF5 rows) or a
``LazySplit`` read range by range. Only the workers open the images. A bad input is a
``ConvertError`` with a one-line message naming the flag.
"""

import os
import random
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from tfgpu.convert import ArrayRow, ConvertError, Item, LazySplit, split_items

_SPLIT_DIRS = {"train": ("train",), "validation": ("validation", "val")}
_SIZE_SAMPLE = 1000  # files stat-ed to estimate a split's size for --shard_size_mb


@dataclass
class Source:
    """A listed dataset: what ``convert.write_dataset`` needs, plus size estimates."""

    description: str
    class_names: list
    splits: dict  # split name -> list[Item] or LazySplit
    split_bytes: dict  # split name -> estimated bytes, for --shard_size_mb
    skipped: list = field(default_factory=list)  # {"file", "reason"} found while listing


# --- image folders --------------------------------------------------------------------------


def folder_source(root: str, validation_fraction: float, seed: int) -> Source:
    """``root/<class>/.../<image>`` (split by ``validation_fraction``, stratified, seeded) or
    ``root/train/<class>/...`` with ``root/validation/`` (or ``val/``). Class names are the
    sorted folder names; hidden files and folders are ignored; files are not decoded here."""
    if not os.path.isdir(root):
        raise ConvertError(f"--input={root} is not a directory")
    root = os.path.abspath(root)  # one spelling, so a re-run recognises its own shards
    found = {split: _first_dir(root, names) for split, names in _SPLIT_DIRS.items()}
    skipped: list = []
    if found["train"]:
        tops = {s: os.path.join(root, d) for s, d in found.items() if d}
        folders, files = _list_dir(root, skipped, root)
        for name in folders + files:
            if name not in found.values():
                skipped.append({"file": name, "reason": "not in train/ or validation/"})
        classes = sorted({c for top in tops.values() for c in _list_dir(top, skipped, root)[0]})
        splits = {s: _class_items(top, classes, root, skipped) for s, top in tops.items()}
        if not found["validation"] and validation_fraction > 0:
            splits["train"], splits["validation"] = split_items(
                splits["train"], validation_fraction, seed
            )
    else:
        classes = _list_dir(root, skipped, root)[0]
        items = _class_items(root, classes, root, skipped)
        splits = dict(zip(("train", "validation"), split_items(items, validation_fraction, seed)))
    if not classes:
        raise ConvertError(f"--input={root} holds no class folders (expected ROOT/<class>/<image>)")
    splits = {s: items for s, items in splits.items() if items}
    if "train" not in splits:
        raise ConvertError(f"--input={root} holds no images in its class folders")
    sizes = {s: _estimate_bytes(items) for s, items in splits.items()}
    return Source(f"image folders {root}", classes, splits, sizes, skipped)


def _first_dir(root: str, names: tuple) -> str:
    return next((n for n in names if os.path.isdir(os.path.join(root, n))), "")


def _list_dir(path: str, skipped: list, root: str) -> tuple[list, list]:
    """Sorted (sub-folder names, file names) of ``path``; unreadable ones are recorded."""
    folders, files = [], []
    try:
        entries = list(os.scandir(path))
    except OSError as err:
        skipped.append(
            {"file": os.path.relpath(path, root), "reason": f"cannot list: {err.strerror}"}
        )
        return [], []
    for entry in entries:
        if entry.name.startswith("."):
            continue  # .DS_Store, .git, editors' temp files: never data
        if entry.is_dir(follow_symlinks=False):
            folders.append(entry.name)
        elif entry.is_symlink() and entry.is_dir():
            rel = os.path.relpath(entry.path, root)
            skipped.append({"file": rel, "reason": "symlink to a folder, not followed"})
        else:
            files.append(entry.name)
    return sorted(folders), sorted(files)


def _class_items(top: str, classes: list, root: str, skipped: list) -> list:
    """Items of every file under ``top/<class>/`` (any depth), labelled by class index."""
    items = []
    for name in _list_dir(top, skipped, root)[1]:
        rel = os.path.relpath(os.path.join(top, name), root)
        skipped.append({"file": rel, "reason": "not inside a class folder"})
    for label, name in enumerate(classes):
        if not os.path.isdir(os.path.join(top, name)):
            continue  # a class with no images in this split
        pending = [os.path.join(top, name)]
        while pending:
            folder = pending.pop()
            subfolders, files = _list_dir(folder, skipped, root)
            for file in files:
                path = os.path.join(folder, file)
                items.append(Item(path, label, os.path.relpath(path, root)))
            pending += [os.path.join(folder, s) for s in reversed(subfolders)]
    return items


def _estimate_bytes(items: list) -> int:
    sample = random.Random(0).sample(items, min(len(items), _SIZE_SAMPLE))
    total = 0
    for item in sample:
        try:
            total += os.path.getsize(item.source)
        except OSError:
            pass
    return total * len(items) // max(len(sample), 1)


# --- HDF5 -----------------------------------------------------------------------------------


def hdf5_source(
    path: str, images_key: str, labels_key: str, validation_fraction: float, seed: int
) -> Source:
    """An HDF5 file with a uint8 image dataset (N, H, W[, C]) and an integer label dataset
    (N,), named ``images_key`` and ``labels_key``, either at the top or in groups ``train``
    and ``validation``. Class names come from a ``class_names`` attribute of the labels (or
    of the file), else are the label numbers. Rows are read by the workers, in chunks."""
    import h5py

    path = os.path.abspath(path)
    try:
        with h5py.File(path, "r") as f:
            groups = [g for g in ("train", "validation", "val") if isinstance(f.get(g), h5py.Group)]
            prefixes = {("validation" if g == "val" else g): f"{g}/" for g in groups} or {"": ""}
            arrays = {
                s: _h5_arrays(f, p, images_key, labels_key, path) for s, p in prefixes.items()
            }
            names = _h5_class_names(f, f"{next(iter(prefixes.values()))}{labels_key}")
    except OSError as err:
        raise ConvertError(f"--input={path} is not a readable HDF5 file: {err}") from None
    top = max(int(labels.max(initial=-1)) for _, labels, _ in arrays.values())
    low = min(int(labels.min(initial=0)) for _, labels, _ in arrays.values())
    if low < 0:
        raise ConvertError(f"--hdf5_labels={labels_key} in {path} holds negative labels")
    names = names or [str(i) for i in range(top + 1)]
    if top >= len(names):
        raise ConvertError(f"{path}: label {top} but only {len(names)} class_names")
    splits = {}
    for split, (key, labels, _row_bytes) in arrays.items():
        items = [Item(ArrayRow(path, key, i), int(y), f"{key}[{i}]") for i, y in enumerate(labels)]
        splits[split] = items
    if "" in splits:
        splits = dict(
            zip(("train", "validation"), split_items(splits.pop(""), validation_fraction, seed))
        )
    splits = {s: items for s, items in splits.items() if items}
    if "train" not in splits:
        raise ConvertError(f"--input={path} holds no training images")
    # Re-encoded as JPEG, a uint8 array shrinks about 8-fold (a guess; only for shard sizes).
    sizes = {
        s: len(items) * arrays.get(s, next(iter(arrays.values())))[2] // 8
        for s, items in splits.items()
    }
    return Source(f"HDF5 {path} ({images_key}, {labels_key})", names, splits, sizes)


def _h5_arrays(f, prefix: str, images_key: str, labels_key: str, path: str) -> tuple:
    """(images dataset name, labels as int64 array, bytes per image), checked."""
    import h5py

    images, labels = f.get(prefix + images_key), f.get(prefix + labels_key)
    for flag, key, data in (
        ("hdf5_images", images_key, images),
        ("hdf5_labels", labels_key, labels),
    ):
        if not isinstance(data, h5py.Dataset):
            raise ConvertError(f"--{flag}={key}: no dataset {prefix + key} in {path}")
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise ConvertError(
            f"--hdf5_images={images_key}: {path} holds {images.dtype} {images.shape}, "
            "expected uint8 (N, H, W) or (N, H, W, C)"
        )
    if (
        labels.dtype.kind not in "iu"
        or labels.ndim not in (1, 2)
        or labels.shape[0] != images.shape[0]
    ):
        raise ConvertError(
            f"--hdf5_labels={labels_key}: {path} holds {labels.dtype} {labels.shape}, "
            f"expected {images.shape[0]} integer labels"
        )
    values = np.asarray(labels[...], dtype=np.int64).reshape(images.shape[0], -1)[:, 0]
    return prefix + images_key, values, int(np.prod(images.shape[1:]))


def _h5_class_names(f, labels_name: str) -> list:
    for owner in (f[labels_name], f):
        names = owner.attrs.get("class_names")
        if names is not None:
            return [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    return []


# --- tensorflow-datasets --------------------------------------------------------------------


def tfds_source(name: str, data_dir: str, validation_fraction: float) -> Source:
    """A tensorflow-datasets dataset already prepared in ``data_dir`` (nothing is
    downloaded). Its first Image feature and first ClassLabel feature are used; the
    validation split is ``validation``, else ``test``, else the last ``validation_fraction``
    of ``train``. Images are read as stored (SkipDecoding), a shard's range at a time."""
    import tensorflow_datasets as tfds

    builder = _tfds_builder(tfds, name, data_dir)
    features = builder.info.features
    image_key = next((k for k, v in features.items() if isinstance(v, tfds.features.Image)), None)
    label_key = next(
        (k for k, v in features.items() if isinstance(v, tfds.features.ClassLabel)), None
    )
    if image_key is None or label_key is None:
        raise ConvertError(f"--tfds_name={name} has no Image and ClassLabel features to convert")
    available = {k: v.num_examples for k, v in builder.info.splits.items()}
    if "train" not in available:
        raise ConvertError(f"--tfds_name={name} has no train split (it has {sorted(available)})")
    ranges = {"train": ("train", 0, available["train"])}
    other = next((s for s in ("validation", "test") if s in available), None)
    if other:
        ranges["validation"] = (other, 0, available[other])
    elif validation_fraction > 0:
        cut = available["train"] - round(available["train"] * validation_fraction)
        ranges = {"train": ("train", 0, cut), "validation": ("train", cut, available["train"])}
    read = partial(_tfds_read, tfds, builder, image_key, label_key, name)
    splits = {
        s: LazySplit(end - start, partial(read, split, start))
        for s, (split, start, end) in ranges.items()
    }
    total = sum(available.values())
    nbytes = builder.info.dataset_size or 0
    sizes = {s: int(nbytes) * len(v) // max(total, 1) for s, v in splits.items()}
    described = ", ".join(f"{s}={split}[{a}:{b}]" for s, (split, a, b) in ranges.items())
    return Source(
        f"tensorflow-datasets {name} in {data_dir} ({described})",
        features[label_key].names,
        splits,
        sizes,
    )


def _tfds_builder(tfds, name: str, data_dir: str):
    if not data_dir or not os.path.isdir(data_dir):
        raise ConvertError(f"--tfds_data_dir={data_dir!r} is not a directory")
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as err:  # noqa: BLE001 - tfds raises several types for unknown names
        raise ConvertError(f"--tfds_name={name}: {str(err).splitlines()[0]}") from None
    if not builder.info.splits:
        raise ConvertError(
            f"--tfds_name={name} is not prepared in --tfds_data_dir={data_dir} (this tool does not "
            "download: run tfds build or download_and_prepare first)"
        )
    return builder


def _tfds_read(tfds, builder, image_key, label_key, name, split, base, start, end) -> list:
    """Items of ``split[base + start : base + end]``, images as their stored bytes."""
    a, b = base + start, base + end
    data = builder.as_dataset(
        split=f"{split}[{a}:{b}]",
        decoders={image_key: tfds.decode.SkipDecoding()},
        shuffle_files=False,
    )
    names = "file_name" in builder.info.features
    return [
        Item(
            bytes(ex[image_key]),
            int(ex[label_key]),
            ex["file_name"].decode("utf-8", "surrogateescape")
            if names
            else f"{name}/{split}[{a + i}]",
        )
        for i, ex in enumerate(tfds.as_numpy(data))
    ]
