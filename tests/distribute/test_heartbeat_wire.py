"""The heartbeat board against hostile datagrams: every one is accepted or dropped with a
reason, never an exception (Hypothesis), the named attacks of issue #30 are each refused for
the right reason, and a real board's reader survives them while its watchdog still sees a
silent peer as silent, replays of its old messages notwithstanding."""

import hashlib
import hmac
import json
import re
import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from outcomes import expects, outcome

from tfgpu.distribute import heartbeat_wire as wire
from tfgpu.distribute import heartbeats

KEY = bytes(range(32))
PEER, STRANGER = ("10.0.0.2", 4000), ("10.0.0.9", 4000)


def inbox() -> wire.Inbox:
    """Worker 0's inbox in a run of 3: workers 1 and 2 at 10.0.0.2:4000 and :4001."""
    return wire.Inbox(KEY, {PEER: 1, ("10.0.0.2", 4001): 2}, num_workers=3)


def signed(body: bytes, key: bytes = KEY) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest() + body


def genuine(seq: int = 1, worker: int = 1, **fields) -> dict:
    return dict({"worker": worker, "seq": seq, "phase": "train", "reduced": 4, "step": 2}, **fields)


def test_a_genuine_message_round_trips_and_the_key_round_trips():
    box = inbox()
    message, why = box.accept(wire.encode(KEY, 1, 1, "evaluation", 4, 2), PEER)
    assert why == "" and message == genuine(phase="busy")
    assert wire.parse_key(wire.new_key()) != wire.parse_key(wire.new_key())
    with pytest.raises(ValueError):
        wire.parse_key("ab")


ATTACKS = [
    # (datagram, source, the reason it is dropped)
    (wire.encode(KEY, 1, 1, "train", 0, 0), STRANGER, "not from a peer's address"),
    (b'{"worker": 1e400}', PEER, "bad signature"),
    (b"[" * 4000, PEER, "too large"),
    (signed(json.dumps(genuine()).encode(), key=b"another run"), PEER, "bad signature"),
    (signed(b'{"worker": 1e400}'), PEER, "not a heartbeat's fields"),
    (signed(json.dumps(genuine(worker=99)).encode()), PEER, "worker index out of range"),
    (signed(json.dumps(genuine(worker=2)).encode()), PEER, "does not match its address"),
    (signed(json.dumps(genuine(step=0.5)).encode()), PEER, "not a non-negative integer"),
    (signed(json.dumps(genuine()).replace('"step": 2', '"step": 1e400').encode()), PEER, "integer"),
    (signed(json.dumps(genuine(reduced=True)).encode()), PEER, "not a non-negative integer"),
    (signed(json.dumps(genuine(seq=-1)).encode()), PEER, "not a non-negative integer"),
    (signed(json.dumps(genuine(step=2**70)).encode()), PEER, "not a non-negative integer"),
    (signed(json.dumps(genuine(phase="x" * 9)).encode()), PEER, "unknown phase"),
    (signed(b'{"worker": NaN}'), PEER, "unreadable (ValueError)"),
    (signed(b"[" * 400), PEER, "unreadable (JSONDecodeError)"),
    (signed(b"[" * 200 + b"]" * 200), PEER, "not a heartbeat's fields"),
    (signed(b"\xff\xfe"), PEER, "unreadable (UnicodeDecodeError)"),
    (b"", PEER, "bad signature"),
]


@pytest.mark.parametrize("datagram, source, reason", ATTACKS, ids=range(len(ATTACKS)))
def test_each_named_attack_is_dropped_for_its_reason(datagram, source, reason):
    box = inbox()
    message, why = box.accept(datagram, source)
    assert message is None and reason in why
    assert box.dropped[why] == 1 and box.accepted == 0


def test_a_replayed_or_older_message_is_dropped():
    box = inbox()
    first, second = wire.encode(KEY, 1, 5, "train", 0, 0), wire.encode(KEY, 1, 6, "train", 1, 1)
    assert box.accept(first, PEER)[0] and box.accept(second, PEER)[0]
    assert box.accept(second, PEER) == (None, "replayed or out of order")
    assert box.accept(first, PEER) == (None, "replayed or out of order")
    # Another sender's counter is its own.
    assert box.accept(wire.encode(KEY, 2, 1, "train", 0, 0), ("10.0.0.2", 4001))[0]


def _check_verdict(box: wire.Inbox, data: bytes, source) -> None:
    message, why = box.accept(data, source)
    if message is None:
        assert isinstance(why, str) and why
        outcome("dropped")
    else:
        assert why == "" and set(message) == wire.FIELDS
        assert message["worker"] == box.senders[source] and message["phase"] in wire.PHASES
        outcome("accepted")


