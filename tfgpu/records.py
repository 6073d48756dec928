"""The TFRecord schema, shared by the converter (writer) and the input pipeline (reader).

The feature names are those of TensorFlow's own ImageNet converters
(``models/research/slim/datasets/build_imagenet_data.py``), so records made by those tools
can be read too; their labels start at 1, which ``parse_example``'s ``label_offset`` undoes.
"""

import tensorflow as tf

SCHEMA_VERSION = 1

_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    "image/format": tf.io.FixedLenFeature([], tf.string, default_value="JPEG"),
    "image/height": tf.io.FixedLenFeature([], tf.int64, default_value=0),
    "image/width": tf.io.FixedLenFeature([], tf.int64, default_value=0),
    "image/filename": tf.io.FixedLenFeature([], tf.string, default_value=""),
}


def _bytes(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int64(value: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def encode_example(
    encoded: bytes, label: int, height: int, width: int, image_format: str, filename: str
) -> bytes:
    """Serializes one image (already encoded as JPEG or PNG bytes) and its 0-based label."""
    feature = {
        "image/encoded": _bytes(encoded),
        "image/class/label": _int64(int(label)),
        "image/format": _bytes(image_format.upper().encode()),
        "image/height": _int64(int(height)),
        "image/width": _int64(int(width)),
        "image/filename": _bytes(filename.encode("utf-8", "surrogateescape")),
    }
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString()


def parse_example(serialized: tf.Tensor, label_offset: int = 0) -> dict:
    """Parses one serialized example (a scalar) or a vector of them into ``{"encoded":
    string, "label": int32}`` of the same shape.

    ``label_offset`` is subtracted from the stored label (1 for TensorFlow's official ImageNet
    records, whose labels start at 1).
    """
    serialized = tf.convert_to_tensor(serialized)
    if serialized.shape.rank == 0:
        parsed = tf.io.parse_single_example(serialized, _FEATURES)
    else:  # one vectorized op for the lot: much cheaper per record than one op each
        parsed = tf.io.parse_example(serialized, _FEATURES)
    label = tf.cast(parsed["image/class/label"] - label_offset, tf.int32)
    return {"encoded": parsed["image/encoded"], "label": label}
