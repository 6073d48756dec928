"""The GPU path, checked without a GPU: every op of the train step must have a GPU kernel for
its dtypes, or TensorFlow quietly runs it on the CPU (a uint8 gather did, once).

The Linux TensorFlow wheel registers its GPU kernels whether or not a GPU is present, so the
kernel registry answers exactly; function bodies (the accumulation loop, the skip cond) are
walked too.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels

from tfgpu import build, models
from tfgpu.config import config_from
from tfgpu.data import host_ops
from tfgpu.distribute import backends
from tfgpu.step import DynamicLossScale

_KERNELS: dict = {}


def _gpu_kernels(op_type: str) -> list:
    if op_type not in _KERNELS:
        listed = kernels.get_registered_kernels_for_op(op_type).kernel
        _KERNELS[op_type] = [k for k in listed if k.device_type in ("GPU", "DEFAULT")]
    return _KERNELS[op_type]


def _has_gpu_kernel(node) -> bool:
    def allows(constraint):
        types = constraint.allowed_values.list.type
        return (
            constraint.name not in node.attr
            or not types
            or node.attr[constraint.name].type in types
        )

    return any(all(allows(c) for c in k.constraint) for k in _gpu_kernels(node.op))


def ops_without_gpu_kernel(fn, *args) -> set:
    """{op type [dtypes]} of the nodes of ``fn``'s graph and its functions with no GPU kernel."""
    graph_def = fn.get_concrete_function(*args).graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    return {
        f"{n.op}{sorted(tf.dtypes.as_dtype(v.type).name for v in n.attr.values() if v.type)}"
        for n in nodes
        if not _has_gpu_kernel(n)
    }


@pytest.fixture(autouse=True)
def gpu_kernels_registered():
    if not _gpu_kernels("GatherV2"):
        pytest.skip("this TensorFlow build registers no GPU kernels")
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
    return batch


@pytest.mark.parametrize(
    "model_name, dtype, accumulation, resize_on",
    [
        ("tiny_cnn", "float32", 1, "host"),
        ("resnet18", "mixed_float16", 2, "device"),
        ("efficientnet_b0", "mixed_bfloat16", 1, "device"),
    ],
)
@pytest.mark.slow  # 8-36 s a case: builds and traces a train step (2 shared cores)
def test_every_op_of_the_train_step_has_a_gpu_kernel(model_name, dtype, accumulation, resize_on):
    keras.mixed_precision.set_global_policy(dtype)
    model = models.build_model(model_name, 4, 32)
    config = config_from(
        image_size=32,
        resize_on=resize_on,
        mixup_alpha=0.4,
        cutmix_alpha=1.0,
        global_batch_size=4,
        grad_accum_steps=accumulation,
    )
    loss_scale = DynamicLossScale() if dtype == "mixed_float16" else None
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    backend = backends.build_backend("default")
    step = build.build_step(config, model, optimizer, backend, 4, loss_scale)
    assert ops_without_gpu_kernel(tf.function(step.update), _batch(resize_on)) == set()
