"""The converter's manifest: what an input source lists and a worker writes.

An input (``tfgpu/convert/inputs/``) lists ``Item``s per split, or a ``LazySplit`` read range
by range; ``plan.py`` deals them into shards; ``worker.py`` writes them, ``encode.py``
encoding each. No TensorFlow.
"""

import random
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np


# A larger class index is an image number or an ID caught by mistake, and class names
# "0".."top" for it would fill memory (``range(10**12)``): both converter inputs refuse it.
MAX_CLASSES = 100_000
# The caps' defaults (``--max_file_mb``, ``--max_megapixels``): far above any photo or scan a
# classifier trains on, far below what fills a worker's memory.
DEFAULT_MAX_FILE_MB = 256
DEFAULT_MAX_MEGAPIXELS = 100

_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


class BadImage(ValueError):
    """An input that cannot become a record; the message is the reason recorded."""


def not_regular_reason(mode: int) -> str:
    """The skip reason of a file whose ``st_mode`` is not a regular file's."""
    return f"not a regular file: {_KINDS.get(stat.S_IFMT(mode), 'a special file')}"


@dataclass(frozen=True)
class ArrayRow:
    """Row ``index`` of the HDF5 dataset ``key`` in file ``path``, read by the worker."""

    path: str
    key: str
    index: int


@dataclass(frozen=True)
class Item:
    """One labelled image: encoded bytes, an HxWxC/HxW uint8 array, a file path or an
    ``ArrayRow``; ``filename`` is what the record and the skipped list call it."""

    source: bytes | np.ndarray | str | ArrayRow
    label: int
    filename: str


@dataclass(frozen=True)
class EncodeOptions:
    jpeg_quality: int = 95
    lossless: bool = False
    max_side: int = 0
    max_file_mb: int = DEFAULT_MAX_FILE_MB  # larger files are skipped unread
    max_megapixels: int = DEFAULT_MAX_MEGAPIXELS  # larger images are skipped undecoded
    # A grayscale image stays 1-channel instead of RGB (raw-pixel inputs: exact and 3x
    # smaller; the reader decodes every image to RGB anyway).
    keep_grayscale: bool = False
    # Keep each record's exact key, perceptual hashes and thumbnail (fingerprint.py) for the
    # duplicate check run once all shards are written (duplicates.py).
    check_duplicates: bool = False


@dataclass(frozen=True)
class LazySplit:
    """A split read in order, range by range (tensorflow-datasets, LMDB): ``load(start, end)``
    returns the Items of that range. Its shards are consecutive ranges, shuffled inside."""

    num_examples: int
    load: object  # callable (start, end) -> list[Item], called in the parent process

    def __len__(self) -> int:
        return self.num_examples


@dataclass
class Source:
    """A listed dataset: what ``plan.write_dataset`` needs, plus size estimates."""

    description: str
    class_names: list
    splits: dict  # split name -> list[Item] or LazySplit
    split_bytes: dict  # split name -> estimated bytes, for --shard_size_mb
    skipped: list = field(default_factory=list)  # {"file", "reason"} found while listing
    # Raw uint8 arrays (IDX, .npz, CIFAR): stored losslessly unless --lossless is given.
    raw_pixels: bool = False
    note: str = ""  # for the summary line, e.g. "t10k -> validation"


def split_items(items: Sequence[Item], validation_fraction: float, seed: int):
    """Splits items into (train, validation) with a seeded shuffle, per class (stratified)."""
    return stratified_split(items, validation_fraction, random.Random(seed), lambda i: i.label)


def stratified_split(entries: Sequence, validation_fraction: float, rng: random.Random, label):
    """(train, validation): each class's entries (``label(entry)``) shuffled by ``rng``, the
    first ``validation_fraction`` of them to validation; classes in label order."""
    train, validation = [], []
    by_class: dict = {}
    for entry in entries:
        by_class.setdefault(label(entry), []).append(entry)
    for key in sorted(by_class):
        group = by_class[key]
        rng.shuffle(group)
        n_val = round(len(group) * validation_fraction)
        validation += group[:n_val]
        train += group[n_val:]
    return train, validation


def items_from_arrays(images: np.ndarray, labels: Iterable[int], prefix: str) -> list[Item]:
    """Wraps an image array (N, H, W[, C]) and labels as Items named ``prefix/000123``."""
    return [Item(images[i], int(label), f"{prefix}/{i:06d}") for i, label in enumerate(labels)]
