"""What bench/gpu_check.py measures, as plain numbers (its rows and table are made there):
the train loop's images/s at one batch and the search for the largest batch that fits,
TensorFlow's placement log, the collectives of a mirrored loop, and the step as it trains on
a GPU machine (its ops' GPU kernels, their placement, the input rate). The functions take
gpu_check's parsed arguments (``args``: dry_run, image_size, work_dir, ...) and build what
they run with tfgpu's own functions (``train.loop.assemble``, ``loops.make_train_loop``).
"""

import collections
import ctypes
import dataclasses
import gc
import os
import re
import sys
import tempfile
import time
from types import SimpleNamespace

NUM_CLASSES = 1000  # ImageNet's, as in NVIDIA's figures


@dataclasses.dataclass(frozen=True)
class Measured:
    images_per_sec: float
    batch: int
    updates: int  # global_step after the run
    all_reduces: int  # the backend's count of gradient all-reduces


# --- TensorFlow's placement log --------------------------------------------------------

PLACED = re.compile(r"^(?P<node>[^\s:][^:]*): \((?P<op>\w+)\): (?P<device>/\S+)$", re.M)
# Where a function's inputs arrive and its outputs leave: placed with the data, not a kernel.
BOUNDARY_OPS = frozenset({"_Arg", "_Retval", "_DeviceArg", "_DeviceRetval"})


def log_placement_to_file() -> int:
    """Before TensorFlow's runtime starts: turns on its placement log, whose lines TensorFlow
    prints to the process's stdout (C's printf), and sends them to a temporary file; this
    script's own output keeps going to the real stdout. Returns the file's descriptor (fd 1)."""
    from tfgpu.cli import quiet

    tf = quiet.import_tensorflow()  # without its start-up notices
    real = os.dup(1)
    log = tempfile.TemporaryFile()
    os.dup2(log.fileno(), 1)
    sys.stdout = os.fdopen(real, "w", buffering=1)
    tf.debugging.set_log_device_placement(True)  # only read when the runtime starts
    return 1


def native_log_size(fd: int) -> int:
    """Bytes TensorFlow has printed into the placement log so far (C buffers flushed)."""
    ctypes.CDLL(None).fflush(None)
    return os.fstat(fd).st_size


def placed_ops(fd: int, start: int) -> list[tuple[str, str]]:
    """(op type, device) of each op the placer logged after byte ``start`` of the log."""
    end = native_log_size(fd)
    text = os.pread(fd, end - start, start).decode(errors="replace")
    return [(m["op"], m["device"]) for m in PLACED.finditer(text) if m["op"] not in BOUNDARY_OPS]


# --- building and timing the train loop -------------------------------------------------


def run_config(args, model: str, dtype: str, jit: bool, batch: int, **settings):
    """The Config of one measured run: tfgpu's defaults but for the model, precision and
    batch, synthetic batches unless ``settings`` name a data_dir; no checkpoints kept;
    resolved for this machine as ``train.run`` resolves it."""
    import tensorflow as tf

    from tfgpu.config import config_from, validate

    # A small rate: random labels must not drive a timed run to NaN (the loop would stop).
    base = dict(synthetic_data=True, num_classes=NUM_CLASSES, learning_rate=0.01)
    base.update(settings)
    config = config_from(
        model="tiny_cnn" if args.dry_run else model,
        small_input=args.dry_run,
        image_size=args.image_size,
        dtype=dtype,
        jit_compile=jit,
        global_batch_size=batch,
        train_steps=10**6,
        model_dir=tempfile.mkdtemp(dir=args.work_dir),
        **base,
    )
    return validate(config).resolved(has_gpu=bool(tf.config.list_logical_devices("GPU")))


def build_training(config, strategy: str = "default") -> SimpleNamespace:
    """The run of ``config`` as ``train.loop.assemble`` builds it, on a fresh backend (its own
    all-reduce counter): its state's parts, ``backend``, ``inputs``, ``plan`` and
    ``batches(start_step)``, its distributed train batches."""
    from tfgpu.data import run_input
    from tfgpu.distribute.backends import build_backend
    from tfgpu.train import loop

    backend = build_backend(strategy, config.dist)
    inputs, plan, state, _ = loop.assemble(config, backend)
    batches = lambda start_step: run_input.train_batches(inputs, backend, start_step)[0]  # noqa: E731
    return SimpleNamespace(
        step=state.step,
        global_step=state.global_step,
        skipped_updates=state.skipped_updates,
        backend=backend,
        inputs=inputs,
        plan=plan,
        batches=batches,
    )


def out_of_memory(error) -> bool:
    """Whether a TensorFlow error is the device running out of memory (XLA and cuDNN may
    report it as another error type, with these words)."""
    import tensorflow as tf

    text = str(error).lower()
    oom = "out of memory" in text or "oom when allocating" in text
    return isinstance(error, tf.errors.ResourceExhaustedError) or oom


