"""Kills at any moment, again and again: a real run SIGKILLed at random moments and at chosen
ones (tracing, an update, inside a checkpoint, best/, metrics.jsonl, summary.csv or the export
being written), started again with the same command until it finishes, ends with exactly the
uninterrupted run's weights and files (tests/chaos.py has the loop and its moments).

The seed is printed (pytest -s shows it; a failure's report too); TFGPU_CHAOS_SEED=N replays
its choices. A few kills per job here; bench/chaos_soak.py runs many.
"""

import dataclasses
import random
import re
import signal
import sys

import pytest
from absl import flags as absl_flags
from chaos import SEED_ENV, chaos_run, chaos_seed, jobs, run_until_done
from own_nets import env_with, write_module
from procs import LOST_LINE
from requires import requires

from tfgpu import train
from tfgpu.cli.flags import define_flags
from tfgpu.cli.train import make_config

# Each test runs its job a few times over (about 1-2 minutes on 2 shared cores); the bound is
# for a hang, on a machine far busier than that.
pytestmark = pytest.mark.timeout(900)


def _chaos(job, tmp_path, kinds: list, alone: bool = False) -> list:
    """The job uninterrupted, then killed at a moment of each of ``kinds`` in turn until it
    finishes (a kind, or "kind:whom": all of its processes or one); every kill must land, and
    the two must hold the same weights and rows, to the byte. ``alone``: the uninterrupted run
    is one process (this one) even for a multi-process job, whose flags make one process
    compute the same bits.
    Returns the chaos run's attempts (``chaos.Attempt``)."""
    seed = chaos_seed()
    print(f"{job.name}: chaos seed {seed} (replay: {SEED_ENV}={seed})", file=sys.stderr)
    rng = random.Random(seed)
    reference = str(tmp_path / "uninterrupted")
    if job.kind == "single" or alone:
        whole = _in_this_process(job, reference, kinds)
    else:
        (whole,) = run_until_done(job, reference, [], rng)
    attempts, lost = chaos_run(job, str(tmp_path / "chaos"), (reference, whole), kinds, rng)
    # Every kind, not just one: an attempt that finishes before its moment ends the chaos run,
    # and the kinds after it would go unchecked.
    landed = [a.moment.kind for a in attempts if a.moment is not None]
    assert landed == [kind.split(":")[0] for kind in kinds], (seed, landed)
    assert not any(lost.values()), (seed, lost)
    return attempts


def _in_this_process(job, model_dir: str, kinds: list) -> None:
    """A job's uninterrupted run, one process: the pytest worker. Its flags parsed into a
    fresh set of tfgpu.main's and made its Config as the command makes them, trained (the
    killed attempts are the processes; this run's claim is what it writes). Returns None: no
    start or tracing time of its own to draw a "startup" or "time" moment from."""
    assert not {k.split(":")[0] for k in kinds} & {"startup", "time"}, kinds
    values = absl_flags.FlagValues()
    define_flags(values)
    argv = ["tfgpu", "--strategy=default", *job.flags, f"--model_dir={model_dir}"]
    values(argv)
    summary = train.run(make_config(values, argv))
    assert summary["steps"] == job.flag("train_steps"), summary


def test_one_process_killed_at_any_moment_ends_as_the_uninterrupted_run(small_dataset, tmp_path):
    _chaos(
        jobs(small_dataset)["single"],
        tmp_path,
        ["tracing", "checkpoint", "metrics.jsonl", "summary.csv"],
    )


def test_batchnorm_ema_keep_best_and_export_killed_in_every_write(
    small_dataset, tmp_path, monkeypatch
):
    """chaos.BATCHNORM's job on a user's two Conv-BatchNorm blocks (own_nets.functional_bn,
    imported by every attempt from PYTHONPATH) instead of resnet20: BatchNorm's moving
    statistics, the EMA, best/ and the export are the claim, not the model (measured: an
    uninterrupted run 12.1 CPU-s with resnet20, 5.3 with these)."""
    folder = tmp_path / "own"
    folder.mkdir()
    model = f"--model={write_module(folder)}:functional_bn"
    monkeypatch.setenv("PYTHONPATH", env_with(folder)["PYTHONPATH"])
    job = jobs(small_dataset)["batchnorm"]
    flags = [model if f == "--model=resnet20" else f for f in job.flags]
    assert model in flags
    job = dataclasses.replace(job, name="functional_bn + EMA + keep_best + export", flags=flags)
    _chaos(job, tmp_path, ["best", "export"])


def test_two_workers_killed_one_or_all_end_as_the_uninterrupted_job(small_dataset, tmp_path):
    """chaos.TINY's two workers under tfgpu.launch, at 16x16: both kills come at a moment the run
    itself names (a progress line drawn from those still to come, a checkpoint's write), not at
    a time, so faster updates (~25 ms of CPU instead of ~65 at 32x32) cannot carry the run past
    them. With --micro_batch_size=8 each worker takes its 8 examples in one micro-batch (as
    without it) and one process takes two, summed as the all-reduce sums the workers': the job
    uninterrupted is run once, by this process (measured: two workers and one process end with
    the same weights, metrics.jsonl and summary.csv rows, to the byte; two processes fewer than
    running the two-worker job uninterrupted). The attempt whose worker is killed mid-update is
    also the launcher's case: ``_check_launcher``."""
    job = jobs(small_dataset)["mwms"]
    flags = ["--image_size=16" if f == "--image_size=32" else f for f in job.flags]
    assert "--image_size=16" in flags
    name = "tiny_cnn, 2 workers under tfgpu.launch"
    job = dataclasses.replace(job, name=name, kind="launch", flags=[*flags, "--micro_batch_size=8"])
    attempts = _chaos(job, tmp_path, ["update:one", "checkpoint:all"], alone=True)
    _check_launcher(next(a for a in attempts if a.moment and a.moment.kind == "update"))


def _check_launcher(killed) -> None:
    """``killed``, the attempt one of whose workers was killed -9 as it ran (chaos.Attempt: its
    output, each line prefixed "[0] [worker i]"): tfgpu.launch names that worker as the one that
    failed first and how, exits as it did, and the other stops on its own within the launcher's
    grace (30 s, before any SIGTERM) with the one line of a lost peer, no traceback
    (chaos.check_attempt)."""
    text = killed.text
    first = r"^\[0\] tfgpu\.launch: worker (\d) failed first \(killed by SIGKILL\); stopping"
    found = re.search(first + " the others$", text, re.M)
    assert found and killed.code == 128 + signal.SIGKILL, (killed.code, text[-3000:])
    survivor = f"[0] [worker {1 - int(found.group(1))}] "
    said = [line for line in text.splitlines() if line.startswith(survivor + "tfgpu: ")]
    assert said and said[-1].startswith(survivor + LOST_LINE), text[-3000:]
    assert "stopped by SIGTERM" not in text, text[-3000:]


@pytest.mark.heavy  # the two-worker case above shows the claim; this one under Horovod
def test_horovod_ranks_killed_end_as_the_uninterrupted_job(small_dataset, tmp_path):
    requires("horovod")
    _chaos(jobs(small_dataset)["horovod"], tmp_path, ["update:one"])
