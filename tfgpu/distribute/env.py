"""What the environment says about the job: who started this process (horovodrun, mpirun,
a TF_CONFIG written by a scheduler, srun) and how many training processes it started.

A process that is one of several never trains alone: ``world()`` reads every launcher's
variables, ``resolve_strategy`` turns ``auto`` into the strategy that joins them, and
``check_world`` stops in one line when an explicit strategy would train N separate copies
into one --model_dir. No TensorFlow here: ``tfgpu.launch`` and the error paths use it too.
"""

import json
import os
import random
import socket
from dataclasses import dataclass

from tfgpu.distribute import DistributeError, slurm

# TF_CONFIG's task types: the ones that train, in TensorFlow's order (the chief, when there is
# one, is task 0 of the collective; workers follow), and the side-car evaluator.
TRAINING_TASKS = ("chief", "worker")
TASK_TYPES = (*TRAINING_TASKS, "evaluator")
# (size, rank) variables of the MPI launchers: Open MPI (Kubeflow's MPIJob), MPICH/Intel MPI's
# Hydra (also srun --mpi=pmi2), MVAPICH.
_MPI_VARIABLES = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    ("PMI_SIZE", "PMI_RANK"),
    ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"),
)
SINGLE_PROCESS = ("default", "one_device", "mirrored")
HOROVOD_LAUNCHERS = ("horovodrun", "mpirun")


@dataclass(frozen=True)
class World:
    """The job this process belongs to, as its launcher told it."""

    launcher: str  # "", "horovodrun", "mpirun", "tf_config" or "slurm"
    size: int  # training processes the launcher started
    rank: int  # this process's index among them
    evidence: str  # what says so, for messages: "OMPI_COMM_WORLD_SIZE=2"


def world(environ=os.environ) -> World:
    """Who started this process and how many training processes it started; a malformed
    TF_CONFIG is a DistributeError. MPI's variables win over Slurm's: mpirun inside an
    allocation starts its daemons with srun."""
    if "HOROVOD_RANK" in environ:
        size = _whole(environ, "HOROVOD_SIZE", 1)
        rank = _whole(environ, "HOROVOD_RANK", 0)
        return World("horovodrun", size, rank, f"HOROVOD_SIZE={size}")
    for size_name, rank_name in _MPI_VARIABLES:
        if size_name in environ:
            size, rank = _whole(environ, size_name, 1), _whole(environ, rank_name, 0)
            return World("mpirun", size, rank, f"{size_name}={size}")
    config = read_tf_config(environ)
    if config:
        size = len(training_tasks(config))
        roles = ", ".join(f"{len(v)} {k}" for k, v in config["cluster"].items() if v)
        return World("tf_config", size, task_index(config), f"TF_CONFIG names {roles}")
    if slurm.in_slurm_step(environ):
        size = slurm.tasks(environ)
        rank = _whole(environ, "SLURM_PROCID", 0)
        return World("slurm", size, rank, f"an srun step of {size} tasks")
    return World("", 1, 0, "")


def _whole(environ, name: str, default: int) -> int:
    """The launcher's variable ``name`` as a number (``default`` when unset); anything else is
    a one-line DistributeError naming it: a launcher's variables are read, never trusted."""
    value = environ.get(name, str(default))
    if not value.strip().isdigit():
        raise DistributeError(f"{name}={value!r} is not a whole number (set by the launcher?)")
    return int(value)


def read_tf_config(environ=os.environ) -> dict:
    """Returns TF_CONFIG parsed, ``{}`` when unset; a malformed one is a DistributeError.
    Kubeflow's TFJob (chief, worker, evaluator, ``"environment": "cloud"``) and Ray Train's
    (workers only) are both accepted."""
    raw = environ.get("TF_CONFIG", "")
    if not raw.strip():
        return {}
    try:
        config = json.loads(raw)
        jobs, task = config["cluster"], config["task"]
        if not any(isinstance(jobs.get(t), list) and jobs[t] for t in TRAINING_TASKS):
            raise ValueError("cluster.worker (or cluster.chief) must be a non-empty list")
        if task["type"] not in TASK_TYPES:
            raise ValueError(
                f"task.type {task['type']!r} is not worker or chief (or evaluator); tfgpu "
                "trains with collectives, not parameter servers"
            )
        index = int(task["index"])
        # TFJob leaves its evaluator out of the cluster: it is not part of training.
        listed = len(jobs.get(task["type"]) or []) if task["type"] != "evaluator" else index + 1
        if not 0 <= index < listed:
            raise ValueError(f"task.index {task['index']} is out of range")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise DistributeError(
            f"TF_CONFIG is malformed ({err}); expected "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": N}}'
        ) from None
    return config


