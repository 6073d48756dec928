"""A side channel that keeps running while training is blocked inside a collective: every
process tells every other, once a second over UDP, how far it got; a watchdog thread stops
the process when no update completes for --stall_timeout_s, naming the worker that holds
the others up and the step.

Why not TensorFlow's or Horovod's own: MWMS notices a dead or frozen process (heartbeats of
its coordination service), but not one alive and stuck outside the collective (a hung file
system, a deadlocked input thread): the others wait for --collective_timeout_s. Horovod's
stall inspector never reports under Gloo in 0.28.1 (it watches zero ranks), and Gloo's
timeout names no rank. Collectives release the GIL, so these threads run while the main
thread waits; what they read (the step counters) are variables, read concurrently.
"""

import json
import os
import socket
import sys
import threading
import time

from tfgpu.errors import WorkerLost

INTERVAL_S = 1.0
SILENT_S = 5.0  # a peer not heard from for this long is frozen, dead or unreachable
DONE = "done"


def open_socket(advertised_host: str) -> tuple[socket.socket, str]:
    """A UDP socket bound on every interface, and the ``host:port`` others reach it at."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", 0))
    return sock, f"{advertised_host}:{sock.getsockname()[1]}"


_CURRENT: list = []  # this process's board, once there is one


def silent_peers() -> str:
    """What this process's board says about peers gone silent ("" without a board)."""
    return _CURRENT[0].silent() if _CURRENT else ""


def finish() -> None:
    """Ends this process's watchdog: the run is past its last collective, and what follows
    (the summary, TensorFlow's shutdown, which waits for the other workers) must not be
    taken for a stall, nor the workers that have already left for lost ones."""
    set_phase(DONE)


def set_phase(phase: str) -> None:
    """Tells this process's board what the run does ("train" counts against the timeout)."""
    if _CURRENT:
        _CURRENT[0].phase = phase


class Board:
    """What every worker last said, and the watchdog that reads it.

    ``progress()`` returns this process's {"reduced": all-reduces entered, "step": updates
    done}; ``names[i]`` says how to call worker i in a message. ``phase`` is set by the loop:
    only "train" counts against the stall timeout, once an update has completed.
    """

    def __init__(self, sock, index: int, peers: list, names: list, progress, timeout_s: float):
        self.sock, self.index, self.peers, self.names = sock, index, peers, names
        self.progress, self.timeout_s = progress, timeout_s
        self.phase = "startup"
        self.heard: dict = {}  # worker -> (monotonic time, its message)
        self._moved = (time.monotonic(), None)  # (when our counter last changed, its value)
        self._listening_since = time.monotonic()
        _CURRENT[:] = [self]
        for target in (self._send, self._receive, self._watch):
            threading.Thread(target=target, daemon=True, name=f"tfgpu-{target.__name__}").start()

    def _send(self) -> None:
        addresses = [_split(p) for i, p in enumerate(self.peers) if i != self.index]
        while True:
            message = json.dumps({"worker": self.index, "phase": self.phase, **self.progress()})
            for address in addresses:
                try:
                    self.sock.sendto(message.encode(), address)
                except OSError:  # unreachable for now: the watchdog judges, not the sender
                    pass
            time.sleep(INTERVAL_S)

    def _receive(self) -> None:
        while True:
            data, _ = self.sock.recvfrom(4096)
            try:
                message = json.loads(data)
                self.heard[int(message["worker"])] = (time.monotonic(), message)
            except (ValueError, KeyError, TypeError):
                continue  # not ours

    def _watch(self) -> None:
        """Stops the process when its all-reduce counter stands still for the timeout during
        training: after the first update always; before it (tracing and compiling may take
        long everywhere) only when some worker is silent or behind the others. In any phase,
        when every other worker has gone silent (``_all_gone``)."""
        while self.phase != DONE:
            before = time.monotonic()
            time.sleep(INTERVAL_S / 2)
            mine, now = self.progress(), time.monotonic()
            if now - before > SILENT_S:  # this process stood still (the GIL held, or frozen):
                self._listening_since = now  # what the peers said meanwhile is still queued
            if self.phase == DONE:
                return
            if self.timeout_s and self._all_gone(now):
                self._leave(f"every other worker went silent ({self.silent()})")
            if mine["reduced"] != self._moved[1] or self.phase != "train":
                self._moved = (now, mine["reduced"])
                continue
            stalled = self.timeout_s and now - self._moved[0] > self.timeout_s
            if stalled and (mine["step"] or self.silent() or self._behind()[0]):
                self._stop(mine, now - self._moved[0])

    def _all_gone(self, now: float) -> bool:
        """True when every other worker was heard once and not for 3 x SILENT_S since: they
        stopped (or this machine lost the network), and this one, stuck outside the loop,
        would wait for ever."""
        others = [i for i in range(len(self.peers)) if i != self.index]
        heard = [self._last_heard(i) for i in others]
        return all(h is not None and now - h > 3 * SILENT_S for h in heard)

    def _last_heard(self, worker: int) -> float | None:
        """When ``worker`` was last heard from, or since when this process has been able to
        listen if that is later (None: never heard)."""
        when = self.heard.get(worker, (None,))[0]
        return None if when is None else max(when, self._listening_since)

    def _stop(self, mine: dict, idle: float) -> None:
        self._leave(
            f"training stalled at update {mine['step'] + 1} (no update for {idle:.0f} s, "
            f"--stall_timeout_s={self.timeout_s:g}): {self.culprit()}; every worker stops"
        )

    def _leave(self, why: str) -> None:
        line = f"tfgpu: error: {why}; the last checkpoint is kept\n"
        os.write(sys.stderr.fileno(), line.encode())
        os._exit(WorkerLost.exit_code)  # the main thread is stuck in TensorFlow

    def culprit(self) -> str:
        """Who holds the others up: a worker gone silent, else one that has not reached the
        all-reduce the others wait in, else everyone."""
        silent, (behind, top) = self.silent(), self._behind()
        if silent:
            return silent
        if behind:
            return (
                f"{', '.join(self.names[i] for i in behind)} alive but not at the all-reduce "
                f"of update {max(top, 1)} the others wait in (its input pipeline, file system or a "
                "thread is stuck)"
            )
        return "every worker is waiting (no one is behind)"

    def _behind(self) -> tuple[list, int]:
        """(workers that entered fewer all-reduces than the most advanced, that count). While
        this one trains, a worker still in start-up (stuck reading its data into memory, say)
        is behind too, whatever its count."""
        reduced = {i: m["reduced"] for i, (_, m) in self.heard.items()}
        reduced[self.index] = self.progress()["reduced"]
        top = max(reduced.values())
        late = {
            i
            for i, (_, m) in self.heard.items()
            if self.phase == "train" and m.get("phase") == "startup"
        }
        return [i for i, r in sorted(reduced.items()) if r < top or i in late], top

    def silent(self) -> str:
        """ "worker i (...) went silent at update N (nothing for S s)" for peers not heard
        from in SILENT_S, or ""."""
        now, out = time.monotonic(), []
        for i in range(len(self.peers)):
            if i == self.index:
                continue
            when, message = self._last_heard(i), self.heard.get(i, (None, None))[1]
            if when is None:
                out.append(f"{self.names[i]} never heard from")
            elif now - when > SILENT_S:
                out.append(
                    f"{self.names[i]} went silent at update {message['step'] + 1} (nothing "
                    f"heard for {now - when:.0f} s: frozen, dead or unreachable)"
                )
        return "; ".join(out)


def _split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)
