"""The StrategyBackend's verbs across workers, outside a step: ``any_worker``,
``all_gather_bytes`` and ``broadcast_from_chief``, on the strategy's own collectives (made
eagerly, or traced once: see each). A mixin: the backend gives it ``strategy``,
``num_workers`` and ``local_values``."""

import numpy as np
import tensorflow as tf

from tfgpu.distribute.backend_parts import gathered_bytes


class WorkerCollectives:
    """Collectives every worker calls together, between steps."""

    _gather_rows = None  # the all-gather of _all_gather_int32, traced on first use

    def any_worker(self, flag: bool) -> bool:
        """True on every worker when ``flag`` is true on any (a collective: all must call)."""
        value = self._per_replica(lambda replica: tf.constant(1.0 if flag else 0.0))
        return float(self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)) > 0

    def _per_replica(self, value_fn):
        """A per-replica value made eagerly: ``value_fn(replica_id)`` on each local replica's
        device. Not ``strategy.run``: outside a tf.function that logs "Using
        CollectiveAllReduceStrategy eagerly has significant overhead" (up to five times a
        process), and these values need no replica context, only a device."""
        devices = self.strategy.extended.worker_devices

        def value(ctx: tf.distribute.experimental.ValueContext):
            replica = ctx.replica_id_in_sync_group  # worker-major: local index = id % local
            with tf.device(devices[replica % len(devices)]):
                return value_fn(replica)

        return self.strategy.experimental_distribute_values_from_function(value)

    def all_gather_bytes(self, blob: bytes) -> list[bytes]:
        """Every worker's ``blob``, in worker order (a collective: every worker must call)."""
        if self.num_workers == 1:
            return [blob]
        local = self.strategy.num_replicas_in_sync // self.num_workers
        gather = lambda rows: self._all_gather_int32(rows)[::local]  # noqa: E731
        return gathered_bytes(blob, gather)

    def _all_gather_int32(self, rows: np.ndarray) -> np.ndarray:
        """[1, L] int32 on each worker -> [replicas, L] (each worker's row once per replica)."""
        if self._gather_rows is None:
            # One function for the run, traced once per width: a run gathers at every log
            # window (the workers' compute times) and on each agreement, and a new function
            # each time re-traced the collective (~0.2 CPU-s a call under
            # multi_worker_mirrored). Its all-gather needs a known shape, so widths are
            # padded to a power of two: a handful of traces per run.
            @tf.function
            def gather(value):
                def row(v):  # the copy takes the replica's device: a collective needs one
                    return tf.distribute.get_replica_context().all_gather(tf.identity(v), axis=0)

                return self.strategy.run(row, args=(value,))

            self._gather_rows = gather
        width = rows.shape[1]
        padded = np.zeros([1, 1 << (width - 1).bit_length()], np.int32)
        padded[:, :width] = rows
        gathered = self.local_values(self._gather_rows(tf.constant(padded)))[0].numpy()
        return gathered[:, :width]

    def broadcast_from_chief(self, variables) -> None:
        """Gives every replica of every worker the chief's values of ``variables`` (its
        restored checkpoint: the others may have none). One sum-all-reduce of every value,
        flattened into one float64 vector (which carries every dtype's values exactly), to
        which only the chief's first replica contributes. Eager: it runs once per run, and
        tracing it cost more than running it (bench/README.md, Start-up)."""
        if self.num_workers == 1:
            return
        variables = list(variables)
        sizes = [v.shape.num_elements() for v in variables]

        def flat(replica: int):
            if replica != 0:
                return tf.zeros([sum(sizes)], tf.float64)
            # The first replica's own copies: reading a sync-on-read variable from outside
            # a replica would be a collective (and an aggregate, not the chief's values).
            own = [self.local_values(v)[0].read_value() for v in variables]
            return tf.concat([tf.reshape(tf.cast(v, tf.float64), [-1]) for v in own], 0)

        summed = self.strategy.reduce(
            tf.distribute.ReduceOp.SUM, self._per_replica(flat), axis=None
        )
        for var, part in zip(variables, tf.split(summed, sizes)):
            var.assign(tf.reshape(tf.cast(part, var.dtype), var.shape))
