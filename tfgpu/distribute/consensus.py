"""Workers agree before they train: the same settings, tfgpu version, data and class weights,
or they all stop with one line naming the first difference and who holds it.

No TensorFlow here: the comparison is plain data; ``backend.all_gather_bytes`` moves it.
"""

import hashlib
import json
import os
import socket
import statistics

from tfgpu import __version__
from tfgpu.distribute import DistributeError, env


def this_worker() -> str:
    """How the others can name this worker: its cluster address, else host and pid."""
    try:
        config = env.cluster()
    except DistributeError:
        config = {}
    if config:
        task = config["task"]
        return config["cluster"][task["type"]][int(task["index"])]
    return f"{socket.gethostname()}, pid {os.getpid()}"


def named(index: int, where: str) -> str:
    """Training process ``index`` as messages name it: its launcher's word for it
    (``env.task_label``: ``chief 0``, ``worker 1``, ``rank 2``) and ``where`` it runs
    (``this_worker`` of that process)."""
    return f"{env.task_label(index)} ({where})"


def fingerprint(
    settings: dict, data: dict | None, error: str = "", class_weights: list | None = None
) -> dict:
    """What must be equal on every worker: ``settings`` (flag -> value, per-node ones left
    out), the tfgpu version, ``data`` (the data spec's shard names and counts) and the
    ``class_weights`` this worker resolved (floats, None when off); plus this worker's
    address and, when it could not get this far, its ``error``."""
    return {
        "where": this_worker(),
        "error": error,
        "tfgpu": __version__,
        "settings": settings,
        "data": data,
        # Each worker reads --class_weights=FILE on its own machine: equal flags can still
        # name different files, whose weights would make the replicas' gradients differ.
        "class_weights": _digest(class_weights),
    }


def _digest(values: list | None) -> str | None:
    """A short sha256 of ``values`` (floats, exact through JSON), None for None."""
    if values is None:
        return None
    text = json.dumps([float(v) for v in values])
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def agree(backend, mine: dict) -> list:
    """Gathers every worker's ``fingerprint`` and returns them, or raises DistributeError
    (on every worker) naming the first worker that failed, or the first field that differs
    and who holds which value. A collective: every worker must call it, also one that
    failed."""
    gathered = gather(backend, mine)
    message = disagreement(gathered)
    if message:
        raise DistributeError(message)
    return gathered


def disagreement(fingerprints: list) -> str:
    """One line about the first worker with an error or the first differing field; ""."""
    for i, f in enumerate(fingerprints):
        if f["error"]:
            return f"{named(i, f['where'])}: {f['error']}"
    first = fingerprints[0]
    checks = [("the tfgpu version", lambda f: f["tfgpu"])]
    checks += [(f"--{k}", lambda f, k=k: f["settings"].get(k)) for k in first["settings"]]
    checks += [
        (f"the data's {k}", lambda f, k=k: (f["data"] or {}).get(k)) for k in first["data"] or {}
    ]
    checks += [("the class weights (--class_weights)", lambda f: f.get("class_weights"))]
    for label, get in checks:
        values = [get(f) for f in fingerprints]
        if any(v != values[0] for v in values):
            holders = ", ".join(
                f"{_show(v)} on {named(i, fingerprints[i]['where'])}" for i, v in enumerate(values)
            )
            return f"the workers disagree on {label}: {holders}"
    return ""


def _show(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def gather(backend, mine: dict) -> list:
    """Every worker's ``mine`` (plain JSON data), in worker order. A collective."""
    return [json.loads(b) for b in backend.all_gather_bytes(json.dumps(mine).encode())]


def smallest(backend, mine: dict, key: str) -> tuple[int, list]:
    """(the smallest ``key`` of every worker's ``mine``, every worker's ``mine``): what
    all workers take when each found its own limit (--micro_batch_size=auto). A collective."""
    found = gather(backend, mine)
    return min(int(f[key]) for f in found), found


def step_time_skew(backend, compute_s: float) -> dict:
    """Every worker's compute seconds per update in the last window (its step time less what
    it waited in the gradient all-reduce) -> {"slowest_worker" (its index),
    "slowest_worker_name" (``named``), "slowest_compute_s", "median_compute_s"}. A
    collective: every worker calls it at the same step."""
    mine = json.dumps({"compute_s": compute_s, "where": this_worker()})
    gathered = [json.loads(b) for b in backend.all_gather_bytes(mine.encode())]
    values = [float(g["compute_s"]) for g in gathered]
    slowest = max(range(len(values)), key=values.__getitem__)
    return {
        "slowest_worker": slowest,
        "slowest_worker_name": named(slowest, gathered[slowest]["where"]),
        "slowest_compute_s": values[slowest],
        "median_compute_s": statistics.median(values),
    }
