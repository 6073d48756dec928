"""What the environment says about the cluster: TF_CONFIG, horovodrun's variables, Slurm's.

No TensorFlow here: ``tfgpu.launch`` and the error paths use it too.
"""

import json
import os
import socket

from tfgpu.distribute import DistributeError, slurm


def under_horovodrun() -> bool:
    """True when this process was started by horovodrun (or mpirun with Horovod's variables)."""
    return any(k in os.environ for k in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"))


def read_tf_config() -> dict:
    """Returns TF_CONFIG parsed, ``{}`` when unset; a malformed one is a DistributeError."""
    raw = os.environ.get("TF_CONFIG", "")
    if not raw.strip():
        return {}
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        task = config["task"]
        if not isinstance(workers, list) or not workers:
            raise ValueError("cluster.worker must be a non-empty list")
        if task["type"] not in ("worker", "chief", "evaluator"):
            raise ValueError(f"task.type {task['type']!r} is not worker or chief")
        if not 0 <= int(task["index"]) < len(config["cluster"].get(task["type"], [])):
            raise ValueError(f"task.index {task['index']} is out of range")
    except (ValueError, KeyError, TypeError) as err:
        raise DistributeError(
            f"TF_CONFIG is malformed ({err}); expected "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": N}}'
        ) from None
    return config


def is_evaluator() -> bool:
    """True for TF_CONFIG's ``evaluator`` task (Kubeflow's TFJob): a side-car that evaluates
    the run's checkpoints as they appear and trains nothing."""
    try:
        return read_tf_config().get("task", {}).get("type") == "evaluator"
    except DistributeError:
        return False


def cluster() -> dict:
    """The multi-worker cluster as a TF_CONFIG dict: TF_CONFIG itself, else the Slurm job step
    this task belongs to (``srun --ntasks=N``), else {}."""
    config = read_tf_config()
    if not config and slurm.in_slurm_step():
        config = slurm.tf_config()
    return config


def tf_config_workers() -> int:
    """Workers the cluster names (0 without one)."""
    return len(cluster().get("cluster", {}).get("worker", []))


def worker_address(task: int) -> str:
    """``host:port`` of worker ``task`` of the cluster, or "" when unknown."""
    try:
        workers = cluster().get("cluster", {}).get("worker", [])
    except DistributeError:
        return ""
    return workers[task] if 0 <= task < len(workers) else ""


def multi_process() -> bool:
    """True in a run of several processes (horovodrun, or a cluster of several workers);
    False when the environment says nothing usable."""
    try:
        return under_horovodrun() or tf_config_workers() > 1
    except DistributeError:
        return False


def resolve_strategy(name: str, num_gpus: int) -> str:
    """Resolves ``auto`` from the environment (``num_gpus``: physical GPUs of this machine);
    other names are returned as they are."""
    if name != "auto":
        return name
    if under_horovodrun():
        return "horovod"
    if tf_config_workers() > 1:
        return "multi_worker_mirrored"
    return "mirrored" if num_gpus > 1 else "default"


def advertised_host() -> str:
    """This process's address as the other workers reach it: its cluster address's host, or
    (under horovodrun) the address of the route to horovodrun's rendezvous server."""
    config = cluster()
    if config:
        task = config["task"]
        return config["cluster"][task["type"]][int(task["index"])].rsplit(":", 1)[0]
    target = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "")
    if target:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((target, 9))  # no packet is sent
            return probe.getsockname()[0]
        except OSError:
            pass
        finally:
            probe.close()
    return socket.gethostbyname(socket.gethostname())
