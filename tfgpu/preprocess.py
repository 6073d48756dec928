"""The float work of preprocessing: pure tensor -> tensor functions run inside the train step.

Batches arrive as uint8 (a quarter of float32's host-to-device traffic) with the random
choices already drawn on the host (``input_pipeline.py``); here they are applied on the
accelerator. Normalization belongs to the model (its first layer), so exported models take
plain pixels.
"""

import tensorflow as tf


def apply_flip(images: tf.Tensor, flip: tf.Tensor) -> tf.Tensor:
    """Mirrors left-right the images of a batch [N, H, W, C] whose ``flip`` [N] is true."""
    return tf.where(flip[:, None, None, None], tf.reverse(images, axis=[2]), images)


def to_float(images: tf.Tensor) -> tf.Tensor:
    """uint8 [0, 255] -> float32 [0, 255]; the model's first layer normalizes."""
    return tf.cast(images, tf.float32)


def train_batch(batch: dict) -> tuple[tf.Tensor, tf.Tensor]:
    """A host batch {image uint8, label, flip} -> (float images, labels)."""
    images = apply_flip(batch["image"], batch["flip"])
    return to_float(images), batch["label"]