COUNTS = st.integers(0, 2**62) | st.integers(-5, 5)
# Datagrams as a peer sends them (worker 1 or 2, any counts), whole or with bytes changed.
MESSAGES = st.builds(
    wire.encode, st.just(KEY), st.integers(0, 3), COUNTS, st.sampled_from(["train", "x"]),
    COUNTS, COUNTS,
)  # fmt: skip


def _changed(data: bytes, at: int, byte: int) -> bytes:
    at %= len(data)
    return data[:at] + bytes([byte]) + data[at + 1 :]


DATAGRAMS = (
    st.binary(max_size=1200)
    | MESSAGES
    | st.builds(_changed, MESSAGES, st.integers(0, 10**6), st.integers(0, 255))
)
# What worker 1 (at PEER) sends in a run: accepted, unless a byte was changed.
VALID = st.builds(
    wire.encode, st.just(KEY), st.just(1), st.integers(0, 2**62),
    st.sampled_from(["startup", "train", "evaluation", "done"]), st.integers(0, 2**62),
    st.integers(0, 2**62),
)  # fmt: skip
SOURCES = st.sampled_from([PEER, ("10.0.0.2", 4001), STRANGER])


@expects("accepted", "dropped")
@settings(max_examples=300, deadline=None)
@given(st.tuples(DATAGRAMS, SOURCES) | st.tuples(VALID, st.just(PEER)))
def test_any_bytes_are_accepted_or_dropped_with_a_reason(case):
    _check_verdict(inbox(), *case)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)
FIELD_VALUES = st.fixed_dictionaries({k: JSON for k in sorted(wire.FIELDS)})


@expects("accepted", "dropped")
@settings(max_examples=100, deadline=None)
@given(
    JSON
    | FIELD_VALUES
    | st.builds(genuine, st.integers(), st.integers(-1, 4))
    | st.builds(genuine, st.integers(0, 2**62), st.just(1))  # worker 1's own, as it sends them
)
def test_any_signed_json_is_accepted_or_dropped_with_a_reason(value):
    """Past the signature (a run's own process with a bug): still never an exception."""
    _check_verdict(inbox(), signed(json.dumps(value).encode()), PEER)


@pytest.fixture
def board(monkeypatch):
    """Worker 0 of 2 on 127.0.0.1, with a real socket and its three threads (no stall
    timeout: the watchdog never ends the test process); and worker 1's socket."""
    monkeypatch.setattr(heartbeats, "SILENT_S", 1.0)
    sock, address = heartbeats.open_socket("localhost")
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peers = [address, f"127.0.0.1:{peer.getsockname()[1]}"]
    progress = lambda: {"reduced": 0, "step": 0}  # noqa: E731
    b = heartbeats.Board(sock, 0, peers, ["worker 0", "worker 1"], progress, 0, KEY)
    yield b, peer, address
    b.phase = heartbeats.DONE
    heartbeats._CURRENT.clear()
    sock.close()
    peer.close()


def test_a_board_binds_its_address_only_and_survives_a_flood(board):
    b, peer, address = board
    assert address.startswith("127.0.0.1:")
    target = heartbeats._address(address)
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    captured = [wire.encode(KEY, 1, seq, "train", seq, seq) for seq in (1, 2)]
    for data in captured:
        peer.sendto(data, target)
    for _ in range(20):  # from a stranger, and from the peer's own address
        for sender in (stranger, peer):
            for data, _, _ in ATTACKS:
                sender.sendto(data[: wire.MAX_BYTES + 100], target)
        time.sleep(0.02)  # paced: the kernel drops what overflows a socket's buffer
    reasons = {why for _, _, why in ATTACKS if "match" not in why}  # (worker 2: out of range)
    _until(lambda: all(any(r in d for d in b.inbox.dropped) for r in reasons), b.inbox.dropped)
    assert b.heard[1][1]["step"] == 2 and b.inbox.accepted == 2
    assert [t for t in threading.enumerate() if t.name == "tfgpu-_receive" and t.is_alive()]
    # The peer is gone now; its captured messages, replayed, do not make it look alive: the
    # watchdog names it silent while the replays go on (each dropped, none accepted).
    before = b.inbox.dropped["replayed or out of order"]

    def replayed_and_silent():
        for data in captured:
            peer.sendto(data, target)
        time.sleep(0.02)
        replays = b.inbox.dropped["replayed or out of order"] - before
        return replays >= 50 and "worker 1 went silent" in b.silent()

    _until(replayed_and_silent, b.silent())
    # the last update it said it completed
    assert "worker 1 went silent at update 2" in b.silent() and b.inbox.accepted == 2
    assert re.fullmatch(r"2 heard from peers, \d+ dropped \(.*\)", heartbeats.tally())
    assert "not from a peer's address: " in heartbeats.tally()
    stranger.close()


