"""``tfgpu-launch`` (``python -m tfgpu.launch``) ``--num_workers=N -- <tfgpu flags>``: N
multi-worker processes on one machine, each with its TF_CONFIG filled in (what torchrun is to
PyTorch).

Each worker's output is prefixed with ``[worker i]``. When one worker fails, the others are
stopped after ``--grace_s`` seconds (their collectives would time out anyway), and the launcher
exits with the first failing worker's code (128 + N for a worker killed by signal N;
``python -m tfgpu.main`` exits with 5 when it lost contact with another worker), after one line
saying which worker failed first and how. The workers inherit this process' environment: a
``--model=package.module:function`` is imported by each, from the same PYTHONPATH. For several
machines, set TF_CONFIG on each node yourself (docs/launchers/tfjob.md) and run
``python -m tfgpu.main --strategy=multi_worker_mirrored``.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import command_settings, define_flags
from tfgpu.distribute.env import free_ports
from tfgpu.errors import WorkerLost

COMMAND = "tfgpu-launch"
define_flags(command=COMMAND)  # cli/settings.py: LaunchSettings


def tf_configs(num_workers: int, host: str = "localhost") -> list[str]:
    """One TF_CONFIG JSON string per worker of a localhost cluster."""
    cluster = {"worker": [f"{host}:{p}" for p in free_ports(num_workers)]}
    return [
        json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        for i in range(num_workers)
    ]


LAST_LINES: dict = {}  # worker -> its last "tfgpu: ..." line, to say how it failed


def _pump(stream, worker: int) -> None:
    for line in iter(stream.readline, ""):
        if line.startswith("tfgpu:"):
            LAST_LINES[worker] = line.strip()
        sys.stdout.write(f"[worker {worker}] {line}")
        sys.stdout.flush()


def start_workers(argv: list[str], num_workers: int, host: str = "localhost"):
    """Starts ``python -m tfgpu.main <argv>`` N times; returns the Popen objects."""
    procs = []
    for i, tf_config in enumerate(tf_configs(num_workers, host)):
        env = dict(os.environ, TF_CONFIG=tf_config)
        cmd = [sys.executable, "-m", "tfgpu.main", *argv]
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=_pump, args=(proc.stdout, i), daemon=True).start()
        procs.append(proc)
    return procs


def wait_all(procs, grace_s: float) -> int:
    """Waits for every worker; after a failure, says which worker failed first and how, and
    stops the rest. Returns the exit code."""
    ended = _watch_ends(procs)
    failed_code, deadline = 0, None
    while True:
        done = len(ended) == len(procs)  # before the look: no end arrives unseen after it
        if any(code for _, code in ended.values()) and not failed_code:
            time.sleep(0.3)  # its last lines are still on their way through the pipe
            first = _first_failure(ended, len(procs))
            failed_code, deadline = ended[first][1], time.time() + grace_s
            print(f"tfgpu.launch: {failure(first, failed_code)}; stopping the others", flush=True)
        if done:
            break
        if deadline and time.time() > deadline:
            # SIGTERM first (a training worker saves and leaves); SIGKILL 10 s later, because
            # a worker still waiting for its peers at start-up does not act on SIGTERM.
            stop_all(procs, kill=time.time() > deadline + 10)
        time.sleep(0.2)
    return shell_code(failed_code)  # every failure is seen before the loop ends


LOST_WAIT_S = 3.0  # how long a lost-contact exit waits for the failure it reacted to


def _first_failure(ended: dict, num_workers: int) -> int:
    """The worker whose failure came first among ``ended`` (``_watch_ends``'): the earliest
    end, not the lowest index; and a worker that exited because it lost contact with another
    (WorkerLost's code) only when no other failure follows within LOST_WAIT_S. A survivor
    may end before the worker it lost is reaped (measured under load: an MWMS worker 0's
    exit 5 recorded before worker 1's SIGKILL)."""
    lost = WorkerLost.exit_code
    deadline = time.monotonic() + LOST_WAIT_S
    while len(ended) < num_workers and time.monotonic() < deadline:
        if any(code not in (0, lost) for _, code in ended.values()):
            break
        time.sleep(0.05)
    failures = sorted((code == lost, t, i) for i, (t, code) in ended.items() if code)
    return failures[0][2]


def _watch_ends(procs) -> dict:
    """{worker: (monotonic time it ended, its return code)}, filled as each ends by a thread
    blocked in its wait: the order of the ends as they happened, whatever the polling."""
    ended: dict = {}

    def watch(i: int, p) -> None:
        code = p.wait()
        ended[i] = (time.monotonic(), code)

    for i, p in enumerate(procs):
        threading.Thread(target=watch, args=(i, p), daemon=True).start()
    return ended


def failure(worker: int, returncode: int) -> str:
    """``worker 1 failed first (exit code 5: tfgpu: error: ...)`` or ``(killed by SIGKILL)``."""
    if returncode < 0:
        how = f"killed by {signal.Signals(-returncode).name}"
    else:
        how = f"exit code {returncode}"
    last = LAST_LINES.get(worker)
    return f"worker {worker} failed first ({how}{': ' + last if last else ''})"


def stop_all(procs, kill: bool = False) -> None:
    """Sends SIGTERM (or SIGKILL) to the workers still running."""
    for p in procs:
        if p.poll() is None:
            p.kill() if kill else p.terminate()


def shell_code(returncode: int) -> int:
    """A Popen return code as a shell reports it: killed by signal N (-N) becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def main(argv):
    return run_command(_launch, argv, prog="tfgpu.launch")


def _launch(argv) -> int:
    settings, _ = command_settings(COMMAND)
    procs = start_workers(argv[1:], settings.num_workers, settings.host)
    # SIGTERM (scancel, Kubernetes) reaches the workers, which save and leave.
    signal.signal(signal.SIGTERM, lambda *_: stop_all(procs))
    try:
        return wait_all(procs, settings.grace_s)
    except KeyboardInterrupt:
        stop_all(procs)
        return 130


def run():
    """Console-script entry point (``tfgpu-launch``)."""
    run_app(main, prog="tfgpu.launch", doc=__doc__, group=COMMAND)


if __name__ == "__main__":
    run()
