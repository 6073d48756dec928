"""How a run stops early on a signal (the errors, each with its exit code, are
``tfgpu.errors``; docs/faults.md has the table; ``op_errors.translate`` names what TensorFlow
raised).

SIGTERM and SIGINT (``scancel``, Kubernetes, ``timeout``, Ctrl-C) are never ignored:

- while training, a signal asks for a checkpoint at the next loop boundary, then exit 75;
- blocked longer than --stop_grace_s (waiting inside a collective for a worker that froze),
  or at start-up (nothing to save yet), the process stops at once with one line, exit 128+N;
- a second signal stops it at once.

A Python signal handler cannot do this: it only runs between bytecodes of the main thread,
which sits inside TensorFlow for as long as a collective waits; and MultiWorkerMirrored
installs its own SIGTERM handler, which swallows the signal. So ``install`` blocks both
signals in every thread (the mask is inherited by the threads TensorFlow starts later) and
a watcher thread takes them. While TensorFlow holds the interpreter lock (strategy creation
waiting for its peers), even that thread cannot run: a small guardian process, forked
before TensorFlow is imported, sees the signal still pending after a second and ends the run.
Processes started from here inherit the blocked mask: ``unblocked`` gives them the default.
"""

import mmap
import os
import signal
import threading
import time

SIGNALS = {signal.SIGTERM, signal.SIGINT}
_POLL_S = 0.2
_GUARDIAN_S = 1.5  # a signal pending this long: the interpreter is held, the watcher cannot run


class _State:
    """What the watcher knows of the run: its phase, step and pending stop request."""

    def __init__(self):
        self.phase, self.step = "start-up", 0
        self.signal_name, self.requested_at = "", 0.0
        self.stop_grace_s = 20.0
        self.board = mmap.mmap(-1, 256)  # shared with the forked guardian

    def publish(self) -> None:
        text = f"{self.phase} at step {self.step}".encode()[:255]
        self.board[:] = text.ljust(256, b"\0")


_STATE = _State()
_INSTALLED = []


def install(stop_grace_s: float) -> None:
    """Takes SIGTERM and SIGINT away from every thread but the watcher (see the module
    docstring); call before TensorFlow is imported."""
    if _INSTALLED:
        return
    _STATE.stop_grace_s = stop_grace_s
    _STATE.publish()
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    _start_guardian(os.getpid())
    threading.Thread(target=_watch, daemon=True, name="tfgpu-signals").start()
    _INSTALLED.append(True)


def set_phase(phase: str, step: int | None = None) -> None:
    """Tells the watcher (and the guardian) where the run is: "start-up", "train", ..."""
    _STATE.phase = phase
    _STATE.step = _STATE.step if step is None else step
    _STATE.publish()


def acknowledge() -> None:
    """The loop took the stop request and is saving: no grace deadline from here on."""
    _STATE.requested_at = float("inf")


def unblocked() -> None:
    """``preexec_fn`` for a child process: the default signal handling again."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _stop_now(signal_name: str, why: str, signum: int) -> None:
    line = f"tfgpu: stopped by {signal_name} {why}; the last checkpoint is kept\n"
    os.write(2, line.encode())
    os._exit(128 + signum)


def _watch() -> None:
    """Takes pending signals and decides, every _POLL_S (see the module docstring)."""
    while True:
        time.sleep(_POLL_S)
        pending = signal.sigpending() & SIGNALS  # holds the GIL; takes nothing away
        state = _STATE
        if state.signal_name and time.monotonic() - state.requested_at > state.stop_grace_s:
            _stop_now(
                state.signal_name,
                f"at step {state.step}: blocked for more than --stop_grace_s="
                f"{state.stop_grace_s:g} s ({state.phase}; waiting for another worker?)",
                signal.Signals[state.signal_name],
            )
        if not pending:
            continue
        signum = min(pending)
        signal.sigtimedwait({signum}, 0)
        name = signal.Signals(signum).name
        if state.phase == "start-up":
            _stop_now(name, "at start-up, before training", signum)
        if state.signal_name:
            _stop_now(name, f"(a second signal) at step {state.step}", signum)
        state.signal_name, state.requested_at = name, time.monotonic()


def _start_guardian(pid: int) -> None:
    """Forks the process that ends ``pid`` when a signal stays pending (see the docstring)."""
    if os.fork():
        return
    try:
        _guard(pid)
    finally:
        os._exit(0)


def _guard(pid: int) -> None:
    since: dict = {}
    while os.getppid() == pid:
        time.sleep(_POLL_S)
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                status = f.read()
        except OSError:
            return
        pending = int(status.split("ShdPnd:")[1].split()[0], 16)
        now = time.monotonic()
        for signum in SIGNALS:
            if not pending >> (signum - 1) & 1:
                since.pop(signum, None)
            elif now - since.setdefault(signum, now) > _GUARDIAN_S:
                where = _STATE.board[:].rstrip(b"\0").decode(errors="replace")
                line = (
                    f"tfgpu: stopped by {signal.Signals(signum).name} during {where}, while "
                    "TensorFlow waited (for another worker?) and held the interpreter; the last "
                    "checkpoint is kept\n"
                )
                os.write(2, line.encode())
                os.kill(pid, signal.SIGKILL)
                return


class PreemptionGuard:
    """What the loop polls to stop at a boundary: the watcher's request when ``install`` ran
    (``tfgpu.main``), else Python signal handlers of its own (a run inside another program,
    e.g. a test), else (a run in a thread other than the main one) only the other workers'
    requests."""

    def __init__(self):
        self._previous = {}
        self._own = ""

    def __enter__(self):
        # Python runs signal handlers in the main thread only, and refuses to install them from
        # another: a loop run in a worker thread (Ray Train's workers run it in one) leaves
        # signals to the program that owns that thread.
        in_main_thread = threading.current_thread() is threading.main_thread()
        if not _INSTALLED and in_main_thread:
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame):
        del frame
        if self._own:  # a second signal: the user really wants out
            raise KeyboardInterrupt
        self._own = signal.Signals(signum).name

    @property
    def signal_name(self) -> str:
        return _STATE.signal_name or self._own

    def should_stop(self, backend) -> bool:
        """True when this process, or any other worker, was signalled (workers agree, so
        they all leave at the same step and no collective is left waiting)."""
        stop = bool(self.signal_name)
        if backend.num_workers > 1:
            stop = backend.any_worker(stop)
            if stop and not self.signal_name:
                self._own = "a signal to another worker"
        return stop
