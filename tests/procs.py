"""Real processes in tests: start them, read their output as it comes, find Horovod's ranks,
and kill whole process trees however a test ends."""

import os
import re
import subprocess
import sys
import threading
import time

import psutil

# A line TensorFlow's C++ (or absl) wrote: "I0000 00:00:17.1 ...", "W1205 ...", and absl's
# notice before its log is initialized.
TF_LINE = re.compile(r"^(?:[IWEF]\d{4} |WARNING: All log messages before absl).*$", re.M)
# The one line a worker that lost a peer ends with (exit 5), before the peer's name.
LOST_LINE = "tfgpu: error: lost contact with another worker ("


class Output:
    """Collects a process's merged output on a thread, so pipes never fill up."""

    def __init__(self, proc):
        self.proc, self.lines = proc, []
        self.closed = threading.Event()  # set when the process's end of the pipe is closed
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        try:
            for line in self.proc.stdout:
                self.lines.append(line)
        finally:
            self.closed.set()

    def drained(self, timeout: float = 10) -> str:
        """The whole output once the pipe is closed (the process and its children that
        share its stdout have ended, or were killed), waiting at most ``timeout`` s."""
        self.closed.wait(timeout)
        return self.text

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for_step(self, step: int, timeout: float = 150) -> None:
        """Waits until the chief has logged ``step`` (a checkpoint at step 4 is then on disk)."""
        deadline = time.time() + timeout
        while not re.search(rf"step\s+{step}/", self.text):
            assert self.proc.poll() is None, self.text[-3000:]
            assert time.time() < deadline, "no progress: " + self.text[-3000:]
            time.sleep(0.1)


def popen(cmd, env=None):
    env = dict(env or os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def kill_tree(proc: subprocess.Popen) -> None:
    """Kills a process and everything it started (launcher workers, horovodrun ranks)."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        family = []
    for p in [*family, proc]:
        try:
            p.kill()
        except (psutil.Error, OSError):
            pass


def rank_process(horovodrun: subprocess.Popen, rank: int) -> psutil.Process:
    """The python process of ``rank`` among horovodrun's descendants (read from its env)."""
    for child in psutil.Process(horovodrun.pid).children(recursive=True):
        try:
            if "tfgpu.main" in " ".join(child.cmdline()) and child.environ().get(
                "HOROVOD_RANK"
            ) == str(rank):
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no process of rank {rank}")


FLOOD = os.path.join(os.path.dirname(__file__), "flood.py")


def start_flood(output: Output, timeout: float = 150) -> subprocess.Popen:
    """Once a run's chief has said where its heartbeats listen, a process flooding those
    ports with hostile datagrams (``tests/flood.py``); kill it with ``kill_tree``."""
    found = wait_for(output, r"listening: heartbeats on UDP ([\d.:, ]+) \(", timeout)
    ports = [address.rsplit(":", 1)[1] for address in found.group(1).split(", ")]
    return subprocess.Popen(
        [sys.executable, FLOOD, *ports], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_until_idle(proc: subprocess.Popen, timeout: float, window_s: float = 2.0) -> None:
    """Waits until ``proc`` is blocked: it used under 5% of a core (its threads together)
    over the last ``window_s`` seconds, as a process waiting in a collective for a peer does
    (its heartbeats cost far less); fails if it ends or ``timeout`` passes first."""
    process, deadline = psutil.Process(proc.pid), time.time() + timeout
    spent = []  # (when, CPU seconds so far)
    while True:
        assert proc.poll() is None, f"process {proc.pid} ended, exit code {proc.returncode}"
        assert time.time() < deadline, f"process {proc.pid} still busy after {timeout} s"
        times = process.cpu_times()
        spent.append((time.time(), times.user + times.system))
        old = [s for s in spent if s[0] <= spent[-1][0] - window_s]
        if old and spent[-1][1] - old[-1][1] < 0.05 * (spent[-1][0] - old[-1][0]):
            return
        time.sleep(0.25)


def wait_for(output: Output, pattern: str, timeout: float) -> re.Match:
    """The first match of ``pattern`` in a process's ``output``, waited for (bounded)."""
    deadline = time.time() + timeout
    while not re.search(pattern, output.text):
        assert output.proc.poll() is None, output.text[-3000:]
        assert time.time() < deadline, f"no {pattern!r}: " + output.text[-3000:]
        time.sleep(0.1)
    return re.search(pattern, output.text)


def assert_each_worker_quiet(text: str) -> None:
    """``text``, what two multi_worker_mirrored workers under tfgpu.launch printed with
    TF_CPP_MIN_LOG_LEVEL=3, holds none of TensorFlow's lines (each worker used to print its
    early ones: tests/cli/test_quiet_start.py) and worker 0's start."""
    tf_lines = [line for line in text.splitlines() if TF_LINE.match(line.split("] ", 1)[-1])]
    assert not tf_lines, text[-3000:]
    assert re.search(r"^\[worker 0\] multi_worker_mirrored: 2 replica", text, re.M), text[-3000:]
