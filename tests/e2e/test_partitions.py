"""Network partitions between two hosts (network namespaces, tests/multihost.py), cut mid-run
the way a switch or a firewall cuts them: the packets vanish, no error reaches the sender.

- the link cut both ways, one way only, or only for the heartbeats' UDP ports (the
  collectives' TCP still flows): both workers stop within BOUND_S of the cut, each with one
  line naming the peer it lost as TF_CONFIG does (a chief and a worker, as Kubeflow's TFJob
  writes them, or two workers) with its address, the update it went silent at and how to
  resume;
- neither leaves a checkpoint the other lacks: the chief's node-local --model_dir holds
  complete checkpoints only, the other worker's nothing (its saves went to a scratch
  directory, removed as it stops);
- the link healed, the same command again resumes from the chief's last checkpoint and ends
  with exactly the weights of the run that was never cut (--deterministic; the same
  strategy and number of workers: bit-exact). With the heavy tests only: that run and the
  resume are four processes training 40 updates each, and the default tier holds the claim
  on the runs it makes anyway: a multi-worker job stopped abnormally resumes from the chief's
  complete checkpoints to the uninterrupted weights (tests/e2e/test_chaos.py's two-worker
  case: one killed mid-update, or all mid-checkpoint; test_cluster.py's node-local
  --model_dirs resumed from the chief), and what a cut leaves is checked here by default.

The scenarios mostly wait, so the module starts them all at once, each in its own pair of
hosts, and each test checks its own outcome.
"""

import concurrent.futures
import functools
import json
import os
import re
import shutil
import sys
import time

import pytest
from conftest import TINY_RUN, cli_flags, final_weights, heavy_enabled
from multihost import SSH_PORT, Sshd, TwoHosts
from requires import missing, requires
from weights import assert_same_weights

from tfgpu.distribute.heartbeats import RESUME

STEPS = 40
# A checkpoint every 4 updates; the cut comes once the chief has logged CUT_AT. 16x16: the cut
# and what the workers say and leave are the claim, not the model (a tiny_cnn update ~25 ms of
# CPU instead of ~65 at 32, bench/README.md).
FLAGS = dict(TINY_RUN, train_steps=STEPS, checkpoint_every_steps=4, steps_per_loop=2)
FLAGS.update(log_every_steps=2, image_size=16)
CUT_AT = 6
# Every worker gone within this of the cut, default flags (measured: 8-16 s; 31 s once with
# the cores shared, load average 20, before the board ended a slow shut-down).
BOUND_S = 60
START_S = 200  # a start or a restart ends within this, the cores shared by every scenario
TF_PORT = 23456
# The first test waits for every scenario, started at once, each bounded by START_S and
# BOUND_S: ~2 minutes on 2 quiet cores, 5 with the cores shared (load average ~15).
pytestmark = pytest.mark.timeout(900)


