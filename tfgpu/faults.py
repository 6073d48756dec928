"""How a run stops early: pre-emption signals, and the errors ``tfgpu.main`` turns into exit
codes (see the README's table of faults)."""

import signal


class CheckpointError(RuntimeError):
    """The final checkpoint could not be written."""


class Preempted(Exception):
    """The run was asked to stop (SIGTERM/SIGINT) and saved a checkpoint; run it again."""


class PreemptionGuard:
    """Turns SIGTERM and SIGINT into a flag the loop polls, so a pre-empted job saves a
    checkpoint at the next loop boundary instead of dying mid-step."""

    def __init__(self):
        self.signal_name = ""
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame):
        del frame
        if self.signal_name:  # a second signal: the user really wants out
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name

    def should_stop(self, backend) -> bool:
        """True when this process, or any other worker, was signalled (workers agree, so
        they all leave at the same step and no collective is left waiting)."""
        stop = bool(self.signal_name)
        if backend.num_workers > 1:
            stop = backend.any_worker(stop)
            self.signal_name = self.signal_name or ("a signal to another worker" if stop else "")
        return stop
