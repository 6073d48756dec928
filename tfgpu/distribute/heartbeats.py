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

Strangers can neither stop nor fool it: the socket is bound to this worker's advertised
address only, and every datagram is judged by ``heartbeat_wire.Inbox`` (the peers' addresses,
the run's HMAC key, every field, a growing counter against replays); what it refuses is
counted, and nothing a datagram holds can end the thread that reads it.
"""

import os
import re
import socket
import sys
import threading
import time

from tfgpu.distribute import env
from tfgpu.distribute import heartbeat_wire as wire
from tfgpu.distribute.heartbeat_record import DONE, Record
from tfgpu.distribute.scratch import remove_scratch_dirs
from tfgpu.errors import WorkerLost

INTERVAL_S = 1.0
SILENT_S = 5.0  # a peer not heard from for this long is frozen, dead or unreachable
# How every line that stops a run for a lost, frozen or unreachable worker ends: nothing
# since the last checkpoint was written anywhere else (only the chief writes them).
RESUME = (
    "the last checkpoint is kept: resume with the same command on every worker once they "
    "and the network between them are back"
)


def open_socket(advertised_host: str) -> tuple[socket.socket, str]:
    """A UDP socket bound to ``advertised_host``'s address (that interface only), and the
    ``ip:port`` others reach it at. A host name that is not an address of this machine (a
    Kubernetes service name, a NAT's address) gives way to this machine's address on the
    route to it; only when neither can be bound does the socket listen on every interface
    (the messages are still authenticated), with a warning."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for candidate in (_resolve, _route_to):
        ip = candidate(advertised_host)
        try:
            if ip:
                sock.bind((ip, 0))
                return sock, f"{ip}:{sock.getsockname()[1]}"
        except OSError:  # not an address of this machine (EADDRNOTAVAIL): the next one
            pass
    sock.bind(("0.0.0.0", 0))
    _say(
        f"warning: heartbeats: no address of this machine for {advertised_host!r}: listening "
        "on every interface (messages are still authenticated)"
    )
    return sock, f"{advertised_host}:{sock.getsockname()[1]}"


def _resolve(host: str) -> str:
    """``host``'s IPv4 address, or "" when it has none."""
    try:
        return socket.gethostbyname(host.strip("[]"))
    except (OSError, UnicodeError):
        return ""


def _route_to(host: str) -> str:
    """This machine's address on the route to ``host`` (no packet is sent), or ""."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((_resolve(host) or host, 9))
        return probe.getsockname()[0]
    except (OSError, UnicodeError):
        return ""
    finally:
        probe.close()


def _say(line: str) -> None:
    """One line on stderr, written at once (also from a thread, while the main one waits)."""
    try:
        os.write(sys.stderr.fileno(), f"tfgpu: {line}\n".encode())
    except OSError:  # stderr gone (its reader ended): nothing to tell
        pass


_CURRENT: list = []  # this process's board, once there is one


def claim_last_word() -> bool:
    """True for the first caller only while a board watches (always without one): the
    board's watchdog and the main thread (an error TensorFlow raised as the peers vanished)
    may both see a lost worker at the same moment, and the process ends with one line."""
    return _CURRENT[0].last_word.acquire(blocking=False) if _CURRENT else True


def silent_peers() -> str:
    """What this process's board says about peers gone silent, or about their heartbeats
    blocked ("" without a board)."""
    return (_CURRENT[0].blocked() or _CURRENT[0].silent()) if _CURRENT else ""


def tally() -> str:
    """ "N heard from peers, M dropped (why: count, ...)" (or "none dropped"): what this
    process's board accepted and refused; "" without a board."""
    if not _CURRENT:
        return ""
    inbox = _CURRENT[0].inbox
    reasons = ", ".join(f"{why}: {n}" for why, n in inbox.dropped.most_common())
    dropped = f"{sum(inbox.dropped.values())} dropped ({reasons})" if reasons else "none dropped"
    return f"{inbox.accepted} heard from peers, {dropped}"


def finish() -> None:
    """Ends this process's watchdog: the run is past its last collective, and what follows
    (the summary, TensorFlow's shutdown, which waits for the other workers) must not be
    taken for a stall, nor the workers that have already left for lost ones."""
    set_phase(DONE)


def set_phase(phase: str) -> None:
    """Tells this process's board what the run does ("train" counts against the timeout)."""
    if _CURRENT:
        _CURRENT[0].phase = phase


class Board(Record):
    """What every worker last said (a ``heartbeat_record.Record``: ``progress``, ``names``,
    ``peers``, ``phase``, and who is silent, behind or blocked), the threads that send and
    hear it over ``sock``, and the watchdog that reads it. ``key``: the run's heartbeat key
    (``heartbeat_wire.new_key``'s bytes); ``timeout_s``: --stall_timeout_s.
    """

    def __init__(self, sock, index, peers, names, progress, timeout_s: float, key: bytes):
        super().__init__(index, peers, names, progress, SILENT_S)
        self.sock, self.timeout_s = sock, timeout_s
        self.last_word = threading.Lock()  # held by whoever says why the process ends
        self._moved = (time.monotonic(), None)  # (when our counter last changed, its value)
        senders = {_address(p): i for i, p in enumerate(peers) if i != index}
        self.inbox, self.key = wire.Inbox(key, senders, len(peers)), key
        _CURRENT[:] = [self]
        for target in (self._send, self._receive, self._watch):
            threading.Thread(target=target, daemon=True, name=f"tfgpu-{target.__name__}").start()

    def _send(self) -> None:
        addresses = [_address(p) for i, p in enumerate(self.peers) if i != self.index]
        seq = 0
        while True:
            seq += 1  # a receiver takes only a larger one: a replayed message says nothing
            mine = self.progress()
            message = wire.encode(
                self.key, self.index, seq, self.phase, mine["reduced"], mine["step"]
            )
            if self.sock.fileno() < 0:
                return  # closed: the board is over
            for address in addresses:
                try:
                    self.sock.sendto(message, address)
                except OSError:  # unreachable for now: the watchdog judges, not the sender
                    pass
            time.sleep(INTERVAL_S)

    def _receive(self) -> None:
        """Reads datagrams for ever: each is judged by the inbox (which never raises), and
        nothing else here can fail on what a datagram holds."""
        warned = False
        while True:
            try:
                # One byte more than a message may have: a longer datagram is seen as such.
                data, source = self.sock.recvfrom(wire.MAX_BYTES + 1)
            except OSError:
                if self.sock.fileno() < 0:
                    return  # closed: the board is over
                time.sleep(0.01)  # a queued ICMP error, say: the next read goes on
                continue
            message, why = self.inbox.accept(data, source)
            if message is not None:
                self.heard[message["worker"]] = (time.monotonic(), message)
            elif not warned and why != "replayed or out of order":  # reordering is normal
                warned = True
                _say(
                    f"warning: heartbeats: dropped a datagram from {source[0]}:{source[1]} "
                    f"({why}); further ones are counted and reported at the end"
                )

    def _watch(self) -> None:
        """Stops the process when its all-reduce counter stands still for the timeout during
        training: after the first update always; before it (tracing and compiling may take
        long everywhere) only when some worker is silent or behind the others. In any phase,
        when every other worker has gone silent (``all_gone``)."""
        while self.phase != DONE:
            before = time.monotonic()
            time.sleep(INTERVAL_S / 2)
            mine, now = self.progress(), time.monotonic()
            if now - before > self.silent_s:  # this process stood still (the GIL held, or frozen):
                self.listening_since = now  # what the peers said meanwhile is still queued
            if self.phase == DONE:
                return
            if mine["step"] != self.updated[1]:
                self.updated = (now, mine["step"])
            if self.timeout_s and self.all_gone(now):
                _leave(self.gone_line())
            if mine["reduced"] != self._moved[1] or self.phase != "train":
                self._moved = (now, mine["reduced"])
                continue
            stalled = self.timeout_s and now - self._moved[0] > self.timeout_s
            if stalled and (mine["step"] or self.silent() or self.behind()[0]):
                self._stop(mine, now - self._moved[0])

    def _stop(self, mine: dict, idle: float) -> None:
        _leave(
            f"training stalled at update {mine['step'] + 1} (no update for {idle:.0f} s, "
            f"--stall_timeout_s={self.timeout_s:g}): {self.culprit()}; every worker stops"
        )


def _leave(why: str) -> None:
    """Ends the process with one line: the main thread is stuck in TensorFlow. A non-chief's
    scratch checkpoints go first (the exit handlers that would remove them do not run). When
    the main thread has already said why it ends (``claim_last_word``), it is ended without a
    second line: its way out, TensorFlow's shut-down, waits for the peers that are gone
    (measured: 17 s more on loaded cores)."""
    first = claim_last_word()
    remove_scratch_dirs()  # the main thread may be saving into one: it tries again
    if first:
        os.write(sys.stderr.fileno(), f"tfgpu: error: {why}; {RESUME}\n".encode())
    else:
        time.sleep(1.0)  # the main thread's line is out by now
    os._exit(WorkerLost.exit_code)  # the main thread is stuck in TensorFlow


def _address(peer: str) -> tuple[str, int]:
    """``host:port`` -> (its IPv4 address, port): what datagrams from it carry as source."""
    host, port = peer.rsplit(":", 1)
    return _resolve(host) or host, int(port)


class Watch:
    """A run's heartbeats, from start-up to its end, for the loop: ``open`` before the workers
    agree (this worker's socket bound, the chief's key drawn), ``announced`` in every worker's
    fingerprint, ``start`` once the run is built, ``finish`` after its last collective. A run of
    one process has nothing to watch: then every call does nothing."""

    def __init__(self, sock=None, address: str = "", key: str = ""):
        self.sock, self.address, self.key = sock, address, key

    @classmethod
    def open(cls, backend) -> "Watch":
        """The watch of this worker of ``backend``'s run (nothing with one process)."""
        if backend.num_workers == 1:
            return cls()
        sock, address = open_socket(env.advertised_host())
        # The chief draws the heartbeats' key; it reaches the others with the fingerprints.
        return cls(sock, address, wire.new_key() if backend.is_chief else "")

    @property
    def announced(self) -> dict:
        """What this worker's fingerprint carries: where its heartbeats are heard, and (the
        chief's) the run's key."""
        return {"heartbeat": self.address, "heartbeat_key": self.key}

    def start(self, fingerprints: list, backend, global_step, timeout_s: float) -> str:
        """Starts the ``Board`` over every worker's ``fingerprints`` (as agreed), whose
        progress is ``backend``'s all-reduces and ``global_step`` (a variable), stopping the
        process after ``timeout_s`` without an update; returns the start-up line naming what
        the run listens on ("" with one process)."""
        if self.sock is None:
            return ""
        names = peer_names(fingerprints)
        counters = backend.all_reduce_calls, global_step
        (key,) = [f["heartbeat_key"] for f in fingerprints if f["heartbeat_key"]]
        peers = [f["heartbeat"] for f in fingerprints]

        def progress() -> dict:
            return {"reduced": int(counters[0].numpy()), "step": int(counters[1].numpy())}

        Board(
            self.sock, backend.worker_index, peers, names, progress, timeout_s, wire.parse_key(key)
        )
        return listeners_line(backend.name, peers)

    def finish(self) -> str:
        """Ends this process's watchdog (``finish``); returns what its board heard
        (``tally``: "" with one process)."""
        finish()
        return tally()


def peer_names(fingerprints: list) -> list[str]:
    """How the board's lines call each worker of ``fingerprints`` (in the collective's
    order): the launcher's word for it (``env.task_label``: ``chief 0``, ``worker 0``,
    ``rank 1``) and where it runs (``_where``)."""
    return [f"{env.task_label(i)} ({_where(f)})" for i, f in enumerate(fingerprints)]


def _where(fingerprint: dict) -> str:
    """Where a worker runs, as its fingerprint says: its cluster address ("host:port"), or
    (a Horovod rank's "host, pid N") that with the address its heartbeats come from."""
    where, ip = fingerprint["where"], fingerprint["heartbeat"].rsplit(":", 1)[0]
    return where if re.fullmatch(r"\S+:\d+", where) else f"{where}, {ip}"


def listeners_line(strategy: str, peers: list) -> str:
    """The start-up line naming what this run listens on: the heartbeats' ``peers``
    (``ip:port`` per worker) and, under multi_worker_mirrored, TensorFlow's gRPC servers,
    which listen on every interface (docs/security.md says what to isolate)."""
    line = f"listening: heartbeats on UDP {', '.join(peers)} (each on its worker's address only, "
    line += "signed with this run's key)"
    if strategy == "multi_worker_mirrored":
        cluster_spec = (env.cluster() or {}).get("cluster", {})
        tasks = env.TRAINING_TASKS
        ports = [a.rsplit(":", 1)[-1] for t in tasks for a in cluster_spec.get(t, [])]
        line += (
            f"; TensorFlow's gRPC servers on ports {', '.join(ports)} on EVERY interface, "
            "unauthenticated (they run any graph sent to them: keep this network isolated, "
            "docs/security.md)"
        )
    elif os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        line += "; horovodrun's rendezvous on EVERY interface, unauthenticated (docs/security.md)"
    return line
