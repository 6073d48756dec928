"""Gradient checkpointing per block (``--remat``): the train step's forward pass keeps only each
block's input, and the backward pass runs each block again to get its activations.

``rematerialized(model)`` wraps a registry model (every family: tiny_cnn, the ResNets,
keras.applications' DenseNets and EfficientNets) in a ``Rematerialized`` Keras model that
shares its layers: the same variables, in the same order, so the optimizer, the checkpoints
(which track the model itself, not the wrapper), evaluation and export are as without
``--remat``. Only the train step calls the wrapper.

Blocks are cut on the model's own graph, in one place (``_segments``): the inputs of the first
layer of each block, found by name (``BLOCKS``), become the ends of Functional sub-models built
from the model's own tensors (Keras clones only the Input nodes), so the sub-models run the
model's layers and nothing else. A family whose blocks are nested in a backbone (the
keras.applications models) is cut inside it; the layers around it run as they are.

Why not ``keras.remat`` or ``tf.recompute_grad`` (what ``keras.remat`` is on TensorFlow): the
recompute runs the block again *with its side effects*, so BatchNorm's moving averages would
move twice per forward pass and a dropout layer (EfficientNets' stochastic depth) would draw
new masks, which gives gradients of another network. Here the block's state (its
non-trainable variables: moving statistics, random generators' seeds) is set back to what the
forward pass started from before the recompute, and to what it ended with after it: the same
gradients to float rounding, the same statistics, the same masks.
"""

import re
import types

import keras
import tensorflow as tf

# Family (the registry's) -> the block a layer belongs to, from its name: group(1). Every layer
# of a block is named by it (unnamed ones, ReLU and Add of the ResNets, join the block their
# tensors flow through).
BLOCKS = {
    "resnet": re.compile(r"^(stage\d+_block\d+)_"),
    "cifar_resnet": re.compile(r"^(stage\d+_block\d+)_"),
    "wide_resnet": re.compile(r"^(stage\d+_block\d+)_"),
    "DenseNet": re.compile(r"^(conv\d+_block\d+|pool\d+)_"),
    "EfficientNet": re.compile(r"^(block\d+[a-z])_"),
    "tiny_cnn": re.compile(r"^(conv\d+)[ab]$"),
}


class Rematerialized(keras.Model):
    """``model``'s forward pass, segment by segment, each block recomputed in the backward
    pass when training. Tracks ``model`` alone: its variables, in its order."""

    def __init__(self, model: keras.Model, segments: list):
        super().__init__(name=f"{model.name}_remat")
        self.wrapped = model
        # A plain namespace: Keras and tf.train do not track the sub-models through it (they
        # hold the model's own layers, already tracked through ``model``).
        self._plan = types.SimpleNamespace(segments=segments)

    @property
    def blocks(self) -> int:
        """How many segments are recomputed."""
        return sum(remat for _, remat in self._plan.segments)

    @property
    def segments(self) -> list:
        """The sub-models it runs, in order (recomputed or not)."""
        return [segment for segment, _ in self._plan.segments]

    def build(self, input_shape):
        self.built = True  # the model it wraps is built

    def call(self, inputs, training=False):
        x = inputs
        for segment, remat in self._plan.segments:
            if remat and training:
                x = _recomputed(segment, x)
            else:
                x = segment(x, training=training)
        return x


def rematerialized(model: keras.Model, family: str) -> Rematerialized:
    """``model`` (built by registry ``family``: ``models.MODELS``) as a ``Rematerialized``
    one. Raises ValueError when no block is found in it."""
    nested = [layer for layer in model.layers if isinstance(layer, keras.Model)]
    if nested:  # the keras.applications models: image -> [normalize] -> backbone -> logits
        (backbone,) = nested
        segments = []
        for layer in model.layers[1:]:
            inner = _segments(backbone, _pattern(backbone.name)) if layer is backbone else None
            segments += inner or [(layer, False)]
    else:
        segments = _segments(model, BLOCKS[family])
    wrapped = Rematerialized(model, segments)
    if not wrapped.blocks:
        raise ValueError(f"--remat: no blocks found in {model.name}")
    return wrapped


def _pattern(backbone_name: str):
    """BLOCKS' pattern of a keras.applications backbone, by its name (densenet121, ...)."""
    return BLOCKS["DenseNet" if backbone_name.startswith("densenet") else "EfficientNet"]


def _segments(model: keras.Model, pattern) -> list:
    """[(Functional sub-model, recomputed?)] that run ``model`` from its input to its output:
    the part before the first block (stem), one per block, and the rest (the head)."""
    starts, seen = [], set()
    for layer in model.layers:
        match = pattern.match(layer.name)
        if match and match.group(1) not in seen:
            seen.add(match.group(1))
            starts.append(layer.input)  # the block's first layer: what enters the block
    ends = [model.inputs[0], *starts, model.outputs[0]]
    segments = []
    for i, (a, b) in enumerate(zip(ends[:-1], ends[1:])):
        if a is b:
            continue  # a model that starts with a block has no stem
        segment = keras.Model(a, b, name=f"{model.name}_segment{i}")
        segments.append((segment, 0 < i < len(ends) - 2))
    return segments


def _recomputed(segment: keras.Model, x: tf.Tensor) -> tf.Tensor:
    """``segment(x, training=True)``, its activations dropped after the forward pass and
    recomputed in the backward pass from ``x`` and the segment's state as it was before."""
    state = list(segment.non_trainable_variables)

    @tf.custom_gradient
    def forward(x):
        before = [tf.identity(v.value) for v in state]
        y = segment(x, training=True)

        def backward(dy, variables=None):
            # The recompute must wait for the upstream gradient: without a data dependency on
            # it (XLA ignores control dependencies) the executor is free to run it during the
            # forward pass, and then holds its activations as if there were no checkpointing.
            # x + 0 (NaN when dy is: the update is then skipped or stopped anyway).
            first = tf.reshape(dy, [-1])[:1]
            again_x = x + tf.cast(tf.reduce_sum(first) * 0, x.dtype)
            after = [tf.identity(v.value) for v in state]
            for v, value in zip(state, before):
                v.assign(value)
            with tf.GradientTape() as tape:
                tape.watch(again_x)
                again = segment(again_x, training=True)
            grads = tape.gradient(again, [again_x, *(variables or ())], output_gradients=dy)
            with tf.control_dependencies(grads[:1]):
                for v, value in zip(state, after):
                    v.assign(value)
                dx = tf.identity(grads[0])
            # Without variables read (a frozen block), custom_gradient wants the input's alone.
            return dx if variables is None else (dx, grads[1:])

        return y, backward

    return forward(x)
