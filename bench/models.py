"""Per-model training speed on this machine: float32 vs mixed_bfloat16 vs float32 + XLA.

    python bench/models.py [--image_size=64] [--batch_size=16] [--steps=6] [--models=a,b]

Each model runs tfgpu's own train step (``TrainStep.update``: forward, backward, SGD update)
on one synthetic uint8 batch held in memory, so the numbers are the model's, not the input
pipeline's. All three settings are measured in the same process, one after the other per model,
so their ratios compare like with like on a shared machine. XLA compiles the per-replica step,
as ``--jit_compile`` does in train.py.

FLOPs per image are counted by TensorFlow's graph profiler (``tf.compat.v1.profiler``) on the
frozen inference graph of one image: the forward pass only, a multiply-add counted as 2 FLOPs
(papers usually quote multiply-adds, i.e. half). Training costs about 3x the forward pass.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import (
    convert_variables_to_constants_v2,
)

from tfgpu import models
from tfgpu.distribute import backends
from tfgpu.step.train_step import TrainStep

MODELS = ("tiny_cnn", "resnet18", "resnet50", "densenet121", "efficientnet_b0")
SETTINGS = (
    ("float32", "float32", False),
    ("bfloat16", "mixed_bfloat16", False),
    ("XLA", "float32", True),
)  # (column, dtype policy, jit_compile)
NUM_CLASSES = 1000


def forward_flops(name: str, image_size: int) -> int:
    """Forward FLOPs of one image (multiply-add = 2), from the frozen float32 graph."""
    keras.mixed_precision.set_global_policy("float32")
    model = models.build_model(name, NUM_CLASSES, image_size, small_input=False)
    spec = tf.TensorSpec([1, image_size, image_size, 3], tf.float32)
    concrete = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
    graph = convert_variables_to_constants_v2(concrete).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    profile = tf.compat.v1.profiler.profile(graph=graph, cmd="op", options=options)
    keras.backend.clear_session()
    return profile.total_float_ops


def images_per_sec(name: str, dtype: str, jit: bool, args) -> float:
    """Training images/s of ``name`` under policy ``dtype`` (XLA when ``jit``)."""
    keras.mixed_precision.set_global_policy(dtype)
    keras.utils.set_random_seed(0)
    model = models.build_model(name, NUM_CLASSES, args.image_size, small_input=False)
    backend = backends.build_backend("default")
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    step = TrainStep(model, optimizer, backend, global_batch_size=args.batch_size, jit_compile=jit)
    rng = np.random.default_rng(0)
    batch = {
        "image": tf.constant(
            rng.integers(
                0, 256, (args.batch_size, args.image_size, args.image_size, 3), dtype=np.uint8
            )
        ),
        "label": tf.constant(rng.integers(0, NUM_CLASSES, args.batch_size), tf.int32),
        "flip": tf.zeros([args.batch_size], tf.bool),
        "weight": tf.ones([args.batch_size]),
    }

    @tf.function
    def run(n):
        for _ in tf.range(n):  # several updates per call, as train.py's steps_per_loop
            loss = step.update(batch)[0]["loss"]
        return loss

    float(run(tf.constant(2)))  # trace, compile (XLA) and warm up
    start = time.perf_counter()
    float(run(tf.constant(args.steps)))
    seconds = time.perf_counter() - start
    keras.backend.clear_session()
    return args.steps * args.batch_size / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6, help="timed updates per setting")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    tf.get_logger().setLevel("ERROR")  # the profiler's deprecation notes, retracing notes
    started = time.time()
    print(
        f"train step images/s at {args.image_size}x{args.image_size}, batch {args.batch_size}, "
        f"{args.steps} timed updates; {os.cpu_count()} CPU cores; TF {tf.__version__}"
    )
    header = (
        f"{'model':<16}{'float32':>9}{'bfloat16':>10}{'XLA':>9}{'bf16/f32':>10}"
        f"{'XLA/f32':>9}{'GFLOPs@' + str(args.image_size):>11}{'GFLOPs@224':>11}"
    )
    print(header + "\n" + "-" * len(header))
    for name in args.models.split(","):
        speed = {col: images_per_sec(name, dtype, jit, args) for col, dtype, jit in SETTINGS}
        flops = [forward_flops(name, size) / 1e9 for size in (args.image_size, 224)]
        print(
            f"{name:<16}{speed['float32']:>9.1f}{speed['bfloat16']:>10.1f}{speed['XLA']:>9.1f}"
            f"{speed['bfloat16'] / speed['float32']:>10.2f}{speed['XLA'] / speed['float32']:>9.2f}"
            f"{flops[0]:>11.3f}{flops[1]:>11.2f}",
            flush=True,
        )
    print(f"(forward FLOPs per image, multiply-add = 2; {time.time() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
