"""One backend per strategy, all with the same few verbs (``distribute.Backend`` names them), so
``step.py`` and ``train.py`` never branch on the strategy: ``scope``, ``num_replicas``,
``is_chief``, ``input_shard`` (this worker's input pipeline), ``distribute_dataset``,
``each_replica``, ``all_reduce_sum`` (inside a step), ``sum_over_replicas`` (inside a step, for
synchronized BatchNorm), ``reduce_sum`` (outside), ``any_worker``,
``all_gather_bytes``, ``broadcast_from_chief`` (``collectives.py``) and ``checkpoint_dir``. The
strategies themselves are made in ``strategies.py``.
"""

import json
import os

import tensorflow as tf

from tfgpu import compat
from tfgpu.distribute import InputShard, env, horovod_backend, mpi, slurm, strategies
from tfgpu.distribute.collectives import WorkerCollectives
from tfgpu.distribute.config import DistConfig
from tfgpu.distribute.backend_parts import counter, timed
from tfgpu.distribute.scratch import scratch_dir
from tfgpu.distribute.devices import configure_devices, pin_to_local_gpus
from tfgpu.distribute.env import resolve_strategy


def _worker_index(strategy: tf.distribute.Strategy) -> int:
    """This process's index among the workers, TensorFlow's way (``env.task_index``: a chief
    is 0, worker i is i + the number of chiefs)."""
    resolver = strategy.cluster_resolver
    if resolver is None or resolver.task_type is None:
        return 0
    task = {"type": resolver.task_type, "index": resolver.task_id or 0}
    return env.task_index({"cluster": resolver.cluster_spec().as_dict(), "task": task})


def _num_workers(strategy: tf.distribute.Strategy) -> int:
    """Worker processes of ``strategy`` (chief included): 1 unless it spans machines."""
    resolver = strategy.cluster_resolver
    if resolver is None:
        return 1
    jobs = resolver.cluster_spec().as_dict()
    return max(1, len(jobs.get("worker", [])) + len(jobs.get("chief", [])))


class StrategyBackend(WorkerCollectives):
    """default, one_device, mirrored and multi_worker_mirrored: a tf.distribute.Strategy (its
    verbs across workers: ``collectives.WorkerCollectives``)."""

    def __init__(self, name: str, strategy: tf.distribute.Strategy):
        self.name = name
        self.strategy = strategy
        self.worker_index = _worker_index(strategy)
        self.num_workers = _num_workers(strategy)
        # One input pipeline per worker, as distribute_datasets_from_function makes them.
        self.input_shard = InputShard(self.num_workers, self.worker_index)
        self.is_chief = strategy.extended.should_checkpoint if name != "default" else True
        self._local_sum = None  # compat.local_replica_sum, made on first use
        with strategy.scope():
            self.all_reduce_calls = counter()
            self.wait_seconds = counter(tf.float64)

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    def scope(self):
        return self.strategy.scope()

    def distribute_dataset(self, make_dataset):
        """``make_dataset(InputShard) -> tf.data.Dataset`` of per-replica batches, called once
        per worker. A worker whose one replica runs on the host's CPU iterates that dataset as
        it is: there is nothing to fetch, and tf.distribute's fetching (a MultiDeviceIterator,
        built on a GeneratorDataset that tf.data cannot serialize for its optimizations) logs
        "dataset.cc: Input of GeneratorDatasetOp::Dataset will not be optimized" for every
        iterator made over it (the train batches', then each evaluation's)."""
        if self._one_cpu_replica():
            return make_dataset(self.input_shard)

        def fn(ctx: tf.distribute.InputContext):
            return make_dataset(InputShard(ctx.num_input_pipelines, ctx.input_pipeline_id))

        options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
        return self.strategy.distribute_datasets_from_function(fn, options)

    def _one_cpu_replica(self) -> bool:
        """One replica on this worker, on a CPU (one_device or multi_worker_mirrored without
        GPUs); the default strategy hands back the dataset itself already."""
        if self.name == "default":
            return False
        devices = self.strategy.extended.worker_devices
        return len(devices) == 1 and tf.DeviceSpec.from_string(devices[0]).device_type == "CPU"

    def each_replica(self, fn, args=()):
        return self.strategy.run(fn, args=args)

    def all_reduce_sum(self, values, extra=()) -> tuple:
        """The update's all-reduce, inside ``run``: sums the list ``values`` (gradients) and
        ``extra`` (BatchNorm statistics) over all replicas in one batched collective; returns
        (summed values, summed extra)."""
        # Counted before the collective starts: the heartbeat board reads the counter to
        # tell who reached the all-reduce the others wait in.
        with tf.control_dependencies([self.all_reduce_calls.assign_add(1)]):
            ctx = tf.distribute.get_replica_context()
            reduce = lambda v: ctx.all_reduce(tf.distribute.ReduceOp.SUM, v)  # noqa: E731
            summed = timed(self, reduce, [*values, *extra])
        return summed[: len(values)], summed[len(values) :]

    def sum_over_replicas(self, tensor):
        """A differentiable sum of ``tensor`` over all replicas, inside ``each_replica``
        (synchronized BatchNorm's moments); not counted as the update's all-reduce. Mirrored
        replicas launch their own collectives (``compat.local_replica_sum``); the others use
        the replica context's all-reduce, which has no merge_call there."""
        if self.name == "mirrored" and self.num_replicas > 1:
            if self._local_sum is None:
                self._local_sum = compat.local_replica_sum(self.strategy)
            return self._local_sum(tensor)
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tensor)

    def reduce_sum(self, per_replica):
        """Sums a (nest of) per-replica value(s) over replicas; called outside ``run``.

        On one worker every replica is local: their values are added with ``add_n``, as
        Keras' fit does. Across workers, scalars of one dtype (the step's and evaluation's
        metrics) travel stacked, in ONE collective instead of one each.
        """
        flat = tf.nest.flatten(per_replica)
        first = [self.local_values(v)[0] for v in flat]
        if self.num_workers == 1:
            summed = [tf.add_n(self.local_values(v)) for v in flat]
        elif all(v.shape.rank == 0 and v.dtype == first[0].dtype for v in first):
            stacked = self.strategy.run(lambda *values: tf.stack(values), args=tuple(flat))
            total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, stacked, axis=None)
            summed = tf.unstack(total, len(flat))
        else:
            summed = [self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for v in flat]
        return tf.nest.pack_sequence_as(per_replica, summed)

    def local_values(self, per_replica):
        """The values of this worker's replicas, as a list."""
        return list(self.strategy.experimental_local_results(per_replica))

    def checkpoint_dir(self, directory: str) -> str:
        """Where this worker saves: the real directory for the chief, a scratch one otherwise.

        Every worker must take part in a save (reading sync-on-read variables is collective).
        """
        return directory if self.is_chief else scratch_dir(f"tfgpu-worker{self.worker_index}-")


