"""One TFRecord example <-> {encoded, label}, with TensorFlow. The schema itself (feature
names, defaults) is ``tfgpu/schema.py``, shared with the converter, whose workers serialize
records without TensorFlow (``convert/worker.py``; a test keeps the two byte-identical).
"""

import tensorflow as tf

from tfgpu.schema import FEATURES

_DTYPES = {"bytes": tf.string, "int64": tf.int64}
_PARSE = {
    name: tf.io.FixedLenFeature([], _DTYPES[kind], default_value=default)
    for name, (kind, default) in FEATURES.items()
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
        parsed = tf.io.parse_single_example(serialized, _PARSE)
    else:  # one vectorized op for the lot: much cheaper per record than one op each
        parsed = tf.io.parse_example(serialized, _PARSE)
    label = tf.cast(parsed["image/class/label"] - label_offset, tf.int32)
    return {"encoded": parsed["image/encoded"], "label": label}
