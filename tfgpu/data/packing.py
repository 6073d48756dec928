"""Train batches of crops of different sizes ("packed", --resize_on=device): each crop's
uint8 pixels travel flat in a scalar variant (``to_variant``), and ``flat_batches`` joins a
batch of them into one int64 vector, each crop padded to whole 8-pixel groups as
``host_ops.pack_pixels`` packs it. The step unpacks and resizes them on the device.
"""

import tensorflow as tf

from tfgpu.data import host_ops

AUTOTUNE = tf.data.AUTOTUNE


def to_variant(words: tf.Tensor) -> tf.Tensor:
    """A 1-D tensor -> a scalar variant holding it (no copy), so examples of different
    lengths batch like scalars."""
    return tf.raw_ops.RaggedTensorToVariant(
        rt_nested_splits=[], rt_dense_values=words, batched_input=False
    )


def flat_batches(ds: tf.data.Dataset, batch_size: int, deterministic: bool) -> tf.data.Dataset:
    """Batches examples whose ``pixels`` (uint8 crops, flat, in variants: ``to_variant``)
    differ in length: the batch's ``pixels`` become one int64 vector, each crop zero-padded to
    whole 8-pixel groups as ``host_ops.pack_pixels`` packs it, the crops one after the other
    (``sizes`` say where each crop ends).

    What ``Dataset.ragged_batch`` does, by hand because it is slow here (its concatenation
    copies uint8 byte by byte on one thread: 0.5 ms of host CPU per image, as much as the resize
    it saves). Here each crop is taken out of its variant (no copy) and the crops and their
    paddings are joined by one ``tf.concat`` (memcpy per piece), then bitcast to int64: one
    copy of the pixels. Measured (bench/README.md), per image: one ``RaggedTensorFromVariant``
    over the batch ~110 µs of host CPU, padded int64 words per crop joined by ``tf.concat``
    ~30-50, this ~15. The rows of ``padded_batch`` cost as much and up to 4x the bytes.
    """
    group = 3 * host_ops.WORD_PIXELS  # bytes

    def crop(variant):
        return tf.raw_ops.RaggedTensorFromVariant(
            encoded_ragged=variant,
            input_ragged_rank=0,
            output_ragged_rank=0,
            Tvalues=tf.uint8,
            Tsplits=tf.int64,
        ).output_dense_values

    def concat(batch):
        pieces = []
        for variant in tf.unstack(batch["pixels"], num=batch_size):
            flat = crop(variant)
            pieces += [flat, tf.zeros([tf.math.floormod(-tf.size(flat), group)], tf.uint8)]
        words = tf.bitcast(tf.reshape(tf.concat(pieces, 0), [-1, 8]), tf.int64)
        return {**batch, "pixels": words}

    ds = ds.batch(batch_size, drop_remainder=True)
    return ds.map(concat, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
