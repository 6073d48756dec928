"""Horovod as a backend (``--strategy=horovod``): one process per device, plain variables, one
grouped all-reduce of the gradients per update; under horovodrun (Gloo) or mpirun (a Horovod
built with MPI). Horovod is imported only here, and only when a run asks for it."""

import contextlib

import tensorflow as tf

from tfgpu.distribute import DistributeError, InputShard, env
from tfgpu.distribute.backend_parts import counter, gathered_bytes, timed
from tfgpu.distribute.scratch import scratch_dir
from tfgpu.distribute.devices import pin_to_local_gpu
from tfgpu.errors import INSTALL_HOROVOD


class HorovodBackend:
    """Horovod: one process per device, plain variables, grouped all-reduce of gradients."""

    def __init__(self, compression: str = "none"):
        import horovod.tensorflow as hvd

        hvd.init()
        pin_to_local_gpu(hvd.local_rank())
        self.hvd = hvd
        self.name = "horovod"
        self.num_workers = hvd.size()
        self.worker_index = hvd.rank()
        self.input_shard = InputShard(hvd.size(), hvd.rank())
        self.is_chief = hvd.rank() == 0
        self.strategy = tf.distribute.get_strategy()
        self._compression = hvd.Compression.fp16 if compression == "fp16" else None
        self.all_reduce_calls = counter()
        self.wait_seconds = counter(tf.float64)

    @property
    def num_replicas(self) -> int:
        return self.hvd.size()

    def scope(self):
        return contextlib.nullcontext()

    def distribute_dataset(self, make_dataset):
        """This rank's shard of ``make_dataset``, prefetched to the rank's device (the GPU it
        is pinned to) so the copy overlaps the step, as tf.distribute's fetch-to-device does
        for the other strategies. On a CPU there is nothing to fetch: the dataset as it is
        (fetching would log TensorFlow's "GeneratorDatasetOp ... will not be optimized" for
        each iterator, as ``StrategyBackend.distribute_dataset`` says)."""
        dataset = make_dataset(self.input_shard)
        if not tf.config.list_logical_devices("GPU"):
            return dataset
        options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
        return tf.distribute.OneDeviceStrategy("/GPU:0").experimental_distribute_dataset(
            dataset, options
        )

    def each_replica(self, fn, args=()):
        return fn(*args)

    def all_reduce_sum(self, values, extra=()) -> tuple:
        """As StrategyBackend's: one grouped all-reduce. ``extra`` is never compressed (fp16
        would round the BatchNorm statistics at every update): with --hvd_compression=fp16
        it travels in a second, uncompressed group."""
        with tf.control_dependencies([self.all_reduce_calls.assign_add(1)]):  # see above
            values, extra = [tf.identity(v) for v in values], [tf.identity(v) for v in extra]
            if self._compression is None:
                summed = timed(self, self._grouped_sum, [*values, *extra])
                return summed[: len(values)], summed[len(values) :]
            compressed = lambda v: self._grouped_sum(v, compression=self._compression)  # noqa: E731
            return timed(self, compressed, values), self._grouped_sum(extra)

    def _grouped_sum(self, values, **kwargs) -> list:
        if not values:
            return []
        return self.hvd.grouped_allreduce(values, op=self.hvd.Sum, **kwargs)

    def sum_over_replicas(self, tensor):
        """A differentiable sum of ``tensor`` over the ranks (synchronized BatchNorm's
        moments; Horovod registers the all-reduce's gradient); not counted as the update's."""
        return self.hvd.allreduce(tensor, op=self.hvd.Sum)

    def reduce_sum(self, value):
        """Sums a nest of tensors over the ranks, in one grouped collective."""
        flat = tf.nest.flatten(value)
        return tf.nest.pack_sequence_as(value, self.hvd.grouped_allreduce(flat, op=self.hvd.Sum))

    def local_values(self, value):
        return [value]

    def any_worker(self, flag: bool) -> bool:
        total = self.hvd.allreduce(tf.constant(1.0 if flag else 0.0), op=self.hvd.Sum)
        return float(total) > 0

    def all_gather_bytes(self, blob: bytes) -> list[bytes]:
        """Every rank's ``blob``, in rank order (a collective: every rank must call)."""
        if self.num_workers == 1:
            return [blob]
        return gathered_bytes(blob, lambda rows: self.hvd.allgather(tf.constant(rows)).numpy())

    def broadcast_from_chief(self, variables) -> None:
        """Copies rank 0's values into every rank's ``variables`` (tf.Variables)."""
        if self.num_workers > 1:
            self.hvd.broadcast_variables(list(variables), root_rank=0)

    def checkpoint_dir(self, directory: str) -> str:
        return directory if self.is_chief else scratch_dir(f"tfgpu-rank{self.worker_index}-")


def build(hvd_compression: str) -> HorovodBackend:
    """The Horovod backend of this process; a one-line DistributeError when it cannot make
    one job of the processes the launcher started."""
    found = env.world()
    env.check_world("horovod", found)
    try:
        backend = HorovodBackend(hvd_compression)
    except ImportError:
        raise DistributeError(
            f"--strategy=horovod needs Horovod: run `{INSTALL_HOROVOD}`"
        ) from None
    if backend.num_workers != found.size:
        # A Horovod built without MPI under mpirun: every process a world of its own.
        raise DistributeError(
            f"Horovod sees {backend.num_workers} process(es) but {found.evidence}: this "
            f"Horovod is built without {'MPI' if found.launcher == 'mpirun' else 'Gloo'}; "
            f"rebuild it with `{INSTALL_HOROVOD}` once Open MPI is installed "
            "(apt-get install libopenmpi-dev), or use --strategy=multi_worker_mirrored"
        )
    return backend


def horovod_has_mpi() -> bool:
    """True when an installed Horovod has its MPI controller (mpirun makes one job of it)."""
    try:
        import horovod.tensorflow as hvd  # noqa: PLC0415
    except ImportError:
        return False
    return bool(hvd.mpi_built())
