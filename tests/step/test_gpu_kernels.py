"""The GPU path, checked without a GPU: every op of the train step must have a GPU kernel for
its dtypes, or TensorFlow quietly runs it on the CPU (a uint8 gather did, once).

The Linux TensorFlow wheel registers its GPU kernels whether or not a GPU is present, so the
kernel registry answers exactly (``tfgpu.compat.ops_without_gpu_kernel``, which
bench/gpu_check.py runs too); function bodies (the accumulation loop, the skip cond) are walked
too.
"""

import keras
import numpy as np
import pytest
from fewer_blocks import fewer_blocks
from requires import requires
import tensorflow as tf

from tfgpu import models
from tfgpu.models import resnet
from tfgpu.train import build
from tfgpu.compat import ops_refused_under_gpu_determinism, ops_without_gpu_kernel
from tfgpu.config import config_from
from tfgpu.data import augment, augment_ops, host_ops, run_input
from tfgpu.data.config import DataConfig
from tfgpu.distribute import backends


@pytest.fixture(autouse=True)
def gpu_kernels_registered():
    requires("gpu_kernels")
    yield
    keras.mixed_precision.set_global_policy("float32")


def test_a_uint8_gather_inside_a_loop_is_caught():
    def body(i, x):
        return i + 1, tf.gather(x, tf.range(tf.shape(x)[0]))

    fn = tf.function(lambda x: tf.while_loop(lambda i, _: i < 2, body, (0, x)))
    missing = ops_without_gpu_kernel(fn, tf.zeros([4, 3], tf.uint8))
    assert missing == {"GatherV2['int32', 'int32', 'uint8']"}
    assert not ops_without_gpu_kernel(fn, tf.zeros([4, 3], tf.float16))


def _batch(resize_on: str, image_size: int = 32) -> dict:
    rng = np.random.default_rng(0)
    batch = {"label": tf.constant([0, 1, 2, 3]), "flip": tf.constant([True, False] * 2)}
    batch["weight"] = tf.ones([4])
    if resize_on == "device":
        crops = [rng.integers(0, 256, (h, w, 3), np.uint8) for h, w in [(40, 50), (7, 3)] * 2]
        batch["pixels"] = tf.concat([host_ops.pack_pixels(tf.constant(c)) for c in crops], 0)
        batch["sizes"] = tf.constant([c.shape[:2] for c in crops], tf.int32)
    else:
        batch["image"] = tf.constant(rng.integers(0, 256, (4, image_size, image_size, 3), np.uint8))
    draws = [
        host_ops.draw_mixing(tf.constant([1, i], tf.int64), image_size, 0.4, 1.0) for i in range(4)
    ]
    batch["mix"] = {k: tf.stack([d[k] for d in draws]) for k in draws[0]}  # MixUp and CutMix
    policy = DataConfig(image_size=image_size, augment_policy="randaugment", random_erasing=0.5)
    return batch | augment.draw(lambda s: tf.constant([2, s], tf.int64), [4], policy)


@pytest.mark.parametrize(
    "model_name, dtype, accumulation, resize_on",
    [
        ("tiny_cnn", "float32", 1, "host"),
        # resnet18's code in one block a stage (each kind of its layers); resnet18 heavy.
        ("resnet10", "mixed_float16", 2, "device"),
        pytest.param("resnet18", "mixed_float16", 2, "device", marks=pytest.mark.heavy),
        ("efficientnet_b0", "mixed_bfloat16", 1, "device"),
    ],
)
@pytest.mark.slow  # 8-36 s a case: builds and traces a train step (2 shared cores)
def test_every_op_of_the_train_step_has_a_gpu_kernel(model_name, dtype, accumulation, resize_on):
    keras.mixed_precision.set_global_policy(dtype)
    # efficientnet_b0 in B0's first three stages (tests/fewer_blocks.py): every kind of layer of
    # B0 (expansion, depthwise 3x3 and 5x5, squeeze-excitation, stochastic depth, the top).
    if model_name == "resnet10":
        model = resnet.build(4, 32, depths=(1, 1, 1, 1))
    else:
        with fewer_blocks():
            model = models.build_model(model_name, 4, 32)
    config = config_from(
        image_size=32,
        resize_on=resize_on,
        mixup_alpha=0.4,
        cutmix_alpha=1.0,
        augment_policy="randaugment",
        random_erasing=0.5,
        global_batch_size=4,
        grad_accum_steps=accumulation,
        label_smoothing=0.1,
        dtype=dtype,  # mixed_float16: the step's loss scale too
    )
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    backend = backends.build_backend("default")
    class_weights = np.array([0.5, 1.0, 2.0, 1.0])  # --class_weights' path in the loss
    sections = (config.model, config.optim, config.train)
    step = build.build_step(
        model,
        optimizer,
        backend,
        *sections,
        step_fns=run_input.step_fns(config.data, 4),
        class_weights=class_weights,
    )
    assert ops_without_gpu_kernel(tf.function(step.update), _batch(resize_on)) == set()


def test_under_determinism_the_histograms_use_no_op_a_gpu_refuses():
    """--deterministic on a GPU: Equalize's and AutoContrast's histograms count by sorting,
    since the GPU refuses Bincount under op determinism (the check sees the bincount path)."""
    images = tf.zeros([2, 8, 8, 3])

    def counted(sorted_counts):
        return tf.function(lambda x: augment_ops.histograms(x, sorted_counts=sorted_counts))

    assert ops_refused_under_gpu_determinism(counted(False), images) == {"DenseBincount"}
    assert ops_refused_under_gpu_determinism(counted(True), images) == set()
    assert ops_without_gpu_kernel(counted(True), images) == set()
