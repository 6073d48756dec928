"""tiny_cnn: a small CNN without BatchNorm, for tests and the demo."""

import keras
from keras import layers

from tfgpu.models import layers as layers_


def build(num_classes: int, image_size: int, small_input: bool = True) -> keras.Model:
    """A small CNN with no BatchNorm: every example's gradient is independent of its batch,
    which is what the exact equivalence tests (accumulation, replicas) need."""
    del small_input
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)
    for i, filters in enumerate((32, 64, 128)):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv{i}a")(x)
        x = layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv{i}b")(x)
        x = layers.MaxPooling2D(2)(x) if i < 2 else x
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers_.head(x, num_classes), name="tiny_cnn")
