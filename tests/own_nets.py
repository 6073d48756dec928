"""A user's own model module, as tests write it into their temporary folder: the builders that
``--model=own_nets_tfgpu:FUNCTION`` names (tests/models/test_own_models.py,
tests/e2e/test_own_model_runs.py). Written as source, never imported from tests/: the runs
and the workers they start import it from the folder on their Python path, as a user's."""

import os
import sys

MODULE = "own_nets_tfgpu"

SOURCE = '''
import keras
from keras import layers


def functional_bn(num_classes, image_size):
    """Two Conv-BatchNorm-ReLU blocks, pooled, a Dense classifier: a functional model."""
    x = inputs = keras.Input((image_size, image_size, 3))
    for i, filters in enumerate((8, 16)):
        x = layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False, name=f"conv{i}")(x)
        x = layers.BatchNormalization(name=f"bn{i}")(x)
        x = layers.ReLU(name=f"relu{i}")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, layers.Dense(num_classes, name="classifier")(x), name="fbn")


class Block(layers.Layer):
    """A plain Layer holding a BatchNorm (tfgpu must find it inside)."""

    def __init__(self, filters, activation, **kwargs):
        super().__init__(**kwargs)
        self.conv = layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False)
        self.norm = layers.BatchNormalization()
        self.activation = activation

    def call(self, x, training=False):
        return self.activation(self.norm(self.conv(x), training=training))


class Net(keras.Model):
    """A subclassed model; a function among its arguments, and no get_config: Keras cannot
    save it as a .keras file."""

    def __init__(self, num_classes, activation):
        super().__init__(name="subclassed_net")
        self.blocks = [Block(8, activation), Block(16, activation)]
        self.pool = layers.GlobalAveragePooling2D()
        self.classifier = layers.Dense(num_classes)

    def call(self, x, training=False):
        for block in self.blocks:
            x = block(x, training=training)
        return self.classifier(self.pool(x))


def subclassed(num_classes, image_size):
    return Net(num_classes, activation=keras.ops.relu)


def plain(num_classes, image_size):
    """No BatchNorm: every example's gradient is its own (accumulation is exact)."""
    x = inputs = keras.Input((image_size, image_size, 3))
    x = layers.Conv2D(8, 3, strides=2, padding="same", activation="relu", name="conv")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, layers.Dense(num_classes, name="classifier")(x), name="plain")


def scales_itself(num_classes, image_size):
    x = inputs = keras.Input((image_size, image_size, 3))
    x = layers.Rescaling(1 / 255, name="own_scaling")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes)(x))


def fixed_size(num_classes, image_size):
    """Flatten before the classifier: one input size only."""
    x = inputs = keras.Input((image_size, image_size, 3))
    x = layers.Conv2D(4, 3, strides=4, padding="same")(x)
    return keras.Model(inputs, layers.Dense(num_classes)(layers.Flatten()(x)))


def grayscale(num_classes, image_size):
    x = inputs = keras.Input((image_size, image_size, 1))
    return keras.Model(inputs, layers.Dense(num_classes)(layers.GlobalAveragePooling2D()(x)))


def one_class_more(num_classes, image_size):
    return plain(num_classes + 1, image_size)


def probabilities(num_classes, image_size):
    x = inputs = keras.Input((image_size, image_size, 3))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes, activation="softmax")(x))


def not_a_model(num_classes, image_size):
    return "a model"


def raises(num_classes, image_size):
    raise RuntimeError("the builder's own mistake")
'''


def write_module(directory) -> str:
    """Writes the module into ``directory`` and puts that first on this process' path (and
    PYTHONPATH, for the processes it starts); returns the module's name."""
    directory = str(directory)
    with open(os.path.join(directory, f"{MODULE}.py"), "w", encoding="utf-8") as f:
        f.write(SOURCE)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    sys.modules.pop(MODULE, None)
    return MODULE


def env_with(directory) -> dict:
    """This process' environment with ``directory`` first on PYTHONPATH (a worker's)."""
    paths = [str(directory), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
