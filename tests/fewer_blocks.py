"""keras.applications' DenseNet and EfficientNet with fewer blocks, built through tfgpu's own
registry names (``models.build_model("efficientnet_b0", ...)``): for tests whose claim is the
family's block pattern and layer kinds, not its depth, as resnet8 is resnet18's code in fewer
blocks. The same Keras builder (keras.src: the public names fix the block counts), the same
layer names, so tfgpu's code (small stems, stochastic depth, --remat's blocks, sync
BatchNorm, the head) sees the family it knows.

- efficientnet_b0: B0's first three stages (blocks 1a, 2a, 2b, 3a, 3b): kernel 3 and 5, with
  and without the expansion conv, strided and not, squeeze-excitation, and two blocks with
  stochastic depth (a residual of the same width), as every later stage repeats them.
- densenet121: one dense block a stage (conv2_block1 .. conv5_block1, pool2 .. pool4): every
  layer kind and transition of the 121.
"""

import contextlib

import keras
from keras.src.applications import densenet, efficientnet


def _efficientnet_b0(**kwargs):
    kwargs.setdefault("name", "efficientnetb0")
    args = efficientnet.DEFAULT_BLOCKS_ARGS[:3]
    return efficientnet.EfficientNet(1.0, 1.0, 224, 0.2, blocks_args=args, **kwargs)


def _densenet121(**kwargs):
    kwargs.setdefault("name", "densenet121")
    return densenet.DenseNet([1, 1, 1, 1], **kwargs)


SMALL = {"EfficientNetB0": _efficientnet_b0, "DenseNet121": _densenet121}


@contextlib.contextmanager
def fewer_blocks():
    """Within it, keras.applications' EfficientNetB0 and DenseNet121 (what tfgpu's
    efficientnet_b0 and densenet121 build) have the blocks above."""
    saved = {name: getattr(keras.applications, name) for name in SMALL}
    try:
        for name, small in SMALL.items():
            setattr(keras.applications, name, small)
        yield
    finally:
        for name, builder in saved.items():
            setattr(keras.applications, name, builder)
