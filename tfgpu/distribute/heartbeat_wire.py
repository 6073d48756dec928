"""The heartbeat board's messages on the wire, and the judge of every datagram that arrives.

A datagram is a 32-byte HMAC-SHA256 tag followed by a JSON object of exactly these fields:
``worker`` (the sender's index), ``seq`` (a counter that grows with every message it sends),
``phase`` (one of ``PHASES``), ``reduced`` and ``step`` (its all-reduce and update counters).
The key is drawn by the chief for each run (``new_key``) and reaches the other workers in the
start-up agreement (``consensus.agree``), so only the run's own processes can say anything:
a stranger's datagram, a forged one or one replayed from a capture is dropped, with a reason,
and counted. Nothing a datagram holds can end the thread that reads it (``Inbox.accept``).

No TensorFlow here: plain bytes in, a checked dict (or a reason) out.
"""

import collections
import hashlib
import hmac
import json
import secrets

TAG_BYTES = 32  # SHA-256
MAX_BYTES = 512  # a genuine message is ~110 bytes; anything longer is not one
KEY_BYTES = 32
PHASES = ("startup", "train", "busy", "done")  # what a receiver tells apart
FIELDS = frozenset({"worker", "seq", "phase", "reduced", "step"})
COUNTER_LIMIT = 2**62  # counters are non-negative integers below this


def new_key() -> str:
    """A fresh random key for one run, as hex (what travels in the start-up agreement)."""
    return secrets.token_hex(KEY_BYTES)


def parse_key(text) -> bytes:
    """The key ``new_key`` made, back as bytes; ValueError when ``text`` is not one."""
    if not isinstance(text, str) or len(text) != 2 * KEY_BYTES:
        raise ValueError("the heartbeat key is not 64 hex digits")
    return bytes.fromhex(text)


def wire_phase(phase: str) -> str:
    """The run's phase as sent: "startup", "train" and "done" as they are, anything else (an
    evaluation, a checkpoint save) "busy"."""
    return phase if phase in PHASES else "busy"


def encode(key: bytes, worker: int, seq: int, phase: str, reduced: int, step: int) -> bytes:
    """One signed datagram (the tag, then the JSON body)."""
    body = json.dumps(
        {
            "worker": worker,
            "seq": seq,
            "phase": wire_phase(phase),
            "reduced": reduced,
            "step": step,
        },
        separators=(",", ":"),
    ).encode()
    return hmac.new(key, body, hashlib.sha256).digest() + body


class Inbox:
    """What a receiver accepts: datagrams from its peers' addresses only, signed with the
    run's ``key``, well formed, each sender's ``seq`` larger than its last accepted one.

    ``senders``: {(ip, port): worker index} of the peers (this worker left out);
    ``num_workers``: the size of the run. ``dropped`` counts the datagrams refused, by reason.
    """

    def __init__(self, key: bytes, senders: dict, num_workers: int):
        self.key, self.senders, self.num_workers = key, dict(senders), num_workers
        self.last_seq: dict = {}
        self.accepted = 0
        self.dropped: collections.Counter = collections.Counter()

    def accept(self, data: bytes, source) -> tuple[dict | None, str]:
        """(the message, "") when ``data`` from ``source`` (ip, port) is genuine and new, else
        (None, why it was dropped). Never raises: whatever arrives is someone else's bytes."""
        try:
            message, reason = self._judge(data, source)
        except Exception as err:  # noqa: BLE001 - a defect here must not end the reader
            message, reason = None, f"unreadable ({type(err).__name__})"
        if message is None:
            self.dropped[reason] += 1
        else:
            self.accepted += 1
        return message, reason

    def _judge(self, data: bytes, source) -> tuple[dict | None, str]:
        sender = self.senders.get(tuple(source[:2]))
        if sender is None:
            return None, "not from a peer's address"
        if len(data) > MAX_BYTES:
            return None, "too large"
        tag, body = data[:TAG_BYTES], data[TAG_BYTES:]
        expected = hmac.new(self.key, body, hashlib.sha256).digest()
        if len(tag) != TAG_BYTES or not hmac.compare_digest(tag, expected):
            return None, "bad signature"
        # Signed by a process of this run, yet still checked: a bug there must not end this
        # one either. No NaN or Infinity, which JSON does not have.
        message = json.loads(body.decode("utf-8"), parse_constant=_refuse)
        why = self._malformed(message, sender)
        if why:
            return None, why
        if message["seq"] <= self.last_seq.get(sender, -1):
            return None, "replayed or out of order"
        self.last_seq[sender] = message["seq"]
        return message, ""

    def _malformed(self, message, sender: int) -> str:
        """What is wrong with a decoded message from worker ``sender``, or ""."""
        if not isinstance(message, dict) or set(message) != FIELDS:
            return "not a heartbeat's fields"
        worker = message["worker"]
        if not _counter(worker) or worker >= self.num_workers:
            return "worker index out of range"
        if worker != sender:
            return "worker index does not match its address"
        if not all(_counter(message[k]) for k in ("seq", "reduced", "step")):
            return "a counter is not a non-negative integer"
        if message["phase"] not in PHASES:
            return "unknown phase"
        return ""


def _counter(value) -> bool:
    """True for an int (not a bool) in [0, COUNTER_LIMIT)."""
    return type(value) is int and 0 <= value < COUNTER_LIMIT


def _refuse(name: str):
    raise ValueError(f"{name} is not a number a heartbeat holds")
