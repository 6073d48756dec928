"""A frozen patch-whitening first convolution, initialised from the training data's own
patches (airbench, Keller Jordan's cifar10-airbench; tysam-code's hlb-CIFAR10 before it).

The layer is a plain Keras ``Conv2D`` named ``whiten`` (k x k, "valid", 2m filters, not
trainable), so a saved ``.keras`` file loads without tfgpu. ``initialize`` sets it from a
sample of training images: the k x k patches of the layer's input (the images after the
model's own normalization), their mean and covariance; the m principal directions of largest
variance, each scaled by 1 / sqrt(eigenvalue + eps), and their negatives (a GELU follows,
which would lose half of each direction). Its bias centres the patches (-W . mean): outputs
are zero-mean, unit-variance and uncorrelated over the sample (airbench leaves the patches
uncentred and trains the bias for a few epochs instead).

With m < C k k the layer keeps only the directions that carry the most variance: a grayscale
dataset stored as RGB has only k x k directions of non-zero variance, and the rest would cost
compute for nothing (``airbench_gray*`` models keep m = k x k).

The sample is deterministic (the first images of the train split, in file order), so every
worker computes the same layer; the chief's values are broadcast at the start anyway, and a
resumed run restores them from its checkpoint.
"""

import numpy as np

NAME = "whiten"
EPS = 5e-4  # added to the eigenvalues: airbench's
SAMPLE = 5000  # training images the statistics are taken over (airbench: 5,000 of CIFAR-10)


def whitening_layer(model):
    """The model's whitening ``Conv2D`` (a layer named ``whiten``), or None."""
    found = [layer for layer in model.layers if layer.name == NAME]
    return found[0] if found else None


def patch_statistics(images: np.ndarray, kernel_size: int, chunk: int = 256):
    """(mean [D], covariance [D, D]) in float64 of the k x k patches (every position, stride
    1, "valid") of float ``images`` [N, H, W, C], D = k*k*C in the order of a Conv2D kernel
    (row, column, channel), accumulated ``chunk`` images at a time around the first chunk's
    mean (so that a mean large against the spread cancels nothing)."""
    k = kernel_size
    n, h, w, c = images.shape
    total, outer, count, shift = np.zeros(k * k * c), np.zeros((k * k * c, k * k * c)), 0, None
    for start in range(0, n, chunk):
        x = images[start : start + chunk].astype(np.float64)
        parts = [x[:, i : i + h - k + 1, j : j + w - k + 1, :] for i in range(k) for j in range(k)]
        patches = np.stack(parts, axis=3).reshape(-1, k * k * c)
        shift = patches.mean(0) if shift is None else shift
        patches -= shift
        total += patches.sum(0)
        outer += patches.T @ patches
        count += len(patches)
    centred = total / count
    return shift + centred, outer / count - np.outer(centred, centred)


def whitening_weights(images: np.ndarray, kernel_size: int, components: int, eps: float = EPS):
    """(kernel float32 [k, k, C, 2m], bias float32 [2m]) that whiten the k x k patches of
    float ``images`` [N, H, W, C] along their ``components`` = m principal directions (the
    largest eigenvalues first), each direction twice, with both signs."""
    mean, covariance = patch_statistics(images, kernel_size)
    values, vectors = np.linalg.eigh(covariance)  # ascending
    order = np.argsort(values)[::-1][:components]
    scaled = vectors[:, order] / np.sqrt(np.maximum(values[order], 0.0) + eps)
    kernel = np.concatenate([scaled, -scaled], axis=1)  # [D, 2m]
    bias = -(mean @ kernel)
    shape = (kernel_size, kernel_size, images.shape[-1], kernel.shape[1])
    return kernel.reshape(shape).astype(np.float32), bias.astype(np.float32)


def initialize(model, images: np.ndarray) -> str:
    """Sets ``model``'s whitening layer from uint8 (or float) ``images`` [N, S, S, 3] in
    [0, 255], the model's input; returns its start-up line ("" for a model without one).
    Call it outside any replica context (the assignment then reaches every replica)."""
    import keras

    layer = whitening_layer(model)
    if layer is None:
        return ""
    before = keras.Model(model.inputs, layer.input)  # the model's own normalization
    inputs = np.concatenate(
        [
            keras.ops.convert_to_numpy(before([images[i : i + 500].astype("float32")]))
            for i in range(0, len(images), 500)
        ]
    ).astype(np.float32)
    kernel_size, filters = layer.kernel.shape[0], layer.kernel.shape[-1]
    kernel, bias = whitening_weights(inputs, kernel_size, filters // 2)
    layer.kernel.assign(kernel)
    layer.bias.assign(bias)
    return (
        f"whitening: {layer.name} ({kernel_size}x{kernel_size}, {filters // 2} directions "
        f"and their negatives) from the patches of the first {len(images):,} training images"
    )