def measure(args, model: str, dtype: str, jit: bool, batch: int) -> Measured | None:
    """Images/s of the train loop at ``batch`` (``--steps`` updates in one call, after an
    untimed call of ``--warmup_steps``; counted from the updates it ran, as a non-finite loss
    stops it), or None when the device runs out of memory."""
    import keras
    import tensorflow as tf

    from tfgpu.step import loops

    keras.backend.clear_session()  # the previous run's objects go: its device memory is free
    gc.collect()
    try:
        run = build_training(run_config(args, model, dtype, jit, batch))
        loop = loops.make_train_loop(run.step, run.global_step, run.skipped_updates)
        batches = run.batches(0)
        loop(batches, tf.constant(args.warmup_steps))[0]["loss"].numpy()
        before, start = int(run.global_step.numpy()), time.perf_counter()
        loop(batches, tf.constant(args.steps))[0]["loss"].numpy()
        seconds = time.perf_counter() - start
        counts = int(run.global_step.numpy()), int(run.backend.all_reduce_calls.numpy())
    except tf.errors.OpError as error:
        if not out_of_memory(error):
            raise
        return None
    return Measured((counts[0] - before) * batch / seconds, batch, *counts)


def largest_batch(fits, start: int, cap: int):
    """``(b, fits(b))`` for the largest b tried that fits: doubling from ``start`` while 2b <=
    ``cap``, or, when ``start`` does not fit, halving until one does; None if none does.
    ``fits(b)`` returns a result, or None when b runs out of memory."""
    b, best, halving = min(start, cap), None, False
    while b >= 1:
        result = fits(b)
        if result is None:
            if best is not None:
                return best
            b, halving = b // 2, True
            continue
        best = (b, result)
        if halving or 2 * b > cap:
            return best
        b *= 2
    return None


def collective_ops(concrete) -> collections.Counter:
    """Op types of the collectives in a concrete function's graph and its functions."""
    graph_def = concrete.graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    names = ("Nccl", "Collective", "Horovod")
    return collections.Counter(n.op for n in nodes if n.op.startswith(names))


def replicated_loop(args, model: str, replicas: int, all_reduce_alg: str, run_updates: int):
    """A mirrored train loop of ``model`` over ``replicas`` devices (every GPU; 2 logical
    CPU devices in a dry run), mixed_float16, 32 images a replica (2 in a dry run), traced
    (and run for ``run_updates``): (collective ops in its graph, updates run, gradient
    all-reduces counted)."""
    import keras
    import tensorflow as tf

    from tfgpu.step import loops

    batch = replicas * (2 if args.dry_run else 32)
    config = run_config(
        args, model, "mixed_float16", False, batch, strategy="mirrored",
        all_reduce_alg=all_reduce_alg,
    )  # fmt: skip
    run = build_training(config, "mirrored")
    loop = loops.make_train_loop(run.step, run.global_step, run.skipped_updates)
    batches = run.batches(0)
    ops = collective_ops(loop.get_concrete_function(batches, tf.constant(1)))
    if run_updates:
        loop(batches, tf.constant(run_updates))[0]["loss"].numpy()
    counts = int(run.global_step.numpy()), int(run.backend.all_reduce_calls.numpy())
    keras.backend.clear_session()
    return ops, *counts


@dataclasses.dataclass(frozen=True)
class StepProbe:
    missing: set  # "Op[dtypes]" of the step's ops with no GPU kernel
    placed: list  # (op type, device) of each op the placer logged for the step
    images_per_sec: float  # the reader + the step's resize and preparation on the device
    reader_images_per_sec: float  # the reader alone


def probe_step(args, model: str, log_fd: int) -> StepProbe:
    """The step of ``model`` as it trains on a GPU machine (mixed_float16, generated JPEGs,
    crops resized on the device): its ops without a GPU kernel, where the placer put them
    (``log_fd``: ``log_placement_to_file``'s), and the input rates."""
    import keras
    import tensorflow as tf

    from tfgpu import compat
    from input_pipeline import build_data

    cache = args.cache_dir or tempfile.mkdtemp(dir=args.work_dir)
    data_dir, _ = build_data(cache, args.input_images)
    config = run_config(
        args, model, "mixed_float16", False, args.input_batch, synthetic_data=False,
        data_dir=data_dir, num_classes=10, resize_on="device", in_memory="off",
    )  # fmt: skip
    training = build_training(config)
    batches = training.batches(0)
    batch = next(batches)
    update = tf.function(training.step.update)
    missing = compat.ops_without_gpu_kernel(update, batch)  # traces it
    start = native_log_size(log_fd)
    update(batch)  # its first call places every op: the placer logs each
    placed = placed_ops(log_fd, start)
    rates = input_rates(args, training, batches)
    keras.backend.clear_session()
    return StepProbe(missing, placed, *rates)


def input_rates(args, training, batches) -> tuple[float, float]:
    """(images/s of the reader plus the step's resize and preparation on the device, over
    ``batches``, the training's distributed train batches; images/s of the reader alone,
    ``run_input.probe``), each read for --input_seconds."""
    import tensorflow as tf

    from tfgpu.data import run_input

    make = run_input.train_maker(training.inputs, 0)
    shard = training.backend.input_shard
    alone = run_input.probe(training.inputs, make, shard, args.input_seconds)
    step = training.step

    @tf.function
    def on_device(batch):
        images, _ = step.prepare(step.unpack(batch))
        return tf.reduce_sum(images)  # the whole resize, not a part the graph could prune

    on_device(next(batches)).numpy()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.input_seconds or not count:
        on_device(next(batches)).numpy()
        count += 1
    return count * training.plan.replica_batch / (time.perf_counter() - start), alone
