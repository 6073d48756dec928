"""``tfgpu-ray --num_workers=N [--use_gpu] [--max_failures=K] [--address=ADDR] -- <tfgpu flags>``
(also ``python -m tfgpu.ray``): tfgpu's own training loop as a Ray Train job, one Ray worker per
process, ``--strategy=multi_worker_mirrored`` between them (extra ``[ray]``).

The tfgpu flags after ``--`` become the Config ``python -m tfgpu.main`` would build from them
(``cli.train.make_config``: checked here, before Ray starts); ``tfgpu.distribute.ray_train``
holds the Ray Train job it runs as.
When a worker dies, Ray restarts the group (up to --max_failures times) and the run resumes from
the newest checkpoint in --model_dir. A ``--model=package.module:function`` is imported by every
worker: a local cluster's inherit this PYTHONPATH, a cluster of several machines needs the module
installed on each node. docs/launchers/ray.md says more.
"""

import os
import signal
import sys
import time

from absl import flags

from tfgpu.cli import quiet
from tfgpu.cli.app import run_command
from tfgpu.cli.flags import command_settings, define_flags
from tfgpu.cli.train import check_writable
from tfgpu.cli.train import make_config as train_config
from tfgpu.distribute import ray_train
from tfgpu.distribute.ray_train import RayJob
from tfgpu.distribute.scratch import remove_scratch_dirs
from tfgpu.errors import (
    DistributeError,
    TfgpuError,
    UsageError,
    WorkerLost,
    first_line,
    install_extra,
    say,
)
from tfgpu import train  # light: the loop is loaded by train.run, in the worker
from tfgpu.train import op_errors

COMMAND = "tfgpu-ray"
USAGE = (
    "usage: tfgpu-ray --num_workers=N [--use_gpu] [--max_failures=K] [--address=ADDR] "
    "-- <tfgpu flags>"
)
STRATEGY = "multi_worker_mirrored"

HELP_FLAGS = ("-h", "--help", "--helpshort", "--helpfull")
INSTALL = install_extra("ray")
# Set before Ray is imported (it reads them then), unless the user set them.
RAY_ENV = {
    # Every worker prints its weights fingerprint: lines alike but for numbers, which Ray's
    # de-duplication would fold into one.
    "RAY_DEDUP_LOGS": "0",
    # Ray Train prints a worker's print() through its logger AND stdout: each line twice.
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
}
# Seconds the driver waits, after a run ends, for the workers' last lines (see run_job).
LOG_GRACE_S = 2.0


def ray_flags() -> flags.FlagValues:
    """tfgpu-ray's own flags (cli/settings.py: RaySettings), in a FlagValues of their own (the
    tfgpu flags get another)."""
    fv = flags.FlagValues()
    define_flags(fv, COMMAND)
    return fv


def parse(argv: list[str]):
    """(the RayJob, the tfgpu flags) from ``argv`` (without the program name); a UsageError
    when they do not make a job."""
    if "--" not in argv:
        raise UsageError(f"no `--` before the tfgpu flags; {USAGE}")
    split = argv.index("--")
    fv = ray_flags()
    rest = fv(["tfgpu-ray", *argv[:split]])[1:]
    f, _ = command_settings(COMMAND, fv)
    if rest:
        raise UsageError(f"unexpected arguments before `--`: {' '.join(rest)}; {USAGE}")
    if f.num_workers is None:
        raise UsageError(f"--num_workers is required; {USAGE}")
    if f.num_workers < 1:
        raise UsageError(f"--num_workers={f.num_workers} must be at least 1")
    if f.max_failures < -1:
        raise UsageError(f"--max_failures={f.max_failures} must be -1 (always) or more")
    return RayJob(f.num_workers, f.use_gpu, f.max_failures, f.address), argv[split + 1 :]


def require_ray() -> None:
    """Returns when Ray Train (V2) can be imported (and imports it, with ``RAY_ENV`` set);
    else a DistributeError saying how to install it."""
    for name, value in RAY_ENV.items():
        os.environ.setdefault(name, value)
    try:
        import ray.train  # noqa: F401  (Ray: an optional extra)
    except ImportError:
        raise DistributeError(f"tfgpu-ray needs Ray Train: {INSTALL}") from None
    if os.environ.get("RAY_TRAIN_V2_ENABLED", "1").lower() in ("0", "false"):
        raise DistributeError("tfgpu-ray runs on Ray Train V2: unset RAY_TRAIN_V2_ENABLED=0")


