"""tfgpu's own training loop as a Ray Train job (``tfgpu-ray``): one Ray worker per process,
multi_worker_mirrored between them, restarts by Ray, resume by tfgpu.

The path: Ray Train V2's ``ray.train.tensorflow.TensorflowTrainer``, Ray's supported way to run
TensorFlow (V2 is the default in the Ray tested, 2.60, and V1's trainer is deprecated). Its
backend writes each worker's TF_CONFIG (workers only, no chief, a free port per worker, picked
afresh for every attempt), which tfgpu already reads: worker 0 is the chief and writes
--model_dir. Each worker is a Ray actor, a process of its own that runs the command's
``tfgpu.cli.ray.train_worker`` in a thread (so tfgpu's signal handling, ``signals.install``, stays
out: signals are Ray's there, and a fork inside Ray's worker is not wanted); when one fails,
Ray kills the whole group and (``FailureConfig(max_failures=K)``) starts a new one in new
processes, so TensorFlow sets up its devices and strategy afresh. The new chief resumes from
the newest checkpoint in --model_dir, as a restarted ``tfgpu.main`` does; Ray's own checkpoints
are not used (tfgpu's hold the input position and everything else an exact resume needs). Ray
still wants a ``storage_path``: ``<model_dir>/ray``, where it keeps only a marker file, on
storage every node of the cluster must see anyway (the chief of the next attempt may be on
another node).

Here: the job (``RayJob``), connecting (``connect``), the trainer (``build_trainer``), a worker's
entry, and what a failure was (``describe_failure``, ``root_cause``); the command
(``tfgpu/cli/ray.py``) checks that Ray is there, runs the job and turns its end into an exit
code. Nothing here imports Ray or TensorFlow at import time.
"""

import dataclasses
import logging
import os
import re

from absl import logging as absl_logging

from tfgpu.distribute import DistributeError, env
from tfgpu.errors import TfgpuError, WorkerLost, first_line


@dataclasses.dataclass(frozen=True)
class RayJob:
    """How the job runs on Ray: workers (one process each), one GPU each or not, how many
    failures Ray restarts the group after (-1: always), and the cluster ("" = RAY_ADDRESS if
    set, as in a KubeRay RayJob, else a new local cluster)."""

    num_workers: int
    use_gpu: bool = False
    max_failures: int = 0
    address: str = ""


def storage_path(model_dir: str) -> str:
    """Where Ray Train keeps its own files: ``<model_dir>/ray`` (absolute, or the same URI)."""
    if "://" in model_dir:
        return model_dir.rstrip("/") + "/ray"
    return os.path.join(os.path.abspath(model_dir), "ray")


