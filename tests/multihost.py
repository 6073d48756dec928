"""Two "hosts" on one machine, for tests/e2e/test_multihost.py.

Each host is a network namespace with its own address, hostname and /etc/hosts; the two are
joined by a veth pair named ``eth0`` at both ends (horovodrun picks the interfaces that all
hosts have, by name). ``Sshd`` runs an sshd on a host, with throwaway keys, and a client
set-up (an ``ssh`` on PATH) that reaches it without touching ~/.ssh.

``drop_incoming`` cuts a link the way a partition does (packets vanish, no error reaches the
sender), in one direction or for one UDP port only, and ``heal`` mends it.

Needs root (CAP_SYS_ADMIN), ``ip`` (iproute2) and ``unshare`` (util-linux), and ``Sshd`` an
sshd: ``requires("netns")`` and ``requires("sshd")`` (tests/requires.py) say what is missing.
Whatever is started is bounded by a timeout and killed with SIGKILL at tear-down (tfgpu
workers catch SIGTERM), with every process left in the namespaces; the namespaces and their
/etc/netns files are removed, after a failure too.
"""

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

SSH_PORT = 2222
# A host's command runs in its namespace (where `ip netns exec` mounts /etc/netns/<name>/hosts
# over /etc/hosts) under its own hostname, as on a machine of its own.
_ON_HOST = 'hostname "$0" && exec "$@"'


