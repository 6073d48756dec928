"""How training is spread: the only package that knows strategies, launchers (TF_CONFIG,
horovodrun, mpirun, Slurm, Ray) and Horovod.

  config.py      its settings (``config.dist``); no TensorFlow
  env.py         who started this process and how many (horovodrun, mpirun, TF_CONFIG, srun)
  mpi.py         an MPI world as a multi-worker cluster (addresses exchanged through MPI)
  slurm.py       Slurm's host lists and task layout, read without Slurm's tools
  devices.py     what a process sees: logical CPUs, GPU memory growth, a rank's or task's GPUs
  backends.py    one backend per strategy, all with the same few verbs (see its docstring),
                 and ``setup``: the launcher's world -> the strategy -> its backend
  strategies.py  the tf.distribute strategies StrategyBackend wraps, made from the options
  collectives.py StrategyBackend's verbs across workers: any_worker, all_gather_bytes,
                 broadcast_from_chief
  horovod_backend.py  Horovod's backend (horovodrun, or mpirun with Horovod's MPI)
  backend_parts.py  what both kinds of backend are built of (counters, timing of the
                 all-reduce, scratch directories, bytes gathered)
  consensus.py   what the workers agree on at start-up, and step-time skew
  heartbeats.py  the UDP side channel and stall watchdog that name a stuck worker
  heartbeat_wire.py  its signed messages, and the judge of every datagram that arrives
  failures.py    a lost worker's error, in one line naming it
  hvdrun.py      `python -m` alias of tfgpu-horovodrun (tfgpu/cli/horovodrun.py)
  horovod_build.py  whether Horovod has Gloo or MPI, asked of its library (for horovodrun)
  ray_train.py   tfgpu-ray's Ray Train job: the trainer, a worker's entry, failures in one line

This file holds the choices ``config.py`` checks before TensorFlow starts, and the names
shared by the modules above; it imports nothing heavy.
"""

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from tfgpu.errors import DistributeError  # noqa: F401  (what distribute's modules raise)

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker_mirrored", "horovod")
ALL_REDUCE_ALGS = ("auto", "nccl", "hierarchical_copy", "reduce_to_one")
COMMUNICATIONS = ("auto", "ring", "nccl")
HVD_COMPRESSIONS = ("none", "fp16")


def gpu_share(num_gpus: int, local_id: int, local_tasks: int) -> list[int]:
    """Positions, among the ``num_gpus`` GPUs a process sees, of those local process
    ``local_id`` of ``local_tasks`` on its machine should use: an equal share each, or all of
    them when each process already sees only its own (the launcher made them visible)."""
    if num_gpus < 2 or local_tasks < 2 or num_gpus < local_tasks:
        return list(range(num_gpus))
    share = num_gpus // local_tasks
    return list(range(local_id * share, (local_id + 1) * share))


@dataclass(frozen=True)
class InputShard:
    """Which slice of the data one input pipeline reads: pipeline ``index`` of ``count``."""

    count: int
    index: int


class Backend(Protocol):
    """The verbs every backend offers (``backends.StrategyBackend``,
    ``horovod_backend.HorovodBackend``): what the step, the loops and the run may ask of the
    way training is spread, and nothing else. Tensors and variables are TensorFlow's; "inside
    a step" means inside ``each_replica``.
    """

    name: str  # the resolved strategy: "default", "mirrored", ..., "horovod"
    num_workers: int  # processes in the run (chief included)
    worker_index: int  # this process's index among them
    is_chief: bool  # the one process that writes --model_dir
    input_shard: InputShard  # this worker's input pipeline
    all_reduce_calls: Any  # tf.Variable: gradient all-reduces run so far (one per update)
    wait_seconds: Any  # tf.Variable: seconds this worker waited in them (several workers)

    @property
    def num_replicas(self) -> int:
        """Replicas over all workers: the number the global batch is split by."""

    def scope(self):
        """The context in which variables must be created."""

    def distribute_dataset(self, make_dataset: Callable[[InputShard], Any]):
        """``make_dataset(shard)`` (per-replica batches), once per input pipeline, distributed."""

    def each_replica(self, fn: Callable, args: tuple = ()):
        """Runs ``fn(*args)`` on every local replica (``strategy.run``): per-replica values."""

    def all_reduce_sum(self, values: Sequence, extra: Sequence = ()) -> tuple:
        """Inside a step: the update's one all-reduce of ``values`` (gradients) and ``extra``
        (BatchNorm statistics, never compressed); returns (summed values, summed extra)."""

    def sum_over_replicas(self, tensor):
        """Inside a step: a differentiable sum over all replicas (synchronized BatchNorm)."""

    def reduce_sum(self, per_replica):
        """Outside a step: a nest of per-replica values summed over all replicas."""

    def local_values(self, per_replica) -> list:
        """This worker's replicas' values."""

    def any_worker(self, flag: bool) -> bool:
        """True everywhere when ``flag`` is true on any worker (a collective)."""

    def all_gather_bytes(self, blob: bytes) -> list[bytes]:
        """Every worker's ``blob``, in worker order (a collective)."""

    def broadcast_from_chief(self, variables) -> None:
        """Gives every replica of every worker the chief's values of ``variables``."""

    def checkpoint_dir(self, directory: str) -> str:
        """Where this worker saves: ``directory`` for the chief, a scratch one otherwise."""
