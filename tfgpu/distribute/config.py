"""How training is spread (``config.dist``): strategy, collectives, timeouts; no TensorFlow."""

from dataclasses import dataclass

from tfgpu.distribute import ALL_REDUCE_ALGS, COMMUNICATIONS, HVD_COMPRESSIONS, STRATEGIES
from tfgpu.settings import setting


@dataclass(frozen=True)
class DistConfig:
    """How training is spread over devices, processes and machines."""

    strategy: str = setting(
        "auto",
        "How to spread training: auto (horovod under horovodrun, and under mpirun when Horovod "
        "has MPI; multi_worker_mirrored under mpirun otherwise, and when TF_CONFIG or an srun "
        "step names several tasks; mirrored with >1 GPU; else default), default, one_device, "
        "mirrored, multi_worker_mirrored, horovod. A strategy that cannot join the processes a "
        "launcher started is an error, never N separate runs.",
        choices=STRATEGIES,
    )
    logical_cpu_devices: int = setting(
        0, "Split the CPU into N devices, so mirrored has N replicas on a laptop."
    )
    all_reduce_alg: str = setting(
        "auto",
        "mirrored: auto, nccl, hierarchical_copy or reduce_to_one.",
        choices=ALL_REDUCE_ALGS,
    )
    communication: str = setting(
        "auto",
        "multi_worker_mirrored collectives: auto, ring or nccl.",
        choices=COMMUNICATIONS,
    )
    collective_timeout_s: float = setting(
        600.0, "A collective that waits longer (a dead worker) fails the run."
    )
    startup_timeout_s: float = setting(
        60.0,
        "multi_worker_mirrored: how long the workers wait for one another at start-up before "
        "they stop, naming the worker that never joined.",
    )
    heartbeat_timeout_s: float = setting(
        10.0,
        "multi_worker_mirrored: a worker whose process stops sending TensorFlow's heartbeats "
        "this long (killed, frozen, its machine gone) is declared lost.",
    )
    stall_timeout_s: float = setting(
        60.0,
        "Every strategy with several processes: when no update completes for this long (a "
        "worker alive but stuck, e.g. on a hung file system), every process stops, naming the "
        "stuck worker and the step (0: off).",
    )
    stop_grace_s: float = setting(
        20.0,
        "After SIGTERM/SIGINT, how long a run may take to reach the next loop boundary and save "
        "a checkpoint; past it (blocked waiting for another worker) it stops without saving.",
    )
    hvd_compression: str = setting(
        "none",
        "horovod: none or fp16 compression of the gradient all-reduce.",
        choices=HVD_COMPRESSIONS,
    )
