"""A hostile process for the heartbeat tests: ``python tests/flood.py PORT PORT ...`` floods
the heartbeat sockets of a run on 127.0.0.1 with malformed, forged and replayed datagrams
until it is killed (or for --seconds).

From its own UDP socket it sends junk (what any stranger can do). As root it also sends every
kind of junk with a worker's own address as the source (raw sockets), and, once it has
captured the workers' genuine heartbeats on the loopback interface for --capture_s (beside
the flood, which starts at once: a short run may end before the capture does), replays them:
what an attacker on the cluster network can do. It prints ``flood: spoofing on|off`` when it
starts, ``flood: captured N genuine`` when the replays begin, and ``flood: under way`` once it
has sent UNDER_WAY datagrams (and, as root, replayed REPLAYED): a test waits for that line.
"""

import argparse
import hashlib
import hmac
import json
import os
import random
import socket
import struct
import threading
import time

HOST = "127.0.0.1"
UNDER_WAY, REPLAYED = 200, 30


def junk() -> list[bytes]:
    """Datagrams a heartbeat reader must survive (none carries the run's key)."""
    forged = {"worker": 1, "seq": 10**9, "phase": "train", "reduced": 10**6, "step": 10**6}
    body = json.dumps(forged).encode()
    return [
        b'{"worker": 1e400}',
        b"[" * 4000,
        b"",
        b"\xff\xfe\x00" * 20,
        os.urandom(60_000),
        json.dumps(dict(forged, worker=99)).encode(),
        os.urandom(32) + json.dumps(dict(forged, worker=99)).encode(),
        hmac.new(b"not the run's key", body, hashlib.sha256).digest() + body,
        os.urandom(32) + b"[" * 400,
        os.urandom(32) + b'{"worker": NaN}',
    ]


def capture(ports: set, seconds: float, ours: set) -> list[tuple[int, int, bytes]]:
    """(source port, destination port, payload) of the UDP datagrams between ``ports`` seen
    on the loopback interface for ``seconds``, but for the payloads in ``ours`` (needs
    root)."""
    sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0800))
    sniffer.bind(("lo", 0))
    sniffer.settimeout(0.2)
    seen, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            packet = sniffer.recv(70_000)
        except socket.timeout:
            continue
        header = (packet[0] & 0x0F) * 4
        if packet[9] != socket.IPPROTO_UDP:
            continue
        source, dest = struct.unpack("!HH", packet[header : header + 4])
        payload = packet[header + 8 :]
        if source in ports and dest in ports and payload not in ours:
            seen.append((source, dest, payload))
    sniffer.close()
    return seen


def spoofer():
    """A raw UDP socket: its datagrams carry whatever source port we write (root only)."""
    return socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)


def send_as(raw, source: int, dest: int, payload: bytes) -> None:
    """``payload`` to ``dest`` on 127.0.0.1, as if from ``source`` there (checksum 0: none)."""
    header = struct.pack("!HHHH", source, dest, 8 + len(payload), 0)
    try:
        raw.sendto(header + payload, (HOST, 0))
    except OSError:  # too large for one IP packet: the plain socket sends those
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ports", type=int, nargs="+")
    parser.add_argument("--capture_s", type=float, default=1.5)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument(
        "--rate", type=float, default=300, help="rounds per second (up to 5 datagrams each)"
    )
    args = parser.parse_args()
    ports, root = set(args.ports), os.geteuid() == 0
    kinds = junk()
    genuine: list = []  # filled once the capture is done: the replays start then
    if root:
        ours = {k[:1400] for k in kinds}  # spoofed junk is not a genuine heartbeat

        def captured():
            genuine.extend(capture(ports, args.capture_s, ours))
            print(f"flood: captured {len(genuine)} genuine", flush=True)

        threading.Thread(target=captured, daemon=True).start()
    raw = spoofer() if root else None
    plain = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    print(f"flood: spoofing {'on' if root else 'off'}", flush=True)
    deadline, sent, replayed, said = time.monotonic() + args.seconds, 0, 0, False
    while time.monotonic() < deadline:
        if not said and sent >= UNDER_WAY and (not root or replayed >= REPLAYED):
            print(f"flood: under way ({sent} sent, {replayed} replayed)", flush=True)
            said = True
        dest = random.choice(args.ports)
        payload = random.choice(kinds)
        try:
            plain.sendto(payload, (HOST, dest))
        except OSError:
            pass
        sent += 1
        if raw is not None:
            others = [p for p in args.ports if p != dest]
            send_as(raw, random.choice(others), dest, payload[:1400])
            for source, target, data in random.sample(genuine, min(3, len(genuine))):
                send_as(raw, source, target, data)  # a replay: a genuine, stale message
                replayed += 1
        time.sleep(1 / args.rate)


if __name__ == "__main__":
    main()
