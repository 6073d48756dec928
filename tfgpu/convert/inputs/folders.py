"""Image folders: ``ROOT/<class>/.../<image>`` or ``ROOT/train|validation/<class>/...``."""

import os
import random

from tfgpu.convert.inputs import idx, npz
from tfgpu.errors import ConvertError
from tfgpu.convert.manifest import Item, Source, not_regular_reason, split_items

_SPLIT_DIRS = {"train": ("train",), "validation": ("validation", "val")}
_SIZE_SAMPLE = 1000  # files stat-ed to estimate a split's size for --shard_size_mb


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
        raise ConvertError(f"--input={root} holds no class folders{_instead(root)}")
    splits = {s: items for s, items in splits.items() if items}
    if "train" not in splits:
        raise ConvertError(f"--input={root} holds no images in its class folders")
    sizes = {s: _estimate_bytes(items) for s, items in splits.items()}
    return Source(f"image folders {root}", classes, splits, sizes, skipped)


def _instead(root: str) -> str:
    """What a folder without class folders holds instead, and what to pass then: an .npz,
    HDF5 or IDX file of its own is an input (IDX files need MNIST's names to say their split)."""
    files = sorted(e.name for e in os.scandir(root) if e.is_file() and not e.name.startswith("."))
    paths = [os.path.join(root, name) for name in files]
    arrays = [p for p in paths if p.endswith((".npz", ".h5", ".hdf5")) or npz.is_npz(p)]
    if arrays:
        named = ", ".join(os.path.basename(p) for p in arrays)
        return f" but {named}: pass the file itself, --input={arrays[0]}"
    idx_like = [os.path.basename(p) for p in paths if idx.looks_like_idx(p)]
    if idx_like:
        return (
            f" but IDX files under other names than MNIST's ({', '.join(idx_like[:4])}): name "
            "them train-images-idx3-ubyte, train-labels-idx1-ubyte (and t10k-... for the test "
            "split), .gz or not"
        )
    return " (expected ROOT/<class>/<image>, or ROOT/train|validation/<class>/<image>)"


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
        elif entry.is_file():  # a regular file, or a symlink to one
            files.append(entry.name)
        else:
            rel = os.path.relpath(entry.path, root)
            skipped.append({"file": rel, "reason": _not_a_file(entry)})
    return sorted(folders), sorted(files)


def _not_a_file(entry: os.DirEntry) -> str:
    """Why an entry that is neither a folder nor a regular file is skipped: a FIFO would
    block the reader for ever, a link to /dev/zero would fill its memory."""
    if entry.is_symlink() and entry.is_dir():
        return "symlink to a folder, not followed"
    try:
        mode = entry.stat().st_mode  # follows a symlink: what it points to
    except OSError as err:
        return f"cannot read: {err.strerror}" + (
            " (a broken symlink)" if entry.is_symlink() else ""
        )
    reason = not_regular_reason(mode)
    return f"{reason} (through a symlink)" if entry.is_symlink() else reason


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
