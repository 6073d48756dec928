"""How long commands take to start, now and at a git revision, side by side (alternating
runs; medians): ``python -m tfgpu.main --help``, a bad-flag error, a launch error (Horovod
without a launcher), a short training run
(tiny_cnn, 6 updates on synthetic data: TensorFlow's import, tracing and the first steps) and
the same run as 2 multi_worker_mirrored workers (``tfgpu.launch``), and, with Horovod,
tfgpu-horovodrun on 2 ranks that only echo, in wall seconds and CPU seconds (user + system,
the process and its children).

    python bench/startup.py --before=b6c7d94 [--rounds=5] [--before_path=DIR]

The revision is checked out into a temporary git worktree; both run with this interpreter.
``--before_path`` puts DIR ahead of the revision on its side only: an older dependency, e.g.
an unpacked wheel (``pip download ml_dtypes==0.7.0`` and unzip it into DIR).
"""

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from calibration import calibration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--synthetic_data", "--model=tiny_cnn", "--image_size=32", "--num_classes=10"]
TINY += ["--global_batch_size=16", "--train_steps=6", "--noexport"]
SHORT_RUN = [*TINY, "--strategy=default"]
# The same run as two multi_worker_mirrored workers on this machine (tfgpu.launch): what the
# collectives a run sets up and traces cost, beside TensorFlow's start-up in each worker.
TWO_WORKERS = ["-m", "tfgpu.launch", "--num_workers=2", "--", *TINY]
TWO_WORKERS += ["--strategy=multi_worker_mirrored"]
COMMANDS = {
    "--help": ["--help"],
    "--model=resnet5 (an error)": ["--model=resnet5", "--model_dir=" + tempfile.gettempdir()],
    # An error the environment alone decides (no launcher for Horovod): said before
    # TensorFlow's import since env.check_launch.
    "--strategy=horovod alone (an error)": [
        "--strategy=horovod",
        "--synthetic_data",
        "--model_dir=" + os.path.join(tempfile.mkdtemp(prefix="tfgpu-startup-"), "run"),
    ],
    "a 6-update tiny_cnn run": SHORT_RUN,
    "the same run on 2 workers": TWO_WORKERS,
}
TRAINS = (SHORT_RUN, TWO_WORKERS)
# tfgpu-horovodrun's own start (its build check, its rendezvous) with 2 ranks that only echo.
if importlib.util.find_spec("horovod"):
    HOROVODRUN = ["-m", "tfgpu.distribute.hvdrun", "--gloo", "-np", "2", "-H", "localhost:2"]
    COMMANDS["tfgpu-horovodrun, 2 ranks of `sh -c 'echo ok'`"] = [
        *HOROVODRUN,
        "sh",
        "-c",
        "echo ok",
    ]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(
    tree: str, argv: list, path: str = "", env: dict | None = None, trains: bool | None = None
) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``python -m tfgpu.main argv`` (or, for ``argv``
    starting with ``-m``, that module) with ``tree``'s tfgpu (and ``path`` ahead of it, if
    given), ``env`` added to the environment. ``trains``: whether it must train and exit 0
    (default: whether ``argv`` is one of TRAINS)."""
    pythonpath = os.pathsep.join(p for p in (path, tree) if p)
    env = dict(os.environ, PYTHONPATH=pythonpath, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    trains = argv in TRAINS if trains is None else trains  # the others exit early, some failing
    command = argv if argv[0] == "-m" else ["-m", "tfgpu.main", *argv]
    with tempfile.TemporaryDirectory() as model_dir:
        if trains:
            command = [*command, f"--model_dir={model_dir}/run"]
        cpu, start = _children_cpu(), time.perf_counter()
        out = subprocess.run([sys.executable, *command], cwd=tree, env=env, capture_output=True)
        wall = time.perf_counter() - start
    if trains and out.returncode != 0:
        raise SystemExit(out.stderr.decode()[-2000:])
    return wall, _children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before_path", default="", help="a directory ahead of --before")
    args = parser.parse_args()
    print(calibration())
    before = tempfile.mkdtemp(prefix="tfgpu-before-")
    subprocess.run(
        ["git", "-C", ROOT, "worktree", "add", "-q", "--detach", before, args.before], check=True
    )
    try:
        times = {(t, c): [] for t in ("before", "now") for c in COMMANDS}
        for _ in range(args.rounds):
            for tree, path, extra in (("before", before, args.before_path), ("now", ROOT, "")):
                for name, argv in COMMANDS.items():
                    times[tree, name].append(measure(path, argv, extra))
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", before], check=False)
    print(f"| command | {args.before} wall / CPU | now wall / CPU | CPU ratio |")
    print("|---|---:|---:|---:|")
    for name in COMMANDS:
        (bw, bc), (nw, nc) = (
            [statistics.median(x) for x in zip(*times[tree, name])] for tree in ("before", "now")
        )
        print(f"| `{name}` | {bw:.2f} / {bc:.2f} s | {nw:.2f} / {nc:.2f} s | {bc / nc:.2f}x |")


if __name__ == "__main__":
    main()
