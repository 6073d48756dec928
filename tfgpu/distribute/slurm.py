"""A Slurm job step (``srun --ntasks=N python -m tfgpu.main ...``) as a multi-worker cluster,
read from the ``SLURM_*`` variables srun sets. No TensorFlow here.

TensorFlow's own SlurmClusterResolver is not used: it sorts host names as strings (so in
``n[9-10]`` task 0 on n9 is given n10's address, and the job hangs), gives every job on a
node the same ports (8888, 8889, ...), and renumbers CUDA_VISIBLE_DEVICES. Here hosts keep
Slurm's order, ports depend on the job and step, and the GPUs Slurm made visible are kept.
"""

import itertools
import os
import re

from tfgpu.distribute import DistributeError, gpu_share

_PORT_BASE, _PORT_SLOTS, _PORTS_PER_STEP = 20000, 2500, 16


def in_slurm_step(environ=os.environ) -> bool:
    """True in a task of an srun step with more than one task."""
    return "SLURM_PROCID" in environ and tasks(environ) > 1


def tf_config(environ=os.environ) -> dict:
    """The TF_CONFIG dict of this task: every task of the step a worker, ``host:port``."""
    nodes = expand_hostlist(_first(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
    counts = expand_counts(_first(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if len(nodes) != len(counts) or sum(counts) != tasks(environ):
        raise DistributeError(
            f"Slurm's variables disagree: {len(nodes)} nodes, tasks per node {counts}, "
            f"{tasks(environ)} tasks"
        )
    distribution = environ.get("SLURM_DISTRIBUTION", "block").split(":")[0]
    if distribution not in ("block", "*", ""):
        raise DistributeError(
            f"SLURM_DISTRIBUTION={distribution}: tfgpu maps tasks to nodes in Slurm's default "
            "block order; run srun with --distribution=block"
        )
    base = port_base(environ)
    workers = [f"{node}:{base + i}" for node, count in zip(nodes, counts) for i in range(count)]
    task = int(environ["SLURM_PROCID"])
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": task}}


def port_base(environ=os.environ) -> int:
    """The first port of this job step on every node: the same for all its tasks, different
    for other jobs and steps on the node (a hash: 2,500 slots of 16 ports from 20000)."""
    job = int(_first(environ, "SLURM_JOB_ID", "SLURM_JOBID", default="0"))
    step = int(_first(environ, "SLURM_STEP_ID", "SLURM_STEPID", default="0"))
    return _PORT_BASE + (job * _PORTS_PER_STEP + step) % _PORT_SLOTS * _PORTS_PER_STEP


def local_gpus(num_gpus: int, environ=os.environ) -> list[int]:
    """Positions, among the ``num_gpus`` GPUs this task sees, of those it should use: all of
    them when Slurm already gave each task its own (--gpus-per-task), else this local task's
    equal share of the node's (every task sees all of them)."""
    local_tasks = expand_counts(
        _first(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", default="1")
    )[int(environ.get("SLURM_NODEID", 0))]
    return gpu_share(num_gpus, int(environ.get("SLURM_LOCALID", 0)), local_tasks)


def expand_hostlist(expression: str) -> list[str]:
    """Slurm's host list syntax, in its order: ``node[01-03,7],gpu5`` -> node01, node02,
    node03, node7, gpu5 (leading zeros keep their width; several brackets multiply)."""
    hosts = []
    for part in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", expression.strip()):
        pieces = re.split(r"(\[[^\]]*\])", part)
        hosts += ["".join(p) for p in itertools.product(*map(_choices, pieces))]
    if not hosts:
        raise DistributeError(f"cannot read Slurm's host list {expression!r}")
    return hosts


def _choices(piece: str) -> list[str]:
    if not piece.startswith("["):
        return [piece]
    out = []
    for item in piece[1:-1].split(","):
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise DistributeError(f"cannot read the range {item!r} of a Slurm host list")
        out += [str(i).zfill(len(low)) for i in range(int(low), int(high or low) + 1)]
    return out


def expand_counts(expression: str) -> list[int]:
    """Slurm's repeated counts: ``2(x3),1`` -> [2, 2, 2, 1]."""
    out = []
    for part in expression.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise DistributeError(f"cannot read Slurm's task counts {expression!r}")
        out += [int(match.group(1))] * int(match.group(2) or 1)
    return out


def tasks(environ) -> int:
    """Tasks of this srun step (1 outside one); a value that is not a number is a one-line
    DistributeError naming it."""
    value = _first(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default="1")
    if not value.strip().isdigit():
        raise DistributeError(f"Slurm's task count {value!r} is not a whole number")
    return int(value)


def _first(environ, *names: str, default: str | None = None) -> str:
    value = next((environ[n] for n in names if n in environ), default)
    if value is None:
        raise DistributeError(f"under srun but {names[0]} is not set")
    return value
