"""Which devices a process sees, set before TensorFlow's runtime starts: logical CPU devices,
GPU memory growth, and the GPU(s) of a Horovod rank or a Slurm task."""

import tensorflow as tf

from tfgpu.distribute import DistributeError, slurm


def configure_devices(logical_cpu_devices: int, gpu_memory_growth: bool = True) -> None:
    """Splits the CPU into logical devices and sets GPU memory growth; call before any op runs.

    Calling it again with the same split is fine (tests set it up once per process).
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    if logical_cpu_devices > 1:
        current = tf.config.get_logical_device_configuration(cpu) or []
        if len(current) != logical_cpu_devices:
            try:
                tf.config.set_logical_device_configuration(
                    cpu, [tf.config.LogicalDeviceConfiguration()] * logical_cpu_devices
                )
            except RuntimeError:
                raise DistributeError(
                    f"--logical_cpu_devices={logical_cpu_devices} came after TensorFlow started "
                    f"with {max(len(current), 1)} CPU device(s)"
                ) from None
    for gpu in tf.config.list_physical_devices("GPU"):
        # Growth instead of grabbing all memory: several ranks may share a machine.
        tf.config.experimental.set_memory_growth(gpu, gpu_memory_growth)


def pin_to_local_gpu(local_rank: int, config=tf.config) -> None:
    """Makes GPU ``local_rank`` the only one this process sees (Horovod: one rank per GPU).

    Must run before TensorFlow's runtime starts (train.run calls configure_devices, then
    build_backend, before any op); a no-op without GPUs. No GPU exists where tfgpu is tested,
    so only the call order is tested here, with a fake ``config``
    (tests/distribute/test_distribute.py).
    """
    gpus = config.list_physical_devices("GPU")
    if not gpus:
        return
    if local_rank >= len(gpus):
        raise DistributeError(
            f"Horovod local rank {local_rank} has no GPU: this host has {len(gpus)}; "
            "start at most one rank per GPU (horovodrun -H host:<number of GPUs>)"
        )
    try:
        config.set_visible_devices(gpus[local_rank], "GPU")
    except RuntimeError:
        raise DistributeError(
            "Horovod could not pin its GPU: TensorFlow had already started"
        ) from None


def pin_to_local_gpus(local_gpus=slurm.local_gpus, config=tf.config) -> None:
    """Makes this process see only its share of its machine's GPUs, ``local_gpus(num_gpus)``
    (``slurm.local_gpus`` under srun: all of them with --gpus-per-task, else its local task's
    equal share; ``mpi.local_gpus`` under mpirun: its local rank's share); before
    TensorFlow's runtime starts, like ``pin_to_local_gpu``."""
    gpus = config.list_physical_devices("GPU")
    mine = [gpus[i] for i in local_gpus(len(gpus))]
    if len(mine) < len(gpus):
        config.set_visible_devices(mine, "GPU")


# CPU flags (/proc/cpuinfo) of the units that compute bfloat16 matrix products natively.
BFLOAT16_CPU_FLAGS = {"avx512_bf16": "AVX512_BF16", "amx_bf16": "AMX"}
BFLOAT16_GPU_CAPABILITY = (8, 0)  # Ampere: bfloat16 tensor cores


def cpu_flags(path: str = "/proc/cpuinfo") -> set:
    """The feature flags of the first CPU in ``path`` (empty where it cannot be read)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return set(value.split())
    except OSError:
        pass
    return set()


def fast_bfloat16(config=tf.config, flags=None) -> str:
    """Why this process's devices compute bfloat16 fast ("" when they do not): every GPU it
    sees of compute capability 8.0 or later, or, without a GPU, a CPU with AVX512_BF16 or AMX
    (``flags``: the CPU's, read from /proc/cpuinfo when None). For --dtype=auto."""
    gpus = config.list_physical_devices("GPU")
    if gpus:
        found = [config.experimental.get_device_details(g).get("compute_capability") for g in gpus]
        if all(cc and tuple(cc) >= BFLOAT16_GPU_CAPABILITY for cc in found):
            low = min(tuple(cc) for cc in found)
            return f"GPU of compute capability {low[0]}.{low[1]}"
        return ""
    flags = cpu_flags() if flags is None else flags
    units = [name for flag, name in BFLOAT16_CPU_FLAGS.items() if flag in flags]
    return f"CPU with {' and '.join(units)}" if units else ""
