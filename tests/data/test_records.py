import io

import numpy as np
import tensorflow as tf
from PIL import Image

from tfgpu.data import recordformat


def _jpeg(array) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="JPEG", quality=95)
    return out.getvalue()


def test_round_trip_eager_and_in_tf_data():
    image = np.full((5, 7, 3), 128, np.uint8)
    encoded = _jpeg(image)
    serialized = recordformat.encode_example(encoded, 3, 5, 7, "jpeg", "dir/ünï.jpg")
    eager = recordformat.parse_example(tf.constant(serialized))
    assert eager["encoded"].numpy() == encoded
    assert int(eager["label"]) == 3 and eager["label"].dtype == tf.int32
    in_data = next(iter(tf.data.Dataset.from_tensors(serialized).map(recordformat.parse_example)))
    assert in_data["encoded"].numpy() == encoded and int(in_data["label"]) == 3
    # A vector of records (a block of the train pipeline) parses to the same, in one op.
    other = recordformat.encode_example(b"png bytes", 1, 2, 2, "png", "b.png")
    both = recordformat.parse_example(tf.constant([serialized, other]), label_offset=1)
    assert both["encoded"].numpy().tolist() == [encoded, b"png bytes"]
    assert both["label"].numpy().tolist() == [2, 0] and both["label"].dtype == tf.int32


def test_schema_is_tensorflows_imagenet_schema_and_offset_applies():
    serialized = recordformat.encode_example(b"x", 1, 2, 3, "png", "f.png")
    features = tf.train.Example.FromString(serialized).features.feature
    assert set(features) == {
        "image/encoded",
        "image/format",
        "image/class/label",
        "image/height",
        "image/width",
        "image/filename",
    }
    assert features["image/format"].bytes_list.value[0] == b"PNG"
    assert int(recordformat.parse_example(tf.constant(serialized), label_offset=1)["label"]) == 0
