"""tfgpu's commands with glibc's malloc and with jemalloc preloaded, side by side (alternating
runs; medians of wall and CPU seconds, the process and its children): a 6-update tiny_cnn run
(TensorFlow's import, tracing, the first steps), the same run as 2 multi_worker_mirrored
workers (tfgpu.launch), and a 150-update run, where the steps' own work weighs more.

    python bench/malloc.py [--rounds=5] [--library=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2]

The library defaults to Debian's libjemalloc2 (`make system` installs it), found where the
Makefile looks for it; the preload reaches every process a command starts (tfgpu.launch's
workers inherit the environment).
"""

import argparse
import glob
import statistics

from calibration import calibration
from startup import ROOT, SHORT_RUN, TINY, TWO_WORKERS, measure

# Where Debian (any architecture), and a source build, put it; the Makefile's JEMALLOC too.
SEARCH = (
    "/usr/lib/*/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
)
LONGER_RUN = [*TINY, "--strategy=default", "--train_steps=150", "--log_every_steps=50"]
COMMANDS = {
    "a 6-update tiny_cnn run": SHORT_RUN,
    "the same run on 2 workers": TWO_WORKERS,
    "a 150-update tiny_cnn run": LONGER_RUN,
}


def find_jemalloc() -> str:
    """The first jemalloc shared library of SEARCH, or "" if there is none."""
    found = [path for pattern in SEARCH for path in sorted(glob.glob(pattern))]
    return found[0] if found else ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--library", default=find_jemalloc(), help="the allocator to preload")
    args = parser.parse_args()
    if not args.library:
        raise SystemExit("no libjemalloc.so.2 found: apt-get install libjemalloc2, or --library")
    print(calibration())
    sides = {"glibc malloc": {}, "jemalloc": {"LD_PRELOAD": args.library}}
    times = {(side, name): [] for side in sides for name in COMMANDS}
    for _ in range(args.rounds):
        for side, env in sides.items():
            for name, argv in COMMANDS.items():
                times[side, name].append(measure(ROOT, argv, env=env, trains=True))
    print(f"preloaded: {args.library}")
    print("| command | glibc malloc wall / CPU | jemalloc wall / CPU | CPU ratio |")
    print("|---|---:|---:|---:|")
    for name in COMMANDS:
        (g_wall, g_cpu), (j_wall, j_cpu) = (
            [statistics.median(x) for x in zip(*times[side, name])] for side in sides
        )
        row = f"{g_wall:.2f} / {g_cpu:.2f} s | {j_wall:.2f} / {j_cpu:.2f} s | {g_cpu / j_cpu:.2f}x"
        print(f"| `{name}` | {row} |")


if __name__ == "__main__":
    main()
