"""What every worker of a run last said over the heartbeats, and what it says about them: who
went silent (``silent``), who is behind the all-reduce the others wait in (``behind``), whose
heartbeats are blocked while the collectives still flow (``blocked``), whether every other
worker is gone (``all_gone``), and so who holds the others up (``culprit``). Plain data and
clocks, no socket and no thread: ``heartbeats.Board`` keeps one up to date and its watchdog
acts on what it says.
"""

import time

DONE = "done"  # the phase after the run's last collective: nothing is watched any more


class Record:
    """What every worker last said. ``progress()`` returns this process's {"reduced":
    all-reduces entered, "step": updates done}; ``names[i]`` says how to call worker i in a
    message; ``peers[i]`` is where worker i's heartbeats are heard (``ip:port``);
    ``silent_s``: a peer not heard from for this long is frozen, dead or unreachable.
    ``phase`` is set by the loop: only "train" counts against the stall timeout, once an
    update has completed; ``heard`` is kept by whoever hears the peers."""

    def __init__(self, index: int, peers, names, progress, silent_s: float):
        self.index, self.peers, self.names = index, peers, names
        self.progress, self.silent_s = progress, silent_s
        self.phase = "startup"
        self.heard: dict = {}  # worker -> (monotonic time, its message)
        self.updated = (time.monotonic(), None)  # (when the update count last changed, it)
        self.listening_since = time.monotonic()

    def all_gone(self, now: float) -> bool:
        """True when every other worker was heard once and not for 3 x ``silent_s`` since: they
        stopped (or this machine lost the network), and this one, stuck outside the loop,
        would wait for ever."""
        others = [i for i in range(len(self.peers)) if i != self.index]
        heard = [self.last_heard(i) for i in others]
        return all(h is not None and now - h > 3 * self.silent_s for h in heard)

    def gone_line(self) -> str:
        """Why this worker stops when every other went silent: they are gone, or the network
        to them is, or only their heartbeats are (``blocked``)."""
        return self.blocked() or f"every other worker went silent ({self.silent()})"

    def blocked(self) -> str:
        """ "no heartbeat from worker i (...) for S s while all-reduces with them still
        complete ..." when peers fell silent while all-reduces with them went on completing
        for ``silent_s`` more (their UDP ports blocked, a firewall: the collectives' TCP still
        flows), else "". Such a run stops too: without its side channel a later hang would
        go unnoticed for --collective_timeout_s, so it stops while it can still say why."""
        now, late = time.monotonic(), []
        for i in range(len(self.peers)):
            when = self.last_heard(i) if i != self.index else None
            # Silent, and updates (whose all-reduces need every worker) completed since, for long.
            if when is not None and self.updated[0] - when > self.silent_s:
                late.append(i)
        if not late:
            return ""
        quiet_s = now - max(self.last_heard(i) for i in late)
        return (
            f"no heartbeat from {', '.join(self.names[i] for i in late)} for {quiet_s:.0f} s "
            f"while all-reduces with them still complete (update {self.progress()['step']}): "
            f"their heartbeats to this worker's UDP {self.peers[self.index]} do not arrive (a "
            "firewall?), and without them a lost worker would go unnoticed; open the heartbeat "
            "ports between the workers"
        )

    def last_heard(self, worker: int) -> float | None:
        """When ``worker`` was last heard from, or since when this process has been able to
        listen if that is later (None: never heard)."""
        when = self.heard.get(worker, (None,))[0]
        return None if when is None else max(when, self.listening_since)

    def culprit(self) -> str:
        """Who holds the others up: a worker gone silent, else one that has not reached the
        all-reduce the others wait in, else everyone."""
        silent, (behind, top) = self.silent(), self.behind()
        if silent:
            return silent
        if behind:
            return (
                f"{', '.join(self.names[i] for i in behind)} alive but not at the all-reduce "
                f"of update {max(top, 1)} the others wait in (its input pipeline, file system or a "
                "thread is stuck)"
            )
        return "every worker is waiting (no one is behind)"

    def behind(self) -> tuple[list, int]:
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
        from in self.silent_s, or "". N is the last update it took part in: the one its last
        heartbeat counted, or a later one completed here (each needed its all-reduce)."""
        now, out = time.monotonic(), []
        mine = self.progress()["step"]
        for i in range(len(self.peers)):
            if i == self.index:
                continue
            when, message = self.last_heard(i), self.heard.get(i, (None, None))[1]
            if when is None:
                out.append(f"{self.names[i]} never heard from")
            elif now - when > self.silent_s:
                out.append(
                    f"{self.names[i]} went silent at update {max(message['step'], mine)} "
                    f"(nothing heard for {now - when:.0f} s: frozen, dead or unreachable)"
                )
        return "; ".join(out)
