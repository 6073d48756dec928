"""How long ``python -m tfgpu.main --help`` and a bad-flag error take, now and at a git
revision, side by side (alternating runs; medians).

    python bench/startup.py --before=5a119b9 [--rounds=5]

The revision is checked out into a temporary git worktree; both run with this interpreter.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {
    "--help": ["--help"],
    "--model=resnet5 (an error)": ["--model=resnet5", "--model_dir=" + tempfile.gettempdir()],
}


def seconds(tree: str, argv: list) -> float:
    env = dict(os.environ, PYTHONPATH=tree, TF_CPP_MIN_LOG_LEVEL="3")
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tfgpu.main", *argv], cwd=tree, env=env, capture_output=True
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    before = tempfile.mkdtemp(prefix="tfgpu-before-")
    subprocess.run(
        ["git", "-C", ROOT, "worktree", "add", "-q", "--detach", before, args.before], check=True
    )
    try:
        times = {(t, c): [] for t in ("before", "now") for c in COMMANDS}
        for _ in range(args.rounds):
            for tree, path in (("before", before), ("now", ROOT)):
                for name, argv in COMMANDS.items():
                    times[tree, name].append(seconds(path, argv))
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", before], check=False)
    print(f"| command | {args.before} | now | |\n|---|---:|---:|---:|")
    for name in COMMANDS:
        b, n = statistics.median(times["before", name]), statistics.median(times["now", name])
        print(f"| `python -m tfgpu.main {name}` | {b:.2f} s | {n:.2f} s | {b / n:.1f}x |")


if __name__ == "__main__":
    main()