def _env(tmpdir: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.pop("TF_CONFIG", None)
    os.makedirs(tmpdir, exist_ok=True)
    # TMPDIR of its own: where a non-chief's scratch checkpoints go, for the test to look.
    return dict(env, TF_CPP_MIN_LOG_LEVEL="3", TMPDIR=tmpdir, **extra)


def _read(path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


# TF_CONFIG's tasks of hosts a and b: Kubeflow's TFJob (a chief and a worker, on ports of
# their own), or two workers.
TFJOB = (("chief", 0, TF_PORT), ("worker", 0, TF_PORT + 1))
WORKERS = (("worker", 0, TF_PORT), ("worker", 1, TF_PORT))


class Run:
    """A two-process multi_worker_mirrored run across ``hosts`` as ``tasks`` (``TFJOB`` or
    ``WORKERS``) say, each with its own node-local --model_dir (``dirs[i]``) and TMPDIR
    (``tmpdirs[i]``), and ``env`` added to their environment."""

    def __init__(self, hosts: TwoHosts, data: str, where, tasks=WORKERS, env=None):
        self.hosts, self.data, self.where, self.tasks = hosts, data, where, tasks
        self.env = env or {}
        self.dirs = [str(where / f"w{i}") for i in (0, 1)]
        self.tmpdirs = [str(where / f"tmp{i}") for i in (0, 1)]
        self.attempt = 0

    def names(self) -> list[str]:
        """How each process names its task and address: ``chief 0 (10.79.1.1:23456)``."""
        return [f"{k} {i} ({h.address}:{p})" for (k, i, p), h in zip(self.tasks, self.hosts.hosts)]

    def start(self, steps: int = STEPS) -> tuple[list, list]:
        """Starts both workers, to train ``steps`` updates; returns (processes, log paths)."""
        self.attempt += 1
        cluster = {}
        for (kind, _, port), host in zip(self.tasks, self.hosts.hosts):
            cluster.setdefault(kind, []).append(f"{host.address}:{port}")
        procs, logs = [], []
        for i, host in enumerate(self.hosts.hosts):
            task = {"type": self.tasks[i][0], "index": self.tasks[i][1]}
            tf_config = json.dumps({"cluster": cluster, "task": task})
            values = dict(FLAGS, train_steps=steps)
            flags = cli_flags(values, data_dir=self.data, model_dir=self.dirs[i])
            argv = [sys.executable, "-m", "tfgpu.main", "--strategy=multi_worker_mirrored"]
            logs.append(str(self.where / f"w{i}-{self.attempt}.log"))
            env = _env(self.tmpdirs[i], TF_CONFIG=tf_config, **self.env)
            procs.append(self.hosts.start(host, [*argv, *flags], logs[-1], env=env))
        return procs, logs


def _wait_for(log: str, pattern: str, procs, timeout: float) -> None:
    deadline = time.time() + timeout
    while not re.search(pattern, _read(log)):
        assert all(p.poll() is None for p in procs), _read(log)[-3000:]
        assert time.time() < deadline, f"no {pattern!r}: " + _read(log)[-3000:]
        time.sleep(0.05)


def _ended(procs, logs, started: float, timeout: float) -> list[dict]:
    """Waits (bounded) for every process; each one's exit code (None: still running, then
    killed), seconds from ``started`` to its end and output."""
    ends = [None] * len(procs)
    deadline = started + timeout
    while time.time() < deadline and None in ends:
        for i, p in enumerate(procs):
            if ends[i] is None and p.poll() is not None:
                ends[i] = time.time() - started
        time.sleep(0.1)
    codes = [p.poll() for p in procs]
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    return [{"code": c, "seconds": s, "text": _read(log)} for c, s, log in zip(codes, ends, logs)]


def _cut_and_resume(data, where, pair: int, cut, steps=STEPS, tasks=WORKERS, env=None) -> dict:
    """A run of ``steps`` updates (its processes as ``tasks`` say, ``env`` added to their
    environment) cut by ``cut(hosts, chief's log)`` once the chief logged CUT_AT; what each
    worker said and left, then (when ``steps`` is STEPS, with the heavy tests) the same
    command after ``heal``: its outputs and final weights."""
    where.mkdir()
    hosts = TwoHosts(pair)
    try:
        run = Run(hosts, data, where, tasks, env)
        procs, logs = run.start(steps)
        _wait_for(logs[0], rf"step\s+{CUT_AT}/", procs, START_S)
        cut(hosts, logs[0])
        stopped = _ended(procs, logs, time.time(), BOUND_S + 30)
        left = {
            "checkpoints": [_listing(d) for d in run.dirs],
            "scratch": [sorted(os.listdir(t)) for t in run.tmpdirs],
        }
        peers = [re.escape(name) for name in run.names()]
        outcome = {"hosts": hosts, "peers": peers, "stopped": stopped, "left": left}
        if steps != STEPS or not heavy_enabled():
            return outcome
        hosts.heal()
        procs, logs = run.start()
        resumed = _ended(procs, logs, time.time(), START_S)
        weights = final_weights(run.dirs[0]) if resumed[0]["code"] == 0 else None
        return dict(outcome, resumed=resumed, weights=weights)
    finally:
        hosts.close()


def _listing(model_dir: str) -> dict:
    """What a --model_dir holds: its files, and the checkpoints its index names, each with
    the files it has."""
    if not os.path.isdir(model_dir):
        return {"files": [], "indexed": {}}
    files = sorted(os.listdir(model_dir))
    directory = os.path.join(model_dir, "checkpoints")
    index = _read(os.path.join(directory, "checkpoint"))
    names = re.findall(r'all_model_checkpoint_paths: "(?:.*/)?([^"/]+)"', index)
    held = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    return {
        "files": files,
        "indexed": {n: sorted(f for f in held if f.startswith(n + ".")) for n in names},
    }


def _uninterrupted(data, where, pair: int) -> dict:
    where.mkdir()
    hosts = TwoHosts(pair)
    try:
        run = Run(hosts, data, where, TFJOB)
        procs, logs = run.start()
        ended = _ended(procs, logs, time.time(), START_S)
        assert [e["code"] for e in ended] == [0, 0], ended[0]["text"][-3000:]
        return {"weights": final_weights(run.dirs[0])}
    finally:
        hosts.close()


def _both_ways(hosts, log: str) -> None:
    for host in hosts.hosts:
        hosts.drop_incoming(host)


def _one_way(hosts, log: str) -> None:
    hosts.drop_incoming(hosts.b)  # what a sends b vanishes; b still reaches a


def _heartbeats_only(hosts, log: str) -> None:
    """Each host drops the datagrams to its worker's heartbeat port, and nothing else."""
    found = re.search(r"listening: heartbeats on UDP (\S+), (\S+) \(", _read(log))
    assert found, _read(log)[-3000:]
    for host, address in zip(hosts.hosts, found.groups()):
        assert address.startswith(host.address + ":"), found.group(0)
        hosts.drop_incoming(host, udp_port=int(address.rsplit(":", 1)[1]))


# Blocked heartbeats stop a run 3 x heartbeats.SILENT_S (15 s) after the last one heard, and
# only when updates went on completing SILENT_S after it (Record.blocked): one update then is
# enough. Trained flat out, the two workers spent ~13 CPU-s in those 15 s; instead each pauses
# HOLD_S in its third checkpoint write (update 12, after the cut at CUT_AT), where the
# watchdog's stall timeout does not count, and trains again from ~8 s after the cut.
HOLD_S = 8
HOLD = {"TFGPU_TEST_PAUSE": "checkpoint@3", "TFGPU_TEST_PAUSE_S": str(HOLD_S)}

# name -> (how the link is cut, updates, heavy: run only with the heavy tests, the tasks, the
# environment added). Blocked heartbeats stop a run only after 3 x heartbeats.SILENT_S, when
# STEPS may be done: that run is longer, and not resumed (the cut both ways shows the resume).
# The runs that resume are TFJob's chief and worker, as the uninterrupted one; blocked
# heartbeats stop two workers.
SCENARIOS = {
    "both_ways": (_both_ways, STEPS, False, TFJOB, None),
    "heartbeats_only": (_heartbeats_only, 10**5, False, WORKERS, HOLD),
    "one_way": (_one_way, STEPS, True, TFJOB, None),
}


@pytest.fixture(scope="module")
def outcomes(small_dataset, tmp_path_factory):
    """Every scenario's outcome, and the uninterrupted run's (``reference``), all started at
    once (they mostly wait), each in its own pair of hosts."""
    requires("netns")
    root = tmp_path_factory.mktemp("partitions")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(SCENARIOS) + 1)
    futures = {}
    if heavy_enabled():  # what the resumes end with (module docstring)
        futures["reference"] = pool.submit(_uninterrupted, small_dataset, root / "reference", 0)
    for pair, (name, (cut, steps, heavy, tasks, env)) in enumerate(SCENARIOS.items(), 1):
        if heavy_enabled() or not heavy:
            run = functools.partial(_cut_and_resume, cut=cut, steps=steps, tasks=tasks, env=env)
            futures[name] = pool.submit(run, small_dataset, root / name, pair)
    if heavy_enabled() and not (missing("horovod") or missing("sshd")):
        pair = len(SCENARIOS) + 1
        futures["horovod"] = pool.submit(_horovod_pair, small_dataset, root / "horovod", pair)
    yield futures
    pool.shutdown(wait=True)


# A Horovod rank trains with a node-local --model_dir and TMPDIR, its output kept in a file of
# its host's (rank 1's would otherwise travel back over the ssh link the cut breaks).
_RANK = (
    'd="$0/$(hostname)"; log="$d.rank$HOROVOD_RANK.log"; mkdir -p "$d.tmp"; '
    'TMPDIR="$d.tmp" "$@" --model_dir="$d" > "$log" 2>&1; code=$?; cat "$log"; exit $code'
)


def _horovodrun() -> str | None:
    return shutil.which("horovodrun", path=os.path.dirname(sys.executable))


def _horovod_pair(data, where, pair: int) -> dict:
    """horovodrun --gloo from host a, rank 1 on host b over ssh; the link cut both ways once
    rank 0 logged CUT_AT; then healed, and the same command again."""
    horovodrun = _horovodrun()
    where.mkdir()
    hosts = TwoHosts(pair)
    try:
        a, b = hosts.hosts
        (where / "ssh").mkdir()
        sshd = Sshd(hosts, b, str(where / "ssh"))
        cmd = [horovodrun, "--gloo", "-np", "2", "-H", f"{a.name}:1,{b.name}:1"]
        cmd += ["-p", str(SSH_PORT), "-i", sshd.key, "--disable-cache", "--start-timeout", "60"]
        cmd += ["sh", "-c", _RANK, str(where), sys.executable, "-m", "tfgpu.main"]
        cmd += cli_flags(FLAGS, data_dir=data, strategy="horovod")
        env = _env(str(where / "tmp"), PATH=f"{sshd.bin_dir}:{os.environ['PATH']}")
        logs = [str(where / f"{h.name}.rank{r}.log") for r, h in enumerate(hosts.hosts)]
        proc = hosts.start(a, cmd, str(where / "horovodrun-1.log"), env=env)
        _wait_for(logs[0], rf"step\s+{CUT_AT}/", [proc], START_S)
        _both_ways(hosts, logs[0])
        cut = time.time()
        stopped = [_error_line_within(log, cut, BOUND_S + 30) for log in logs]
        _ended([proc], [logs[0]], cut, 30)
        dirs = [str(where / h.name) for h in hosts.hosts]
        left = {
            "checkpoints": [_listing(d) for d in dirs],
            "scratch": [sorted(os.listdir(d + ".tmp")) for d in dirs],
        }
        hosts.heal()
        proc = hosts.start(a, cmd, str(where / "horovodrun-2.log"), env=env)
        (resumed,) = _ended([proc], [str(where / "horovodrun-2.log")], time.time(), START_S)
        resumed["text"] = _read(logs[0])  # rank 0's, of the second run
        weights = final_weights(dirs[0]) if resumed["code"] == 0 else None
        peers = [rf"rank {r} \([^)]*{re.escape(h.address)}\b" for r, h in enumerate(hosts.hosts)]
        outcome = {"peers": peers, "stopped": stopped, "left": left, "weights": weights}
        return dict(outcome, resumed=[resumed, resumed])  # one command: its exit, twice
    finally:
        hosts.close()


def _error_line_within(log: str, since: float, timeout: float) -> dict:
    """Waits for a process's last words (a ``tfgpu: error`` line) in ``log``; as ``_ended``
    says: exit code 5 when it came (the line is written right before the exit)."""
    while time.time() < since + timeout:
        if "tfgpu: error" in _read(log):
            return {"code": 5, "seconds": time.time() - since, "text": _read(log)}
        time.sleep(0.1)
    return {"code": None, "seconds": None, "text": _read(log)}


def _last_error(text: str) -> str:
    lines = [line for line in text.splitlines() if "tfgpu: " in line]
    assert lines, text[-3000:]
    return lines[-1]


def _check_stopped(outcome: dict, *expected: str, silent: bool = False) -> list[str]:
    """Both workers stopped within BOUND_S of the cut, exit 5, no traceback, with one line
    naming the other as its launcher does (``outcome["peers"][i]``: a pattern of process i's
    name and address), each ``expected`` pattern and how to resume. A peer said to have gone
    silent went silent at an update the run reached before the cut, or after it; with
    ``silent``, every line says so."""
    lines = []
    for i, ended in enumerate(outcome["stopped"]):
        text = ended["text"]
        assert ended["code"] == 5, (i, ended["code"], text[-3000:])
        assert ended["seconds"] < BOUND_S, (i, ended["seconds"], text[-3000:])
        assert "Traceback" not in text, text[-3000:]
        line = _last_error(text)
        assert re.search(outcome["peers"][1 - i], line), line
        assert line.endswith(f"; {RESUME}"), line
        for pattern in expected:
            assert re.search(pattern, line), line
        # The chief logged update CUT_AT before the cut; the other may be one behind it.
        went = [int(n) for n in re.findall(r"went silent at update (\d+) ", line)]
        assert all(CUT_AT - 1 <= n <= STEPS for n in went), line
        assert went or not silent, line
        print(f"process {i} stopped {ended['seconds']:.1f} s after the cut: {line}")  # pytest -s
        lines.append(line)
    return lines


def _check_left(outcome: dict) -> list[str]:
    """Only the chief holds checkpoints, each complete; the other worker left nothing (its
    scratch saves gone too). Returns the names of the chief's checkpoints."""
    chief, other = outcome["left"]["checkpoints"]
    assert chief["indexed"], chief
    for name, files in chief["indexed"].items():
        assert files == [f"{name}.data-00000-of-00001", f"{name}.index"], chief
    assert set(other["files"]) <= {"config.json"} and not other["indexed"], other
    scratch = [f for f in outcome["left"]["scratch"][1] if f.startswith("tfgpu-worker")]
    assert not scratch, outcome["left"]["scratch"]
    return list(chief["indexed"])


def _check_nothing_lost(outcome: dict, reference) -> None:
    """``_check_left``; then the same command, the link healed, resumed from the chief's
    newest checkpoint and ended with the uninterrupted run's weights, bit for bit."""
    names = _check_left(outcome)
    resumed = outcome["resumed"]
    assert [r["code"] for r in resumed] == [0, 0], resumed[0]["text"][-3000:]
    newest = max(int(name.split("-")[1]) for name in names)
    assert re.search(rf"resumed from \S+ckpt-{newest} at step {newest}\n", resumed[0]["text"])
    assert newest < STEPS
    assert_same_weights(outcome["weights"], reference.result()["weights"])


def test_a_link_cut_both_ways_stops_both_workers_and_leaves_whole_checkpoints(outcomes):
    """Kubeflow's TFJob: a chief and a worker. Each names the other by its task and address;
    the worker names the chief as the coordination leader. The chief's --model_dir holds
    complete checkpoints only, the worker's nothing."""
    outcome = outcomes["both_ways"].result()
    chief, worker = _check_stopped(outcome, silent=True)
    assert re.search(r"\(worker 0 \(\S+\) stopped sending heartbeats; ", chief), chief
    assert "chief 0 (" in worker and "), the coordination leader, stopped answering" in worker
    _check_left(outcome)


@pytest.mark.heavy  # the resume: module docstring (test_chaos, test_cluster hold it by default)
def test_a_link_cut_both_ways_then_healed_resumes_to_the_uncut_weights(outcomes):
    _check_nothing_lost(outcomes["both_ways"].result(), outcomes["reference"])


def test_blocked_heartbeats_stop_both_workers_naming_them(outcomes):
    """The collectives' TCP still flows, only the heartbeats' UDP is dropped: the run stops
    (without its side channel a later hang would go unnoticed), saying so."""
    outcome = outcomes["heartbeats_only"].result()
    lines = _check_stopped(outcome, r"no heartbeat from worker \d \(.* all-reduces with them still")
    assert all("firewall" in line for line in lines), lines
    _check_left(outcome)


@pytest.mark.heavy  # the both-ways cut shows the same bound and the same resume
def test_a_link_cut_one_way_stops_both_workers_and_loses_nothing(outcomes):
    outcome = outcomes["one_way"].result()
    _check_stopped(outcome)
    _check_nothing_lost(outcome, outcomes["reference"])


@pytest.mark.heavy  # the multi_worker_mirrored pair shows the same contract by default
def test_a_horovod_pair_cut_both_ways_stops_both_ranks_and_loses_nothing(outcomes):
    requires("horovod")
    requires("sshd")
    outcome = outcomes["horovod"].result()
    _check_stopped(outcome, silent=True)
    # Two ranks sum as two workers do: the multi_worker_mirrored run's weights, bit for bit.
    _check_nothing_lost(outcome, outcomes["reference"])