def connect(job: RayJob) -> str:
    """Connects to the cluster ``job`` names, or starts a local one; returns how to name it."""
    import ray

    address = job.address or os.environ.get("RAY_ADDRESS", "")
    # Errors only from the Python loggers of the job's Ray processes: without Ray's dashboard
    # (not in ray[train]) Ray Train's placement-group cleaner warns every second that it cannot
    # ask the state API. With a job logging config, Ray forwards the processes' lines without
    # its "(RayTrainWorker pid=...)" prefix: each worker says once which pid it is.
    quiet = dict(
        logging_level=logging.WARNING,
        logging_config=ray.LoggingConfig(encoding="TEXT", log_level="ERROR"),
    )
    try:
        if address:
            ray.init(address=address, **quiet)
            return f"the Ray cluster at {address}"
        # As many CPU slots as workers, even on a smaller machine (as tfgpu.launch allows).
        # "local": a new cluster of its own, never one that Ray's last-cluster file names
        # (a stale one from an earlier `ray start` would be joined, or refuse num_cpus).
        cpus = max(os.cpu_count() or 1, job.num_workers)
        ray.init(address="local", num_cpus=cpus, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as err:
        first = first_line(err)
        raise DistributeError(f"Ray could not start or connect ({first})") from None
    # Ray's servers bind every interface (measured: GCS, raylet, each worker): say so.
    return "a local Ray cluster (it listens on EVERY interface: docs/security.md)"


def build_trainer(job: RayJob, worker, job_config: dict, model_dir: str, callbacks=()):
    """The TensorflowTrainer that runs ``worker(job_config)`` on every worker (the job's
    ``train_loop_config``: what the command hands each worker, the driver's directory added
    as "cwd"), its storage under ``model_dir`` (the run's), and Ray Train ``callbacks`` in its
    controller."""
    from ray.train import FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    run_config = RunConfig(
        name="tfgpu",
        storage_path=storage_path(model_dir),
        failure_config=FailureConfig(max_failures=job.max_failures),
        # Ray Train's console logs would print every worker error's traceback (tfgpu says it in
        # one line); they stay in the session's log files (/tmp/ray/session_latest/logs/train).
        logging_config=LoggingConfig(log_level="CRITICAL"),
        callbacks=list(callbacks),
    )
    return TensorflowTrainer(
        worker,
        # The workers start in Ray's session folder: relative paths are the driver's.
        train_loop_config=dict(job_config, cwd=os.getcwd()),
        scaling_config=ScalingConfig(num_workers=job.num_workers, use_gpu=job.use_gpu),
        run_config=run_config,
    )


def enter_worker(job: dict) -> None:
    """Makes a Ray Train worker's process (Ray set its TF_CONFIG) fit for tfgpu's loop on
    ``job["config"]``, before TensorFlow is imported: Keras 3, the driver's directory
    ``job["cwd"]``, quiet logs."""
    # Ray sets it for tf.keras users; tfgpu is Keras 3 and tf_keras is not installed.
    os.environ.pop("TF_USE_LEGACY_KERAS", None)
    if os.path.isdir(job["cwd"]):
        os.chdir(job["cwd"])
    # tf.distribute logs every reduction at INFO (tfgpu.main: the same)
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)


def whoami() -> str:
    """``worker I of N: pid P, HOST:PORT`` from the TF_CONFIG Ray wrote for this worker."""
    config = env.read_tf_config()
    index, workers = int(config["task"]["index"]), config["cluster"]["worker"]
    return f"worker {index} of {len(workers)}: pid {os.getpid()}, {workers[index]}"


def describe_failure(rank: int, err: BaseException) -> tuple[str, int, TfgpuError | None]:
    """What worker ``rank``'s failure (as Ray reports it) was: (one line, exit code, the
    TfgpuError it raised or None). An exception that is not tfgpu's gives its type and first
    line, exit code 1."""
    raised = getattr(err, "_base_exc", None)  # Ray's wrapper of an exception the worker raised
    if isinstance(raised, TfgpuError):
        return f"worker {rank}: {raised.message}", raised.exit_code, raised
    if raised is not None:
        first = (str(raised).strip().splitlines() or [""])[0]
        return f"worker {rank} raised {type(raised).__name__}: {first}", 1, None
    pid = re.search(r"\bpid[=:] ?(\d+)", str(err))
    who = f"worker {rank}" + (f" (pid {pid.group(1)})" if pid else "")
    return (
        f"{who}: its process died (killed, out of memory, or it exited)",
        WorkerLost.exit_code,
        None,
    )


def root_cause(failures: dict) -> int:
    """The rank whose failure (``failures``: rank -> error, as Ray reports them) to name: a
    tfgpu error first, then one that is not tfgpu's (a bug: its traceback), then a process
    that died, then a lost peer (the consequence of one that died); the lowest rank among
    equals."""

    def order(rank: int) -> tuple:
        _, code, raised = describe_failure(rank, failures[rank])
        if isinstance(raised, WorkerLost):
            return 3, rank
        if raised is not None:
            return 0, rank
        return (2 if code == WorkerLost.exit_code else 1), rank

    return min(failures, key=order)
