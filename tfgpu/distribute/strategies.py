"""The tf.distribute strategies tfgpu's StrategyBackend wraps, made from --strategy's options:
``mirrored`` (one worker's devices), ``multi_worker`` (the cluster TF_CONFIG or Slurm names,
with bounded waits) and ``one_device``."""

import tensorflow as tf

from tfgpu import compat
from tfgpu.distribute import DistributeError, env


def mirrored(all_reduce_alg: str) -> tf.distribute.Strategy:
    ops = {
        "auto": None,
        "nccl": tf.distribute.NcclAllReduce,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
        "reduce_to_one": tf.distribute.ReductionToOneDevice,
    }[all_reduce_alg]
    gpus = tf.config.list_logical_devices("GPU")
    devices = [d.name for d in gpus or tf.config.list_logical_devices("CPU")]
    if ops is None and not gpus:
        # On CPU devices TensorFlow would pick NCCL-free ReductionToOneDevice anyway; say so.
        ops = tf.distribute.ReductionToOneDevice
    return tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=ops())


def multi_worker(dist) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy over the cluster TF_CONFIG or Slurm names, with bounded
    waits: a worker that never joins (--startup_timeout_s), one that stops sending heartbeats
    (--heartbeat_timeout_s) and a collective that waits too long (--collective_timeout_s)."""
    config = env.cluster()
    if not config:
        raise DistributeError(
            "--strategy=multi_worker_mirrored needs TF_CONFIG naming the workers, or srun "
            "(or start the workers with `python -m tfgpu.launch --num_workers=N -- ...`)"
        )
    task = config["task"]
    # Only the tasks that train join the collective: an evaluator task runs on its own.
    jobs = {t: config["cluster"][t] for t in env.TRAINING_TASKS if config["cluster"].get(t)}
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(jobs),
        task_type=task["type"],
        task_id=int(task["index"]),
        rpc_layer="grpc",
    )
    compat.configure_coordination_service(
        resolver.cluster_spec(), dist.startup_timeout_s, dist.heartbeat_timeout_s
    )
    impl = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }[dist.communication]
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=impl, timeout_seconds=dist.collective_timeout_s or None
    )
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
    except tf.errors.UnknownError as e:
        if "Could not start gRPC server" not in str(e):
            raise
        address = config["cluster"][task["type"]][int(task["index"])]
        raise DistributeError(
            f"could not start this worker's server at {address} (TF_CONFIG's "
            f"{task['type']} {task['index']}): the port is in use, or the host is not "
            "this machine's"
        ) from None


def one_device() -> tf.distribute.Strategy:
    device = "/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0"
    return tf.distribute.OneDeviceStrategy(device)
