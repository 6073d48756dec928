"""tfgpu's own training loop as a Ray Train job (``tfgpu-ray``): one Ray worker per process,
multi_worker_mirrored between them, restarts by Ray, resume by tfgpu.

The path: Ray Train V2's ``ray.train.tensorflow.TensorflowTrainer``, Ray's supported way to run
TensorFlow (V2 is the default in the Ray tested, 2.60, and V1's trainer is deprecated). Its
backend writes each worker's TF_CONFIG (workers only, no chief, a free port per worker, picked
afresh for every attempt), which tfgpu already reads: worker 0 is the chief and writes
--model_dir. Each worker is a Ray actor, a process of its own that runs the command's
``tfgpu.ray.train_worker`` in a thread (so tfgpu's signal handling, ``faults.install``, stays
out: signals are Ray's there, and a fork inside Ray's worker is not wanted); when one fails,
Ray kills the whole group and (``FailureConfig(max_failures=K)``) starts a new one in new
processes, so TensorFlow sets up its devices and strategy afresh. The new chief resumes from
the newest checkpoint in --model_dir, as a restarted ``tfgpu.main`` does; Ray's own checkpoints
are not used (tfgpu's hold the input position and everything else an exact resume needs). Ray
still wants a ``storage_path``: ``<model_dir>/ray``, where it keeps only a marker file, on
storage every node of the cluster must see anyway (the chief of the next attempt may be on
another node).

Nothing here imports Ray or TensorFlow at import time: ``tfgpu-ray`` without Ray installed
stops with one line (``require_ray``).
"""

import dataclasses
import logging
import os
import re
import signal
import sys
import time

from tfgpu.distribute import DistributeError
from tfgpu.errors import TfgpuError, WorkerLost, first_line

INSTALL = "pip install 'tfgpu[ray]'"
# Seconds the driver waits, after a run ends, for the workers' last lines (see run_job).
LOG_GRACE_S = 2.0
# Set before Ray is imported (it reads them then), unless the user set them.
RAY_ENV = {
    # Every worker prints its weights fingerprint: lines alike but for numbers, which Ray's
    # de-duplication would fold into one.
    "RAY_DEDUP_LOGS": "0",
    # Ray Train prints a worker's print() through its logger AND stdout: each line twice.
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
}


@dataclasses.dataclass(frozen=True)
class RayJob:
    """How the job runs on Ray: workers (one process each), one GPU each or not, how many
    failures Ray restarts the group after (-1: always), and the cluster ("" = RAY_ADDRESS if
    set, as in a KubeRay RayJob, else a new local cluster)."""

    num_workers: int
    use_gpu: bool = False
    max_failures: int = 0
    address: str = ""


def require_ray() -> None:
    """Returns when Ray Train (V2) can be imported (and imports it, with ``RAY_ENV`` set);
    else a DistributeError saying how to install it."""
    for name, value in RAY_ENV.items():
        os.environ.setdefault(name, value)
    try:
        import ray.train  # noqa: F401
    except ImportError:
        raise DistributeError(f"tfgpu-ray needs Ray Train: {INSTALL}") from None
    if os.environ.get("RAY_TRAIN_V2_ENABLED", "1").lower() in ("0", "false"):
        raise DistributeError("tfgpu-ray runs on Ray Train V2: unset RAY_TRAIN_V2_ENABLED=0")


def storage_path(model_dir: str) -> str:
    """Where Ray Train keeps its own files: ``<model_dir>/ray`` (absolute, or the same URI)."""
    if "://" in model_dir:
        return model_dir.rstrip("/") + "/ray"
    return os.path.join(os.path.abspath(model_dir), "ray")


def run_job(config, job: RayJob, worker) -> int:
    """Runs ``worker({"config": config, "cwd": ...})`` (``tfgpu.ray.train_worker``: tfgpu's
    loop) on ``job.num_workers`` Ray workers with ``config`` (a validated
    Config, strategy multi_worker_mirrored) until the run ends. Returns 0, or 128 + N after
    signal N stopped it (the workers stop without saving: the newest checkpoint is kept);
    raises the TfgpuError that ended it once Ray's restarts ran out."""
    require_ray()
    from tfgpu.cli import quiet as startup

    startup.quiet_log_level()  # the workers inherit it (a local cluster)
    startup.import_tensorflow()  # Ray's TensorflowTrainer imports it: without its notices
    import ray
    from ray.train import TrainingFailedError

    where = _connect(job)
    signalled = _note_sigterm()  # after ray.init, whose handler it calls
    print(f"tfgpu-ray: {_describe(job)} on {where}; --model_dir={config.model_dir}", flush=True)
    try:
        build_trainer(config, job, worker).fit()
        # The workers' last lines (each one's weights fingerprint) travel file -> Ray's log
        # monitor -> the driver; ray.shutdown() drops what has not arrived yet
        # (ray-project/ray#31931): measured lost on a loaded 2-core machine.
        time.sleep(LOG_GRACE_S)
    except TrainingFailedError as err:
        return job_failed(err, job)
    except KeyboardInterrupt:
        return _stopped("SIGINT")
    except SystemExit:
        if not signalled:
            raise
        return _stopped(signalled[0])
    finally:
        ray.shutdown()
    print(f"tfgpu-ray: done; the run's files are in {config.model_dir}", flush=True)
    return 0