def training_tasks(config: dict) -> list[str]:
    """``host:port`` of every task of a TF_CONFIG dict that trains: the chief, then workers."""
    return [a for t in TRAINING_TASKS for a in config["cluster"].get(t) or []]


def task_index(config: dict) -> int:
    """This task's index among ``training_tasks`` (-1 for an evaluator)."""
    task, jobs = config["task"], config["cluster"]
    if task["type"] == "evaluator":
        return -1
    chiefs = len(jobs.get("chief") or []) if task["type"] == "worker" else 0
    return chiefs + int(task["index"])


def is_evaluator() -> bool:
    """True for TF_CONFIG's ``evaluator`` task (Kubeflow's TFJob): a side-car that evaluates
    the run's checkpoints as they appear and trains nothing."""
    try:
        return read_tf_config().get("task", {}).get("type") == "evaluator"
    except DistributeError:
        return False


def cluster(environ=os.environ) -> dict:
    """The multi-worker cluster as a TF_CONFIG dict: TF_CONFIG itself, else the Slurm job step
    this task belongs to (``srun --ntasks=N``), else {}."""
    config = read_tf_config(environ)
    if not config and slurm.in_slurm_step(environ):
        config = slurm.tf_config(environ)
    return config


def task_label(index: int, environ=os.environ) -> str:
    """How messages call training process ``index`` (the collective's order: TF_CONFIG's
    chief first, then its workers), in the words of the launcher the user ran: TF_CONFIG's
    own ``chief 0`` / ``worker 1`` (Kubeflow's TFJob, Ray Train, tfgpu.launch, a hand-written
    one), ``rank 1`` under horovodrun or mpirun, ``task 1`` under srun (SLURM_PROCID)."""
    try:
        found, config = world(environ), read_tf_config(environ)
    except DistributeError:
        return f"worker {index}"
    if found.launcher in HOROVOD_LAUNCHERS:
        return f"rank {index}"
    if found.launcher == "slurm":
        return f"task {index}"
    if not config:
        return f"worker {index}"
    chiefs = len(config["cluster"].get("chief") or [])
    return f"chief {index}" if index < chiefs else f"worker {index - chiefs}"


def task_name(job: str, task: int, environ=os.environ) -> str:
    """``task_label`` with its address, for the task TensorFlow calls ``/job:JOB/task:N``
    (its coordination service and collectives name them so): ``chief 0 (node1:2222)``."""
    try:
        config = cluster(environ)
    except DistributeError:
        config = {}
    jobs = config.get("cluster", {})
    addresses = jobs.get(job) or []
    if job not in TRAINING_TASKS or not 0 <= task < len(addresses):
        return f"{job} {task}"
    index = task + (len(jobs.get("chief") or []) if job == "worker" else 0)
    return f"{task_label(index, environ)} ({addresses[task]})"


def leader_name(environ=os.environ) -> str:
    """The coordination service's leader, named as ``task_name`` does: TF_CONFIG's chief
    when there is one, else worker 0 (TensorFlow's ``multi_worker_util.coordination_leader``)."""
    try:
        has_chief = bool(cluster(environ).get("cluster", {}).get("chief"))
    except DistributeError:
        has_chief = False
    return task_name("chief" if has_chief else "worker", 0, environ)


def multi_process() -> bool:
    """True in a run of several processes; False when the environment says nothing usable."""
    try:
        return world().size > 1
    except DistributeError:
        return False


