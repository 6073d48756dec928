"""A deterministic sample of the training images: the first records of the train split, in
the order of its files, each decoded whole and resized to --image_size (as the in-memory
path decodes them). The same on every worker and in every run over the same data: what a
layer initialised from the data's own statistics reads (``models.whitening``)."""

import numpy as np
import tensorflow as tf

from tfgpu.data import host_ops
from tfgpu.data.spec import DataSpec


def first_train_images(spec: DataSpec, data, count: int) -> np.ndarray:
    """uint8 [n, S, S, 3] of the first ``count`` train records of ``spec`` (fewer when the
    split is smaller), S = --image_size of ``data``; broken images are left out. Without
    train files (--synthetic_data), ``count`` images of uniform noise from a fixed seed."""
    size = data.image_size
    if not spec.train_files:
        rng = np.random.default_rng(0)
        return rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    whole = lambda shape: tf.stack([0, 0, shape[0], shape[1]])  # noqa: E731

    def decode(serialized):
        example = spec.parse(serialized)
        valid = host_ops.looks_whole(example["encoded"])
        image = host_ops.decode_window_resized(example["encoded"], valid, whole, size)
        return image, valid

    ds = tf.data.TFRecordDataset(list(spec.train_files)).take(count)
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(1000)
    parts = [images[valid] for images, valid in ds.as_numpy_iterator()]
    return np.concatenate(parts) if parts else np.zeros([0, size, size, 3], np.uint8)