def _stopped(name: str) -> int:
    """Says that signal ``name`` stopped the job; returns its exit code (128 + N)."""
    print(
        f"tfgpu-ray: stopped by {name}; the workers stopped without saving, the newest "
        "checkpoint in --model_dir is kept: run the same command again to resume",
        file=sys.stderr,
        flush=True,
    )
    return 128 + signal.Signals[name].value


def _note_sigterm() -> list:
    """Puts a SIGTERM handler before the one ray.init set (which stops a local cluster's
    processes and exits): returns a list that holds "SIGTERM" once the signal came."""
    seen: list = []
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        seen.append(signal.Signals(signum).name)
        if callable(previous):
            previous(signum, frame)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    return seen


def _describe(job: RayJob) -> str:
    device = "1 GPU" if job.use_gpu else "1 CPU"
    restarts = "always" if job.max_failures < 0 else f"up to {job.max_failures}"
    return f"{job.num_workers} worker(s), {device} each, restarts: {restarts}"


def _connect(job: RayJob) -> str:
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


def build_trainer(config, job: RayJob, worker):
    """The TensorflowTrainer that runs ``worker`` on every worker, with ``config``."""
    from ray.train import FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    run_config = RunConfig(
        name="tfgpu",
        storage_path=storage_path(config.model_dir),
        failure_config=FailureConfig(max_failures=job.max_failures),
        # Ray Train's console logs would print every worker error's traceback (tfgpu says it in
        # one line); they stay in the session's log files (/tmp/ray/session_latest/logs/train).
        logging_config=LoggingConfig(log_level="CRITICAL"),
        callbacks=[_failure_log(job.max_failures)],
    )
    return TensorflowTrainer(
        worker,
        # The workers start in Ray's session folder: relative paths are the driver's.
        train_loop_config={"config": config, "cwd": os.getcwd()},
        scaling_config=ScalingConfig(num_workers=job.num_workers, use_gpu=job.use_gpu),
        run_config=run_config,
    )


def enter_worker(job: dict) -> None:
    """Makes a Ray Train worker's process (Ray set its TF_CONFIG) fit for tfgpu's loop on
    ``job["config"]``: Keras 3, the driver's directory ``job["cwd"]``, quiet logs, TensorFlow
    imported; prints which worker it is."""
    # Ray sets it for tf.keras users; tfgpu is Keras 3 and tf_keras is not installed.
    os.environ.pop("TF_USE_LEGACY_KERAS", None)
    if os.path.isdir(job["cwd"]):
        os.chdir(job["cwd"])
    from absl import logging as absl_logging

    # tf.distribute logs every reduction at INFO (tfgpu.main: the same)
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    from tfgpu.cli import quiet as startup

    startup.import_tensorflow()
    print(f"tfgpu-ray: {_whoami()}", flush=True)


def leave_worker() -> None:
    """What a Ray worker must do itself when its run ends: Ray ends the actor with a kill, so
    no exit handler removes its scratch directories."""
    from tfgpu.distribute import common

    common.remove_scratch_dirs()


def _whoami() -> str:
    """``worker I of N: pid P, HOST:PORT`` from the TF_CONFIG Ray wrote for this worker."""
    from tfgpu.distribute import env

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


def _failure_log(max_failures: int):
    """A Ray Train callback (run in Ray's controller) that says, in one line per failed
    attempt, which worker failed and how, and whether Ray restarts the group."""
    from ray.train import UserCallback

    class FailureLog(UserCallback):
        def __init__(self):
            self.failures = 0

        def after_exception(self, run_context, worker_exceptions):
            del run_context
            self.failures += 1
            rank = root_cause(worker_exceptions)
            line = describe_failure(rank, worker_exceptions[rank])[0]
            if max_failures < 0 or self.failures <= max_failures:
                then = (
                    f"restart {self.failures} of {max_failures if max_failures >= 0 else 'any'}: "
                    "a new group resumes from the newest checkpoint in --model_dir"
                )
            else:
                then = f"no restart left (--max_failures={max_failures})"
            print(f"tfgpu-ray: attempt {self.failures} failed: {line}; {then}", flush=True)

    return FailureLog()


def job_failed(err, job: RayJob) -> int:
    """The exit code of a job Ray gave up on (``err``: Ray's TrainingFailedError), after one
    line saying why (or, for an error that is not tfgpu's, the worker's traceback)."""
    failures = getattr(err, "worker_failures", None)
    if not failures:  # the controller's or a preemption's: Ray's own words, first line
        first = first_line(err)
        raise DistributeError(f"Ray Train failed: {first}")
    rank = root_cause(failures)
    line, code, raised = describe_failure(rank, failures[rank])
    if code == 1 and raised is None:
        print(str(failures[rank]), file=sys.stderr, flush=True)  # the worker's traceback
        return 1
    after = f"after {job.max_failures} restart(s)" if job.max_failures > 0 else "(--max_failures=0)"
    error = (type(raised) if raised else WorkerLost)(f"{line}; Ray gave up {after}")
    raise error