def _until(condition, what, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.05)


def test_a_name_not_of_this_machine_binds_the_route_to_it_else_every_interface(capfd):
    """A TF_CONFIG host that is not this machine's (a service name, a NAT): the address on
    the route to it, never every interface while there is one."""
    sock, address = heartbeats.open_socket("203.0.113.7")  # TEST-NET-3: nobody's address
    try:
        bound, port = sock.getsockname()
        route = heartbeats._route_to("203.0.113.7")
        if route:
            assert bound == route and address == f"{route}:{port}"
        else:  # no route at all here: the one case that listens everywhere, and says so
            assert bound == "0.0.0.0" and "every interface" in capfd.readouterr().err
    finally:
        sock.close()


@pytest.fixture
def counting_board(monkeypatch):
    """Worker 0 of 2 as ``board``, whose updates the test counts (``steps[0]``), and a
    ``say(seq)`` that sends worker 1's genuine heartbeat number ``seq``."""
    monkeypatch.setattr(heartbeats, "INTERVAL_S", 0.2)  # the watchdog looks every 0.1 s
    monkeypatch.setattr(heartbeats, "SILENT_S", 0.5)
    sock, address = heartbeats.open_socket("localhost")
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peers = [address, f"127.0.0.1:{peer.getsockname()[1]}"]
    steps = [0]

    def progress():
        return {"reduced": steps[0], "step": steps[0]}

    b = heartbeats.Board(sock, 0, peers, ["worker 0", "worker 1"], progress, 0, KEY)

    def say(seq: int):
        peer.sendto(wire.encode(KEY, 1, seq, "train", seq, seq), heartbeats._address(address))
        _until(lambda: b.heard.get(1, (0, {}))[1].get("seq") == seq, b.heard)

    yield b, steps, say
    b.phase = heartbeats.DONE
    heartbeats._CURRENT.clear()
    sock.close()
    peer.close()


def _count_updates(steps: list, seconds: float, until=None) -> None:
    """Counts an update every 50 ms for ``seconds``, or, with ``until``, until it returns
    something true (``seconds`` is then the bound, which fails the test)."""
    deadline = time.monotonic() + seconds
    while not (until and until()):
        if time.monotonic() >= deadline:
            assert until is None, f"{seconds} s of updates and still not {until.__name__}"
            return
        steps[0] += 1
        time.sleep(0.05)


def test_a_peer_silent_while_updates_complete_is_named_as_blocked_heartbeats(counting_board):
    """Updates need every worker's all-reduce: a peer that goes on taking part in them
    while its heartbeats stop arriving is alive behind a blocked port (a firewall), not
    lost; a peer whose silence stops the updates too is lost (or the link to it)."""
    b, steps, say = counting_board
    say(1)
    _count_updates(steps, 0.3)  # the peer is lost: updates stop with its heartbeats
    _until(lambda: "went silent" in b.silent(), "the watchdog names the silent peer")
    # The updates that completed here after its last heartbeat needed it: it went silent after.
    assert b.blocked() == "" and f"worker 1 went silent at update {steps[0]} " in b.silent()
    assert heartbeats.silent_peers() == b.silent()
    say(2)
    _count_updates(steps, 0.3)
    _count_updates(steps, 10.0, until=b.blocked)  # silent again, while updates go on
    blocked = heartbeats.silent_peers()
    assert re.fullmatch(
        r"no heartbeat from worker 1 for \d s while all-reduces with them still complete "
        r"\(update \d+\): their heartbeats to this worker's UDP 127\.0\.0\.1:\d+ do not "
        r"arrive \(a firewall\?\), and without them a lost worker would go unnoticed; open "
        r"the heartbeat ports between the workers",
        blocked,
    ), blocked
    assert blocked == b.blocked() == b.gone_line()


def test_one_last_word_per_board(counting_board):
    """The watchdog and the main thread may both see a lost peer: the first to claim the
    last word says why the process ends, the other stays quiet."""
    b, _, _ = counting_board
    assert heartbeats.claim_last_word() and not heartbeats.claim_last_word()
    heartbeats._CURRENT.clear()  # no board (a run of one process): nothing to share
    assert heartbeats.claim_last_word() and heartbeats.claim_last_word()