# Resolved strategy name -> fn(dist: config.DistConfig) -> backend.
_BACKENDS = {
    "default": lambda dist: StrategyBackend("default", tf.distribute.get_strategy()),
    "one_device": lambda dist: StrategyBackend("one_device", strategies.one_device()),
    "mirrored": lambda dist: StrategyBackend("mirrored", strategies.mirrored(dist.all_reduce_alg)),
    "multi_worker_mirrored": lambda dist: StrategyBackend(
        "multi_worker_mirrored", strategies.multi_worker(dist)
    ),
    "horovod": lambda dist: horovod_backend.build(dist.hvd_compression),
}


def build_backend(strategy: str, dist=None):
    """Returns the backend for a resolved strategy name (``env.resolve_strategy``) with the
    options of ``dist`` (a config.DistConfig; its defaults when None)."""
    if dist is None:
        dist = DistConfig()
    return _BACKENDS[strategy](dist)


def setup(dist) -> "StrategyBackend | horovod_backend.HorovodBackend":
    """The backend ``dist`` (a config.DistConfig) asks for: resolves ``auto`` from the
    launcher, stops when the strategy cannot join the processes it started, builds an MPI
    world's cluster, gives a Slurm task its GPUs and splits the CPU into logical devices
    (before TensorFlow's runtime starts), then builds it."""
    found = env.world()
    mpirun = found.launcher == "mpirun"
    gpus = len(tf.config.list_physical_devices("GPU"))
    has_mpi = mpirun and horovod_backend.horovod_has_mpi()
    name = resolve_strategy(dist.strategy, gpus, horovod_mpi=has_mpi, found=found)
    env.check_world(name, found)
    if name == "multi_worker_mirrored" and mpirun and found.size > 1:
        if not env.cluster():
            # Set where every reader of the cluster (consensus, heartbeats, errors) finds it.
            os.environ["TF_CONFIG"] = json.dumps(mpi.tf_config(found))
        pin_to_local_gpus(mpi.local_gpus)
    elif name == "multi_worker_mirrored" and slurm.in_slurm_step():
        pin_to_local_gpus(slurm.local_gpus)
    configure_devices(dist.logical_cpu_devices)
    return build_backend(name, dist)