def resolve_strategy(
    name: str, num_gpus: int, horovod_mpi: bool = False, found: World | None = None
) -> str:
    """Resolves ``auto`` from the launcher's world (``found``, read from the environment when
    None; ``num_gpus``: physical GPUs of this machine; ``horovod_mpi``: an installed Horovod
    has its MPI controller); other names are returned as they are. Under mpirun without
    Horovod-with-MPI, multi_worker_mirrored builds its cluster from the MPI world."""
    if name != "auto":
        return name
    found = found or world()
    if found.launcher == "horovodrun" or (found.launcher == "mpirun" and horovod_mpi):
        return "horovod"
    if found.size > 1:
        return "multi_worker_mirrored"
    return "mirrored" if num_gpus > 1 else "default"


def check_launch(strategy: str) -> None:
    """Raises the one-line DistributeError that the environment alone decides: a launcher's
    variable or TF_CONFIG that does not parse, an explicit ``strategy`` that cannot join the
    processes they say were started (``auto`` resolves once TensorFlow counts the GPUs). Pure
    Python: tfgpu.main calls it before TensorFlow's import (seconds), and setup again after."""
    found = world()
    if strategy != "auto":
        check_world(strategy, found)


def check_world(strategy: str, found: World) -> None:
    """Raises a one-line DistributeError when the resolved ``strategy`` cannot make one job of
    the processes ``found`` says were started: N processes never train N copies silently."""
    many = f"this is process {found.rank} of {found.size} ({found.evidence})"
    if strategy == "horovod" and found.launcher not in HOROVOD_LAUNCHERS:
        if found.size <= 1:
            raise DistributeError(
                "--strategy=horovod must run under horovodrun or mpirun, e.g. "
                "`horovodrun -np 2 -H localhost:2 python -m tfgpu.main --strategy=horovod`"
            )
        raise DistributeError(
            f"--strategy=horovod needs horovodrun or mpirun, but {many}; use --strategy=auto "
            "(multi_worker_mirrored over that cluster)"
        )
    if found.size <= 1:
        return
    if strategy in SINGLE_PROCESS:
        raise DistributeError(
            f"--strategy={strategy} trains on one machine, but {many}: they would train "
            f"{found.size} separate copies into one --model_dir; use --strategy=auto"
        )
    if strategy == "multi_worker_mirrored" and found.launcher == "horovodrun":
        raise DistributeError(
            f"--strategy=multi_worker_mirrored does not run under horovodrun ({many}); use "
            "--strategy=horovod, or mpirun / TF_CONFIG / tfgpu.launch"
        )


# Where free_ports looks first: below the kernel's range for outgoing connections' local ports.
# A port of that range, free when picked (bind to 0), can be handed to any process's outgoing
# connection before the worker binds it (seen: 16 workers starting at once, "Could not start
# gRPC server"); one below it is only ever taken by a server binding it on purpose.
PORTS_FROM = 20000
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def free_ports(count: int) -> list[int]:
    """``count`` different ports that are free now, below the ephemeral range where there is
    room (random, checked by binding), else the OS's picks."""
    try:
        with open(EPHEMERAL_RANGE, encoding="ascii") as f:
            below = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        below = 32768  # Linux's default
    candidates = []
    if below - PORTS_FROM >= 100 * count:
        candidates = random.SystemRandom().sample(range(PORTS_FROM, below), k=50 * count)
    sockets = []
    try:
        for port in [*candidates, *[0] * count]:  # the OS's picks last
            s = socket.socket()
            try:
                s.bind(("", port))
            except OSError:
                s.close()
                continue
            sockets.append(s)
            if len(sockets) == count:
                break
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def advertised_host() -> str:
    """This process's address as the other workers reach it: its cluster address's host, or
    (under horovodrun) the address of the route to horovodrun's rendezvous server, else
    ``local_address()``."""
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
    return local_address()


def local_address() -> str:
    """How other machines can reach this one: its host name where that resolves to an address
    other than loopback (Kubernetes pods, /etc/hosts, DNS), else its first IPv4 address that is
    not loopback, else 127.0.0.1."""
    name = socket.getfqdn()
    try:
        if not socket.gethostbyname(name).startswith("127."):
            return name
    except OSError:
        pass
    import psutil  # noqa: PLC0415  (only here: a one-machine run never asks)

    stats = psutil.net_if_stats()
    for interface, addresses in psutil.net_if_addrs().items():
        if interface in stats and not stats[interface].isup:
            continue
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return "127.0.0.1"
