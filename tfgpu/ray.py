"""``tfgpu-ray --num_workers=N [--use_gpu] [--max_failures=K] [--address=ADDR] -- <tfgpu flags>``
(also ``python -m tfgpu.ray``): tfgpu's own training loop as a Ray Train job, one Ray worker per
process, ``--strategy=multi_worker_mirrored`` between them (extra ``[ray]``).

The tfgpu flags after ``--`` become the Config ``python -m tfgpu.main`` would build from them
(``main.make_config``: checked here, before Ray starts); ``tfgpu.distribute.ray_train`` runs it.
When a worker dies, Ray restarts the group (up to --max_failures times) and the run resumes from
the newest checkpoint in --model_dir. docs/launchers/ray.md says more.
"""

import os
import sys

from absl import flags

from tfgpu.errors import TfgpuError, UsageError, say

from tfgpu.cli.app import run_command

USAGE = (
    "usage: tfgpu-ray --num_workers=N [--use_gpu] [--max_failures=K] [--address=ADDR] "
    "-- <tfgpu flags>"
)
STRATEGY = "multi_worker_mirrored"

HELP_FLAGS = ("-h", "--help", "--helpshort", "--helpfull")


def ray_flags() -> flags.FlagValues:
    """tfgpu-ray's own flags, in a FlagValues of their own (the tfgpu flags get another)."""
    fv = flags.FlagValues()
    flags.DEFINE_integer("num_workers", None, "Ray workers: one process each.", flag_values=fv)
    flags.DEFINE_bool(
        "use_gpu", False, "One GPU per worker (Ray's ScalingConfig(use_gpu=True)).", flag_values=fv
    )
    flags.DEFINE_integer(
        "max_failures",
        0,
        "How many failed attempts Ray restarts the worker group after (-1: always); each "
        "restart resumes from the newest checkpoint in --model_dir.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "address",
        "",
        "An existing Ray cluster (its head HEAD_IP:6379, from a machine of the cluster); empty: "
        "RAY_ADDRESS if set, else a new local cluster.",
        flag_values=fv,
    )
    return fv


def parse(argv: list[str]):
    """(the RayJob, the tfgpu flags) from ``argv`` (without the program name); a UsageError
    when they do not make a job."""
    from tfgpu.distribute.ray_train import RayJob

    if "--" not in argv:
        raise UsageError(f"no `--` before the tfgpu flags; {USAGE}")
    split = argv.index("--")
    f = ray_flags()
    rest = f(["tfgpu-ray", *argv[:split]])[1:]
    if rest:
        raise UsageError(f"unexpected arguments before `--`: {' '.join(rest)}; {USAGE}")
    if f.num_workers is None:
        raise UsageError(f"--num_workers is required; {USAGE}")
    if f.num_workers < 1:
        raise UsageError(f"--num_workers={f.num_workers} must be at least 1")
    if f.max_failures < -1:
        raise UsageError(f"--max_failures={f.max_failures} must be -1 (always) or more")
    return RayJob(f.num_workers, f.use_gpu, f.max_failures, f.address), argv[split + 1 :]


def make_config(tfgpu_argv: list[str], local: bool):
    """The validated Config of ``tfgpu_argv`` (tfgpu.main's flags), strategy
    multi_worker_mirrored; ``local``: the workers share this machine, so --model_dir is
    checked for writing here."""
    from tfgpu import main
    from tfgpu.cli.flags import define_flags

    tfgpu_flags = flags.FlagValues()
    define_flags(tfgpu_flags)
    rest = tfgpu_flags(["tfgpu", *tfgpu_argv])[1:]  # a bad flag: flags.Error, one line
    if rest:
        raise UsageError(f"unexpected arguments after `--`: {' '.join(rest)}")
    strategy = tfgpu_flags["strategy"]
    if strategy.present and strategy.value not in ("auto", STRATEGY):
        raise UsageError(f"tfgpu-ray runs --strategy={STRATEGY}, not --strategy={strategy.value}")
    tfgpu_flags.strategy = STRATEGY  # also for one worker: TF_CONFIG names the cluster
    config = main.make_config(tfgpu_flags)
    if local:
        main.check_writable(config.model_dir)
    return config


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
    from tfgpu.distribute import ray_train

    ray_train.require_ray()
    local = not (job.address or os.environ.get("RAY_ADDRESS"))
    config = make_config(tfgpu_argv, local)
    return ray_train.run_job(config, job, train_worker)


def train_worker(job: dict) -> None:
    """One Ray Train worker: tfgpu's loop on ``job["config"]`` from ``job["cwd"]``. Returns
    when the run is done; an error is printed as the one line a tfgpu process prints, then
    raised for Ray (which restarts the group or gives up)."""
    from tfgpu.distribute import ray_train

    ray_train.enter_worker(job)
    from tfgpu.train import faults, loop

    try:
        loop.run(job["config"])
    except Exception as err:
        known = err if isinstance(err, TfgpuError) else faults.translate(err)
        if known is None:
            raise  # not tfgpu's: Ray keeps its traceback, the driver prints it
        say(known.line("tfgpu"))
        raise known from None
    finally:
        ray_train.leave_worker()


def run() -> None:
    """Console-script entry point (``tfgpu-ray``)."""
    sys.exit(main(sys.argv))


if __name__ == "__main__":
    run()