@dataclass(frozen=True)
class Host:
    name: str  # namespace name and hostname
    address: str  # eth0's address

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` as run on this host."""
        shell = ["unshare", "--uts", "sh", "-c", _ON_HOST, self.name]
        return ["ip", "netns", "exec", self.name, *shell, *argv]


class Unavailable(Exception):
    """This machine cannot create the hosts; the message says why."""


def _run(argv: list[str], timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


class TwoHosts:
    """Two hosts, ``a`` and ``b``, named and addressed uniquely for this process."""

    def __init__(self, pair: int = 0):
        """``pair``: several pairs made by one process each take another number."""
        pid = os.getpid()
        subnet = f"10.{78 + pair}.{pid % 250 + 1}"
        self.a = Host(f"tfgpu{pid}p{pair}a", f"{subnet}.1")
        self.b = Host(f"tfgpu{pid}p{pair}b", f"{subnet}.2")
        self._procs: list[subprocess.Popen] = []
        self._made: list[Host] = []
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    @property
    def hosts(self) -> tuple[Host, Host]:
        return self.a, self.b

    def _create(self) -> None:
        for host in self.hosts:
            out = _run(["ip", "netns", "add", host.name])
            if out.returncode != 0:
                raise Unavailable(f"`ip netns add` failed: {out.stderr.strip()}")
            self._made.append(host)
        a, b = self.hosts
        veth = ["link", "add", "eth0", "netns", a.name, "type", "veth", "peer", "eth0", "netns"]
        out = _run(["ip", *veth, b.name])
        if out.returncode != 0:
            raise Unavailable(f"cannot join them with a veth pair: {out.stderr.strip()}")
        # Each hostname resolves to its eth0 address, not 127.x: Horovod 0.28.1's process-set
        # Gloo context connects to gethostname()'s address whatever the interface flags say.
        hosts_file = f"127.0.0.1 localhost\n{a.address} {a.name}\n{b.address} {b.name}\n"
        for host in self.hosts:
            os.makedirs(f"/etc/netns/{host.name}", exist_ok=True)
            with open(f"/etc/netns/{host.name}/hosts", "w", encoding="utf-8") as f:
                f.write(hosts_file)
            _ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", "eth0")
            # lo stays up: MultiWorkerMirroredStrategy takes ~64 s to start without it.
            _ip("-n", host.name, "link", "set", "lo", "up")
            _ip("-n", host.name, "link", "set", "eth0", "up")
            # The local table (what is delivered here) moves behind drop_incoming's rules.
            _ip("-n", host.name, "rule", "add", "pref", "1000", "lookup", "local")
            _ip("-n", host.name, "rule", "del", "pref", "0")

    def drop_incoming(self, host: Host, udp_port: int | None = None) -> None:
        """From now on ``host`` silently drops what reaches it over eth0 (only the UDP
        datagrams to ``udp_port`` when given): a policy-routing rule sends it to a blackhole,
        ahead of the local table. No firewall needed (this machine's kernel has neither
        netfilter nor tc's drop action), and, unlike a link set down, the sender gets no
        error: the packets vanish, as in a partition."""
        match = ["ipproto", "udp", "dport", str(udp_port)] if udp_port else []
        _ip("-n", host.name, "rule", "add", "pref", "100", "iif", "eth0", *match, "blackhole")

    def heal(self) -> None:
        """Removes every ``drop_incoming`` rule: the link carries everything again."""
        for host in self.hosts:
            while _run(["ip", "-n", host.name, "rule", "del", "pref", "100"]).returncode == 0:
                pass

    def start(self, host: Host, argv: list[str], log_path: str, env=None) -> subprocess.Popen:
        """Starts ``argv`` on ``host`` in a process group of its own, output to ``log_path``."""
        with open(log_path, "w", encoding="utf-8") as log:
            proc = subprocess.Popen(
                host.command(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self._procs.append(proc)
        return proc

    def wait(self, procs: list[subprocess.Popen], logs: list[str], timeout: float) -> list[str]:
        """Waits for ``procs`` to exit 0 within ``timeout`` seconds; returns their outputs.
        Fails (after killing them) with the end of every output otherwise."""
        started = time.time()
        while any(p.poll() is None for p in procs) and time.time() < started + timeout:
            if any(p.poll() not in (None, 0) for p in procs):
                last = time.time() + 10  # the others' last words: they end once a peer failed
                while any(p.poll() is None for p in procs) and time.time() < last:
                    time.sleep(0.2)
                break
            time.sleep(0.2)
        codes = [p.poll() for p in procs]  # None: still running, killed now
        _kill(procs)
        outputs = [_read(path) for path in logs]
        if codes != [0] * len(procs):
            timed_out = time.time() >= started + timeout
            what = "timed out" if timed_out else f"exit codes {codes} (None: killed)"
            tails = "\n".join(f"--- {path}\n{text[-3000:]}" for path, text in zip(logs, outputs))
            raise AssertionError(f"{what} after {time.time() - started:.0f} s\n{tails}")
        return outputs

    def close(self) -> None:
        """Kills everything started here or still running in a namespace, then removes them."""
        _kill(self._procs)
        for host in self._made:
            pids = _run(["ip", "netns", "pids", host.name]).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for host in self._made:
            _run(["ip", "netns", "del", host.name])
            shutil.rmtree(f"/etc/netns/{host.name}", ignore_errors=True)
        self._made = []


class Sshd:
    """An sshd on ``host`` port SSH_PORT that lets in one throwaway key (root, no password),
    and the client side: ``key`` and ``bin_dir``, to put first on PATH, whose ``ssh`` uses
    its own config (no host key checks, no known_hosts, batch mode), never ~/.ssh."""

    def __init__(self, hosts: TwoHosts, host: Host, directory: str):
        self.log = os.path.join(directory, "sshd.log")
        self.key = os.path.join(directory, "id_ed25519")
        self.bin_dir = os.path.join(directory, "bin")
        host_key = os.path.join(directory, "host_ed25519")
        for path in (self.key, host_key):
            _check(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path])
        shutil.copy(self.key + ".pub", os.path.join(directory, "authorized_keys"))
        config = os.path.join(directory, "sshd_config")
        _write(
            config,
            f"Port {SSH_PORT}\nListenAddress {host.address}\nHostKey {host_key}\n"
            f"PidFile {directory}/sshd.pid\nAuthorizedKeysFile {directory}/authorized_keys\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PrintMotd no\nPrintLastLog no\nLogLevel INFO\n",
        )
        ssh_config = os.path.join(directory, "ssh_config")
        _write(
            ssh_config,
            "Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
            f"  IdentityFile {self.key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
            "  ConnectTimeout 10\n  LogLevel ERROR\n",
        )
        os.makedirs(self.bin_dir)
        ssh = shutil.which("ssh")
        _write(os.path.join(self.bin_dir, "ssh"), f'#!/bin/sh\nexec {ssh} -F {ssh_config} "$@"\n')
        os.chmod(os.path.join(self.bin_dir, "ssh"), 0o755)
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        sshd = shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:" + os.environ["PATH"])
        self.proc = hosts.start(
            host, [sshd, "-D", "-f", config, "-E", self.log], os.path.join(directory, "out")
        )
        deadline = time.time() + 15
        while "Server listening" not in _read(self.log):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"sshd did not start: {_read(self.log)[-2000:]}")
            time.sleep(0.1)

    def sessions_from(self, address: str) -> int:
        """Logins accepted from ``address`` so far."""
        return _read(self.log).count(f"Accepted publickey for root from {address} ")


def _ip(*args: str) -> None:
    _check(["ip", *args])


def _check(argv: list[str]) -> None:
    out = _run(argv)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {out.stderr.strip()}")


def _kill(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
