"""Turns labelled images into sharded TFRecords plus a ``dataset_info.json``.

The library half of ``tools/to_tfrecord.py``; the built-in demo dataset is made with it too.
A source yields ``Item``s; ``encode_image`` checks and (re-)encodes each image;
``write_dataset`` shuffles the items, writes balanced shards under temporary names, renames
them when complete and writes ``dataset_info.json`` last, so a dataset that has one is whole.
"""

import io
import json
import os
import random
from dataclasses import dataclass
from typing import Iterable, Sequence, Union

import numpy as np
import tensorflow as tf
from PIL import Image

from tfgpu import records

INFO_FILE = "dataset_info.json"
_JPEG_MAGIC = b"\xff\xd8\xff"


class BadImage(ValueError):
    """An input that cannot become a record; the message is the reason recorded."""


@dataclass(frozen=True)
class Item:
    """One labelled image: encoded bytes, an HxWxC/HxW uint8 array, or a file path."""

    source: Union[bytes, np.ndarray, str]
    label: int
    filename: str


def _load(source) -> bytes | np.ndarray:
    if isinstance(source, str):
        with open(source, "rb") as f:
            return f.read()
    return source


def encode_image(source, jpeg_quality: int = 95, lossless: bool = False, max_side: int = 0):
    """Returns ``(encoded, format, height, width)`` for one image, or raises BadImage.

    RGB JPEGs that need no resizing pass through byte for byte once they decode; anything
    else (PNG, grayscale, CMYK, alpha, BMP, GIF, arrays) becomes RGB JPEG, or PNG if lossless.
    """
    data = _load(source)
    if isinstance(data, np.ndarray):
        image = Image.fromarray(data.astype(np.uint8))
    else:
        if not data:
            raise BadImage("empty file")
        try:
            image = Image.open(io.BytesIO(data))
            image.load()  # decodes fully: truncated or corrupt data fails here
        except Exception as err:  # PIL raises many types for bad data
            raise BadImage(f"cannot decode: {err}") from None
        if data.startswith(_JPEG_MAGIC) and image.mode == "RGB" and not _too_big(image, max_side):
            return data, "JPEG", image.height, image.width
    if getattr(image, "n_frames", 1) > 1:
        image.seek(0)
    image = _to_rgb(image)
    if _too_big(image, max_side):
        image.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    if lossless:
        image.save(out, format="PNG")
    else:
        image.save(out, format="JPEG", quality=jpeg_quality)
    return out.getvalue(), "PNG" if lossless else "JPEG", image.height, image.width


def _too_big(image: Image.Image, max_side: int) -> bool:
    return max_side > 0 and max(image.size) > max_side


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        # Composite onto white: dropping alpha would expose arbitrary colours under it.
        image = image.convert("RGBA")
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image, mask=image.getchannel("A"))
        return background
    return image.convert("RGB")


def shard_names(split: str, num_shards: int) -> list[str]:
    """``train-00000-of-00004.tfrecord`` ... for a split."""
    return [f"{split}-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards)]


def write_split(
    items: Sequence[Item],
    split: str,
    output_dir: str,
    num_shards: int,
    seed: int = 0,
    jpeg_quality: int = 95,
    lossless: bool = False,
    max_side: int = 0,
) -> dict:
    """Writes one split's shards; returns its ``dataset_info`` entry (shards, counts, skipped).

    Items are shuffled with ``seed`` first, so class-sorted input makes mixed shards, and
    dealt round-robin, so shard sizes differ by at most one record.
    """
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    names = shard_names(split, num_shards)
    writers = [tf.io.TFRecordWriter(os.path.join(output_dir, n + ".tmp")) for n in names]
    counts, per_class, skipped = [0] * num_shards, {}, []
    written = 0
    for i in order:
        item = items[i]
        try:
            encoded, fmt, height, width = encode_image(item.source, jpeg_quality, lossless, max_side)
        except (BadImage, OSError) as err:
            skipped.append({"file": item.filename, "reason": str(err)})
            continue
        shard = written % num_shards
        writers[shard].write(
            records.encode_example(encoded, item.label, height, width, fmt, item.filename)
        )
        counts[shard] += 1
        per_class[item.label] = per_class.get(item.label, 0) + 1
        written += 1
    for writer, name in zip(writers, names):
        writer.close()
        os.replace(os.path.join(output_dir, name + ".tmp"), os.path.join(output_dir, name))
    return {
        "num_examples": written,
        "shards": [{"file": n, "num_examples": c} for n, c in zip(names, counts)],
        "per_class": {str(k): v for k, v in sorted(per_class.items())},
        "skipped": skipped,
    }


def write_info(output_dir: str, class_names: Sequence[str], splits: dict, source: str) -> dict:
    """Writes ``dataset_info.json`` atomically, last, and returns it."""
    info = {
        "schema_version": records.SCHEMA_VERSION,
        "source": source,
        "num_classes": len(class_names),
        "class_names": list(class_names),
        "label_offset": 0,
        "splits": splits,
    }
    path = os.path.join(output_dir, INFO_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1, ensure_ascii=False)
    os.replace(path + ".tmp", path)
    return info


def split_items(items: Sequence[Item], validation_fraction: float, seed: int):
    """Splits items into (train, validation) with a seeded shuffle, per class (stratified)."""
    rng = random.Random(seed)
    train, validation = [], []
    by_class: dict[int, list[Item]] = {}
    for item in items:
        by_class.setdefault(item.label, []).append(item)
    for label in sorted(by_class):
        group = by_class[label]
        rng.shuffle(group)
        n_val = int(round(len(group) * validation_fraction))
        validation += group[:n_val]
        train += group[n_val:]
    return train, validation


def items_from_arrays(images: np.ndarray, labels: Iterable[int], prefix: str) -> list[Item]:
    """Wraps an image array (N, H, W[, C]) and labels as Items named ``prefix/000123``."""
    return [
        Item(images[i], int(label), f"{prefix}/{i:06d}") for i, label in enumerate(labels)
    ]


def write_dataset(
    splits: dict[str, Sequence[Item]],
    class_names: Sequence[str],
    output_dir: str,
    source: str,
    num_shards: dict[str, int],
    seed: int = 0,
    **encode_options,
) -> dict:
    """Writes every split, then ``dataset_info.json``; returns the info dict."""
    os.makedirs(output_dir, exist_ok=True)
    entries = {
        name: write_split(items, name, output_dir, num_shards[name], seed, **encode_options)
        for name, items in splits.items()
    }
    return write_info(output_dir, class_names, entries, source)
