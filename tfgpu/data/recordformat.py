"""The record format, written out once: what the converter writes and the reader reads.

- the schema: ``SCHEMA_VERSION``, ``INFO_FILE`` and ``FEATURES`` (the feature names of
  TensorFlow's own ImageNet converters, ``models/research/slim/datasets/build_imagenet_data.py``,
  so records made by those tools can be read too; their labels start at 1, ``--label_offset=1``);
- the codec of one example: ``encode_example`` serializes a ``tf.train.Example`` by hand, in
  exactly its wire format (tests/convert/test_convert.py checks it against TensorFlow byte for
  byte);
  ``parse_example`` reads records back with TensorFlow's parser, imported only when called;
- the TFRecord framing: ``write_record`` (length, its masked CRC-32C, data, its masked CRC-32C)
  and ``scan_shard``, which walks the framing of a file to count records and find a break;
- a tensorflow-datasets dataset's image and label features (``tfds_keys``), which the
  converter writes and the reader reads alike.

It is the reader's format, so it lives with the reader; the converter writes it. No
TensorFlow here: the converter's workers (fresh processes, where importing TensorFlow would
cost seconds and hundreds of MB) import this module, and it is all ``tfgpu.convert`` imports
of ``tfgpu.data`` (tests/test_imports.py).
"""

import functools
import os
import struct

import google_crc32c

SCHEMA_VERSION = 1
INFO_FILE = "dataset_info.json"  # written last by the converter: a folder with one is whole
QUALITY_FILE = "quality.json"  # the converter's duplicate check, beside INFO_FILE

# Feature name -> (kind, default); "bytes" and "int64" as in tf.train.Feature. The converter
# writes every feature; a reader needs only the first two (the others default).
FEATURES = {
    "image/encoded": ("bytes", None),
    "image/class/label": ("int64", None),
    "image/format": ("bytes", b"JPEG"),
    "image/height": ("int64", 0),
    "image/width": ("int64", 0),
    "image/filename": ("bytes", b""),
}

# dataset_info.json counts each split's shorter sides in steps of this many pixels
# ("short_sides": {lower edge: images}): enough for a run to tell whether crop windows can be
# decoded at a DCT scale (data/dct.py).
SIDE_STEP = 16


def short_side_bucket(height: int, width: int) -> int:
    """The ``short_sides`` bucket (its lower edge, px) of an image's shorter side."""
    return min(height, width) // SIDE_STEP * SIDE_STEP


def tfds_keys(info) -> tuple[str, str]:
    """The (image, label) feature names of a tensorflow-datasets dataset, given its
    ``DatasetInfo``: its ``supervised_keys`` when they name an Image and a ClassLabel, else
    the first Image and the first ClassLabel feature. The converter and the trainer both
    choose with this, so they read a dataset the same way. Raises ValueError when the
    dataset has no such pair."""
    import tensorflow_datasets as tfds  # noqa: PLC0415  (heavy, only for tfds datasets)

    features = info.features
    is_image = lambda k: isinstance(features[k], tfds.features.Image)  # noqa: E731
    is_label = lambda k: isinstance(features[k], tfds.features.ClassLabel)  # noqa: E731
    supervised = tuple(info.supervised_keys or ())
    if len(supervised) == 2 and all(k in features for k in supervised):
        if is_image(supervised[0]) and is_label(supervised[1]):
            return supervised
    image = next((k for k in features if is_image(k)), None)
    label = next((k for k in features if is_label(k)), None)
    if image is None or label is None:
        raise ValueError("it has no Image and ClassLabel features")
    return image, label


# --- one example: a tf.train.Example in protobuf wire format ----------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s are sent as their 64-bit two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _bytes_feature(value: bytes) -> bytes:
    return _field(1, _field(1, value))  # Feature.bytes_list(1) -> BytesList.value(1)


def _int64_feature(value: int) -> bytes:
    return _field(3, _field(1, _varint(value)))  # Feature.int64_list(3), packed value(1)


