"""Where the test suite's CPU goes, test by test: a pytest plugin and its summary.

As a plugin (bench/ on the path), it appends one JSON line per test to ``$SUITE_CPU_OUT``
(default /tmp/suite_cpu.jsonl): the test, its xdist worker, its start and end, and the CPU
of its pytest process and of the child processes it reaped meanwhile (a module fixture's
processes land on the module's first test; processes nobody waits for, such as Ray's, are
not counted):

    PYTHONPATH=bench .venv/bin/python -m pytest -q -p suite_cpu -n 3 --dist loadfile \\
        --no-loadscope-reorder tests

Then ``python bench/suite_cpu.py /tmp/suite_cpu.jsonl`` prints each worker's busy time and
CPU, and the modules by CPU (wall, own, children, and wall minus CPU: time spent waiting or
sharing a core with the other workers).
"""

import collections
import json
import os
import resource
import sys
import time

import pytest

OUT = os.environ.get("SUITE_CPU_OUT", "/tmp/suite_cpu.jsonl")


def _cpu() -> tuple[float, float]:
    """(this process's, its reaped children's) user + system seconds."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started, (own, children) = time.time(), _cpu()
    yield
    ended, (own_after, children_after) = time.time(), _cpu()
    row = {
        "id": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "start": started,
        "end": ended,
        "own": own_after - own,
        "children": children_after - children,
    }
    with open(OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def summary(rows: list[dict], most: int = 40) -> list[str]:
    """The lines that ``main`` prints for ``rows`` (the plugin's JSON lines)."""
    first = min(r["start"] for r in rows)
    lines = [f"span {max(r['end'] for r in rows) - first:.1f} s"]
    workers = collections.defaultdict(list)
    for r in rows:
        workers[r["worker"]].append(r)
    for name, mine in sorted(workers.items()):
        busy = sum(r["end"] - r["start"] for r in mine)
        cpu = sum(r["own"] + r["children"] for r in mine)
        lines.append(f"{name}: busy {busy:.1f} s, cpu {cpu:.1f} s, {len(mine)} tests")
    modules = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for r in rows:
        m = modules[r["id"].split("::")[0]]
        m[0] += r["end"] - r["start"]
        m[1] += r["own"]
        m[2] += r["children"]
        m[3] += 1
    lines.append(f"cpu in all {sum(m[1] + m[2] for m in modules.values()):.1f} s")
    lines.append(f"{'module':64s} {'wall':>7s} {'own':>7s} {'child':>7s} {'wait':>7s} tests")
    ranked = sorted(modules.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
    for name, (wall, own, child, n) in ranked[:most]:
        lines.append(
            f"{name:64s} {wall:7.1f} {own:7.1f} {child:7.1f} {wall - own - child:7.1f} {n}"
        )
    return lines


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else OUT
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        print(f"suite_cpu: {path} holds no test", file=sys.stderr)
        return 2
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