def make_config(tfgpu_argv: list[str]):
    """The validated Config of ``tfgpu_argv`` (tfgpu.main's flags), strategy
    multi_worker_mirrored (its --model_dir not checked for writing: ``_run`` does that where
    the workers share this machine)."""
    tfgpu_flags = flags.FlagValues()
    define_flags(tfgpu_flags)
    rest = tfgpu_flags(["tfgpu", *tfgpu_argv])[1:]  # a bad flag: flags.Error, one line
    if rest:
        raise UsageError(f"unexpected arguments after `--`: {' '.join(rest)}")
    strategy = tfgpu_flags["strategy"]
    if strategy.present and strategy.value not in ("auto", STRATEGY):
        raise UsageError(f"tfgpu-ray runs --strategy={STRATEGY}, not --strategy={strategy.value}")
    tfgpu_flags.strategy = STRATEGY  # also for one worker: TF_CONFIG names the cluster
    return train_config(tfgpu_flags, argv=["tfgpu", *tfgpu_argv])


def main(argv: list[str]) -> int:
    """``tfgpu-ray``'s exit code for ``argv`` (the program name first)."""
    args = argv[1:]
    if any(a in HELP_FLAGS for a in (args[: args.index("--")] if "--" in args else args)):
        fv = ray_flags()
        print(USAGE + "\n\n" + "\n".join(f"  --{n}: {fv[n].help}" for n in fv))
        print("\nThe tfgpu flags: python -m tfgpu.main --helpfull")
        return 0
    return run_command(_run, args, prog="tfgpu-ray")


def _run(argv: list[str]) -> int:
    job, tfgpu_argv = parse(argv)
    config = make_config(tfgpu_argv)  # bad flags refused before Ray's ~1 s import
    require_ray()
    if not (job.address or os.environ.get("RAY_ADDRESS")):  # local: the workers share this disk
        check_writable(config.model_dir)
    return run_job(config, job)


def run_job(config, job: RayJob) -> int:
    """Runs ``train_worker`` (tfgpu's loop) on ``job.num_workers`` Ray workers with ``config``
    (a validated Config, strategy multi_worker_mirrored) until the run ends. Returns 0, or
    128 + N after signal N stopped it (the workers stop without saving: the newest checkpoint
    is kept); raises the TfgpuError that ended it once Ray's restarts ran out."""
    require_ray()
    quiet.quiet_log_level()  # the workers inherit it (a local cluster)
    quiet.import_tensorflow()  # Ray's TensorflowTrainer imports it: without its notices
    # Ray is an optional extra ('.[ray]'), imported once the job is sure to run.
    import ray
    from ray.train import TrainingFailedError

    where = ray_train.connect(job)
    signalled = _note_sigterm()  # after ray.init, whose handler it calls
    print(f"tfgpu-ray: {_describe(job)} on {where}; --model_dir={config.model_dir}", flush=True)
    try:
        callbacks = [_failure_log(job.max_failures)]
        job_config = {"config": config}  # each worker's train.run(config)
        ray_train.build_trainer(job, train_worker, job_config, config.model_dir, callbacks).fit()
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


def _failure_log(max_failures: int):
    """A Ray Train callback (run in Ray's controller) that says, in one line per failed
    attempt, which worker failed and how, and whether Ray restarts the group."""
    from ray.train import UserCallback  # Ray: an optional extra, here present (run_job)

    class FailureLog(UserCallback):
        def __init__(self):
            self.failures = 0

        def after_exception(self, run_context, worker_exceptions):
            del run_context
            self.failures += 1
            rank = ray_train.root_cause(worker_exceptions)
            line = ray_train.describe_failure(rank, worker_exceptions[rank])[0]
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
        raise DistributeError(f"Ray Train failed: {first_line(err)}")
    rank = ray_train.root_cause(failures)
    line, code, raised = ray_train.describe_failure(rank, failures[rank])
    if code == 1 and raised is None:
        print(str(failures[rank]), file=sys.stderr, flush=True)  # the worker's traceback
        return 1
    after = f"after {job.max_failures} restart(s)" if job.max_failures > 0 else "(--max_failures=0)"
    raise (type(raised) if raised else WorkerLost)(f"{line}; Ray gave up {after}")


def train_worker(job: dict) -> None:
    """One Ray Train worker: tfgpu's loop on ``job["config"]`` from ``job["cwd"]``. Returns
    when the run is done; an error is printed as the one line a tfgpu process prints, then
    raised for Ray (which restarts the group or gives up)."""
    ray_train.enter_worker(job)
    quiet.import_tensorflow()
    print(f"tfgpu-ray: {ray_train.whoami()}", flush=True)
    try:
        train.run(job["config"])  # the loop, with TensorFlow, loaded now (train/__init__.py)
    except Exception as err:
        known = err if isinstance(err, TfgpuError) else op_errors.translate(err)
        if known is None:
            raise  # not tfgpu's: Ray keeps its traceback, the driver prints it
        say(known.line("tfgpu"))
        raise known from None
    finally:
        # Ray ends the actor with a kill: no exit handler removes its scratch directories.
        remove_scratch_dirs()


def run() -> None:
    """Console-script entry point (``tfgpu-ray``)."""
    sys.exit(main(sys.argv))


if __name__ == "__main__":
    run()