def encode_example(
    encoded: bytes, label: int, height: int, width: int, image_format: str, filename: str
) -> bytes:
    """One image (already encoded as JPEG or PNG bytes) and its label as a serialized
    ``tf.train.Example``: the bytes TensorFlow writes for it serialized deterministically (map
    keys sorted, as here)."""
    values = {
        "image/class/label": int(label),
        "image/encoded": encoded,
        "image/filename": filename.encode("utf-8", "surrogateescape"),
        "image/format": image_format.upper().encode(),
        "image/height": int(height),
        "image/width": int(width),
    }
    encode = {"bytes": _bytes_feature, "int64": _int64_feature}
    entries = b"".join(
        _field(1, _field(1, name.encode()) + _field(2, encode[FEATURES[name][0]](values[name])))
        for name in sorted(values)
    )
    return _field(1, entries)  # Example.features(1) -> Features.feature(1) map entries


@functools.cache
def _parse_features() -> dict:
    import tensorflow as tf  # the reader's side only: this module imports without it

    dtypes = {"bytes": tf.string, "int64": tf.int64}
    return {
        name: tf.io.FixedLenFeature([], dtypes[kind], default_value=default)
        for name, (kind, default) in FEATURES.items()
    }


def parse_example(serialized, label_offset: int = 0) -> dict:
    """Parses one serialized example (a scalar tensor) or a vector of them into ``{"encoded":
    string, "label": int32}`` of the same shape, with TensorFlow (eagerly or in tf.data).

    ``label_offset`` is subtracted from the stored label (1 for TensorFlow's official ImageNet
    records, whose labels start at 1).
    """
    import tensorflow as tf

    serialized = tf.convert_to_tensor(serialized)
    if serialized.shape.rank == 0:
        parsed = tf.io.parse_single_example(serialized, _parse_features())
    else:  # one vectorized op for the lot: much cheaper per record than one op each
        parsed = tf.io.parse_example(serialized, _parse_features())
    label = tf.cast(parsed["image/class/label"] - label_offset, tf.int32)
    return {"encoded": parsed["image/encoded"], "label": label}


# --- TFRecord framing: [length u64][masked crc of length u32][data][masked crc of data u32] ---

HEADER_BYTES = 12  # the length and its CRC
FOOTER_BYTES = 4  # the data's CRC


def masked_crc(data: bytes) -> bytes:
    """TFRecord's CRC: CRC-32C, rotated and offset (so CRCs of CRCs stay well spread)."""
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def write_record(file, record: bytes) -> None:
    """Appends one record in TFRecord framing to the binary ``file``."""
    length = struct.pack("<Q", len(record))
    file.write(length + masked_crc(length))
    file.write(record)
    file.write(masked_crc(record))


def scan_shard(path: str) -> tuple[int, int]:
    """(records, offset of the break or -1) for a local TFRecord file.

    Walks only the 12-byte record headers (seek past the data), so it costs one small read
    per record, not a pass over the bytes; CRCs are left to the reader.
    """
    size = os.path.getsize(path)
    offset, count = 0, 0
    with open(path, "rb") as f:
        while offset < size:
            header = f.read(HEADER_BYTES)
            if len(header) < HEADER_BYTES:
                return count, offset
            (length,) = struct.unpack("<Q", header[:8])
            end = offset + HEADER_BYTES + length + FOOTER_BYTES
            if end > size:
                return count, offset
            f.seek(end)
            offset, count = end, count + 1
    return count, -1


def damaged_at(path: str, offset: int) -> bool:
    """True when the record of the local TFRecord file ``path`` that starts at byte
    ``offset``, or whose data does (TensorFlow reports either), fails a CRC or is cut short:
    what TensorFlow's reader calls a "corrupted record at <offset>" without naming the file.
    Walks the record headers from the start (one small read per record), so an offset that
    falls inside some record's data is never mistaken for a record."""
    size = os.path.getsize(path)
    position = 0
    with open(path, "rb") as f:
        while position <= offset and position < size:
            f.seek(position)
            header = f.read(HEADER_BYTES)
            whole = len(header) == HEADER_BYTES and masked_crc(header[:8]) == header[8:]
            length = struct.unpack("<Q", header[:8])[0] if whole else 0
            end = position + HEADER_BYTES + length + FOOTER_BYTES
            if offset in (position, position + HEADER_BYTES):
                return not whole or end > size or masked_crc(f.read(length)) != f.read(4)
            if not whole:
                return False  # broken before ``offset``: not the record TensorFlow means
            position = end
    return False
