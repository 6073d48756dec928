"""The chaos soak: tests/e2e/test_chaos.py's loop for longer. Real runs SIGKILLed at random moments
of every kind (start-up, tracing, an update, inside a checkpoint, best/, metrics.jsonl,
summary.csv or the export being written), started again with the same command until each
finishes, each held to the same command run uninterrupted.

    python bench/chaos_soak.py [--kills=40] [--minutes=10] [--jobs=single,batchnorm,mwms,horovod]
                               [--kills_per_run=4] [--seed=N]

Jobs take turns; each run of one is killed --kills_per_run times at moments drawn at random
(the kind, whom of a multi-process job, when), then finishes. It stops after --kills kills or
--minutes (the run under way finishes first), or at the first failure, with the seed that
replays its choices. Prints kills survived (by kind), restarts, bytes lost (weights, rows,
export, best/ that differ from the uninterrupted run's: 0 expected) and the time.
"""

import argparse
import collections
import os
import random
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # as the tests: Eigen's kernels
os.environ.setdefault("HOROVOD_CYCLE_TIME", "10")  # as the tests (tests/conftest.py)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from calibration import calibration  # noqa: E402
from chaos import SEED_ENV, chaos_run, jobs, run_until_done  # noqa: E402
from conftest import write_small_dataset  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=40)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--jobs", default="single,batchnorm,mwms,horovod")
    parser.add_argument("--kills_per_run", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None, help=f"(or {SEED_ENV})")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(os.environ.get(SEED_ENV) or time.time())
    print(calibration(), flush=True)
    print(f"chaos soak seed {seed} (replay: --seed={seed})", flush=True)
    rng, root = random.Random(seed), tempfile.mkdtemp(prefix="tfgpu-chaos-")
    available = jobs(write_small_dataset(os.path.join(root, "data"), source="bench"))
    chosen = [available[name] for name in args.jobs.split(",")]
    started, references = time.time(), {}
    kills, restarts, runs, lost = collections.Counter(), 0, 0, collections.Counter()
    while sum(kills.values()) < args.kills and time.time() - started < args.minutes * 60:
        job = chosen[runs % len(chosen)]
        if job.name not in references:
            folder = os.path.join(root, f"uninterrupted-{len(references)}")
            references[job.name] = (folder, run_until_done(job, folder, [], rng)[0])
        kinds = [rng.choice(job.kinds) for _ in range(args.kills_per_run)]
        model_dir = os.path.join(root, f"run-{runs}")
        try:
            attempts, found = chaos_run(job, model_dir, references[job.name], kinds, rng)
        except AssertionError as err:
            print(
                f"FAILED in run {runs + 1} ({job.name}, kept in {model_dir}; replay: "
                f"--seed={seed}):\n{str(err)[-3000:]}",
                flush=True,
            )
            return 1
        runs += 1
        restarts += len(attempts) - 1
        for a in attempts:
            if a.moment is not None:
                kills[a.moment.kind] += 1
        lost.update(found)
        print(f"run {runs} ({job.name}): {len(attempts) - 1} kills; lost {dict(found)}", flush=True)
    total = sum(kills.values())
    print(
        f"\nkills survived: {total} ({', '.join(f'{k} {n}' for k, n in sorted(kills.items()))})"
        f"; restarts: {restarts}; runs: {runs}; bytes lost: {sum(lost.values())} "
        f"({dict(lost)}); time: {(time.time() - started) / 60:.1f} min",
        flush=True,
    )
    if sum(lost.values()):
        print(f"the runs are kept in {root}")
        return 1
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
