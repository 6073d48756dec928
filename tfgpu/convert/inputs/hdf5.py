"""HDF5 files: a uint8 image dataset and an integer label dataset, at the top or per split."""

import os

import numpy as np

from tfgpu.errors import ConvertError
from tfgpu.convert.manifest import MAX_CLASSES, ArrayRow, Item, Source, split_items


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
    if top >= MAX_CLASSES and not names:
        raise ConvertError(
            f"--hdf5_labels={labels_key} in {path} holds label {top}: expected class indices "
            f"below {MAX_CLASSES} (or a class_names attribute naming every class)"
        )
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
        or labels.ndim == 2
        and not labels.shape[1]
    ):
        raise ConvertError(
            f"--hdf5_labels={labels_key}: {path} holds {labels.dtype} {labels.shape}, "
            f"expected {images.shape[0]} integer labels"
        )
    # A label per row: the first column of an (N, k) dataset, read alone.
    values = np.asarray(labels[:, 0] if labels.ndim == 2 else labels[...], dtype=np.int64)
    return prefix + images_key, values, int(np.prod(images.shape[1:], dtype=object))


def _h5_class_names(f, labels_name: str) -> list:
    for owner in (f[labels_name], f):
        names = owner.attrs.get("class_names")
        if names is not None:
            return [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    return []
