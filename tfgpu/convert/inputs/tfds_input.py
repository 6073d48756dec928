"""A prepared tensorflow-datasets dataset, read from its own files (nothing is downloaded)."""

import os
from functools import partial

from tfgpu.errors import ConvertError
from tfgpu.convert.manifest import Item, LazySplit, Source
from tfgpu.data.recordformat import tfds_keys


def tfds_source(name: str, data_dir: str, validation_fraction: float) -> Source:
    """A tensorflow-datasets dataset already prepared in ``data_dir`` (nothing is
    downloaded). Its image and label features are those ``recordformat.tfds_keys`` picks (as the
    trainer's ``--tfds_name`` does); the validation split is ``validation``, else ``test``,
    else the last ``validation_fraction`` of ``train``. Images are read as stored
    (SkipDecoding), a shard's range at a time."""
    import tensorflow_datasets as tfds

    builder = _tfds_builder(tfds, name, data_dir)
    features = builder.info.features
    try:
        image_key, label_key = tfds_keys(builder.info)
    except ValueError as err:
        raise ConvertError(f"--tfds_name={name}: {err}, nothing to convert") from None
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
