"""Every message that names another training process names it as the user's launcher does:
TF_CONFIG's ``chief 0`` / ``worker 0`` with its address (Kubeflow's TFJob writes a chief),
``rank N`` under mpirun and horovodrun, ``task N`` under srun; the coordination leader is the
chief when there is one; a peer "went silent at" the last update it took part in.

Each message is built here from plain values (fingerprints, TensorFlow's error texts, a board
fed by a real socket) with a chief in the cluster; tests/e2e/test_partitions.py cuts a real
chief + worker job in two and reads the lines both processes print."""

import json
import re
import socket
import time

import pytest
import tensorflow as tf

from tfgpu.distribute import consensus, env, failures, heartbeats
from tfgpu.distribute import heartbeat_wire as wire
from tfgpu.results import writer as results
from tfgpu.train import micro_batch

pytestmark = pytest.mark.fast

CHIEF, WORKER = "10.93.173.1:23456", "10.93.173.2:23457"
TFJOB = {"chief": [CHIEF], "worker": [WORKER]}
LAUNCHER_VARIABLES = (
    "TF_CONFIG",
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "PMI_SIZE",
    "PMI_RANK",
    "MV2_COMM_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS",
)


def _tf_config(cluster: dict, kind: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


def _srun(procid: int) -> dict:
    return {
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "node[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
    }


@pytest.fixture
def on(monkeypatch):
    """``on(variables)``: this process as one that a launcher started with ``variables``."""

    def put(variables: dict) -> None:
        for key in LAUNCHER_VARIABLES:
            monkeypatch.delenv(key, raising=False)
        for key, value in variables.items():
            monkeypatch.setenv(key, value)

    return put


def test_the_launchers_own_words_name_every_process():
    """The collective's order (the chief first) mapped to what each launcher calls them."""
    tfjob = {"TF_CONFIG": _tf_config(TFJOB, "worker", 0)}
    assert [env.task_label(i, tfjob) for i in (0, 1)] == ["chief 0", "worker 0"]
    workers = {"TF_CONFIG": _tf_config({"worker": [CHIEF, WORKER]}, "worker", 1)}  # Ray, launch
    assert [env.task_label(i, workers) for i in (0, 1)] == ["worker 0", "worker 1"]
    # mpirun (rank 1, its cluster built from MPI), horovodrun, srun.
    mpirun = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", **workers}
    assert env.task_label(1, mpirun) == "rank 1"
    assert env.task_label(0, {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}) == "rank 0"
    assert env.task_label(1, _srun(0)) == "task 1"
    assert env.task_label(1, {}) == "worker 1"  # nothing says: the collective's word


def test_a_task_tensorflow_names_is_named_with_its_own_address():
    tfjob = {"TF_CONFIG": _tf_config(TFJOB, "chief", 0)}
    assert env.task_name("chief", 0, tfjob) == f"chief 0 ({CHIEF})"
    assert env.task_name("worker", 0, tfjob) == f"worker 0 ({WORKER})"
    assert env.leader_name(tfjob) == f"chief 0 ({CHIEF})"
    workers = {"TF_CONFIG": _tf_config({"worker": [CHIEF, WORKER]}, "worker", 1)}
    assert env.leader_name(workers) == f"worker 0 ({CHIEF})"
    assert env.task_name("worker", 1, workers) == f"worker 1 ({WORKER})"
    assert env.task_name("worker", 1, _srun(0)).startswith("task 1 (node2:")
    mpirun = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", **workers}
    assert env.task_name("worker", 1, mpirun) == f"rank 1 ({WORKER})"
    assert env.task_name("worker", 5, tfjob) == "worker 5"  # not in the cluster: no address


def _error(kind, text: str):
    return kind(None, None, text)


HEARTBEATS = "The following tasks are unhealthy (stopped sending heartbeats):\n{}\nThe tasks"


@pytest.mark.parametrize(
    "me, error, named",
    [
        # The chief (the leader) sees the worker stop sending heartbeats ...
        (
            ("chief", 0),
            _error(tf.errors.UnavailableError, HEARTBEATS.format("/job:worker/replica:0/task:0")),
            f"(worker 0 ({WORKER}) stopped sending heartbeats)",
        ),
        # ... the worker sees its heartbeats to the leader, the chief, go unanswered.
        (
            ("worker", 0),
            _error(
                tf.errors.DeadlineExceededError,
                "Collective ops is aborted by: Deadline Exceeded\n\nRPC: "
                "/tensorflow.CoordinationService/Heartbeat\nThe error could be from a previous",
            ),
            f"(chief 0 ({CHIEF}), the coordination leader, stopped answering)",
        ),
        (
            ("worker", 0),
            _error(tf.errors.UnavailableError, HEARTBEATS.format("/job:chief/replica:0/task:0")),
            f"(chief 0 ({CHIEF}) stopped sending heartbeats)",
        ),
        # Start-up timeouts: one that never registered, a leader that never answered.
        (
            ("chief", 0),
            _error(
                tf.errors.DeadlineExceededError,
                "Barrier timed out. Id: x. Some timed out task names:\n"
                "/job:worker/replica:0/task:0\n",
            ),
            f"(worker 0 ({WORKER}) never joined in time)",
        ),
        (
            ("worker", 0),
            _error(tf.errors.DeadlineExceededError, "RegisterTask timed out"),
            f"(chief 0 ({CHIEF}) (the coordination leader) never answered)",
        ),
        (
            ("chief", 0),
            _error(
                tf.errors.UnavailableError,
                "failed to connect to all addresses; remote target /job:worker/replica:0/task:0 "
                "while calling /tensorflow.WorkerService/RecvTensor",
            ),
            f"(worker 0 ({WORKER}) stopped answering)",
        ),
    ],
)
def test_lost_contact_names_the_peer_as_tf_config_does(on, me, error, named):
    on({"TF_CONFIG": _tf_config(TFJOB, *me)})
    message = failures._message(error, "")
    assert message.startswith(f"lost contact with another worker {named}; "), message
    assert message.endswith(heartbeats.RESUME) and "\n" not in message


def _fingerprints(*learning_rates) -> list:
    found = [consensus.fingerprint({"learning_rate": lr}, None) for lr in learning_rates]
    return [dict(f, where=w) for f, w in zip(found, (CHIEF, WORKER))]


def test_a_disagreement_names_the_chief_and_the_worker(on):
    on({"TF_CONFIG": _tf_config(TFJOB, "chief", 0)})
    message = consensus.disagreement(_fingerprints(0.1, 0.2))
    assert message == (
        f"the workers disagree on --learning_rate: 0.1 on chief 0 ({CHIEF}), "
        f"0.2 on worker 0 ({WORKER})"
    )
    failed = _fingerprints(0.1, 0.1)
    failed[1]["error"] = "--data_dir=/data/x holds no dataset_info.json"
    assert consensus.disagreement(failed).startswith(f"worker 0 ({WORKER}): --data_dir=")


class _Gather:
    """A backend's all_gather_bytes over what each worker sends (their ``this_worker``
    made up: the chief's, then the worker's)."""

    def __init__(self, compute: list):
        self.compute = compute

    def all_gather_bytes(self, mine: bytes) -> list:
        sent = json.loads(mine)
        return [
            json.dumps(dict(sent, compute_s=c, where=w)).encode()
            for c, w in zip(self.compute, (CHIEF, WORKER))
        ]


def test_the_slowest_worker_line_names_it(on):
    on({"TF_CONFIG": _tf_config(TFJOB, "chief", 0)})
    skew = consensus.step_time_skew(_Gather([0.10, 0.25]), 0.10)
    assert skew["slowest_worker"] == 1 and skew["slowest_worker_name"] == f"worker 0 ({WORKER})"
    record = dict(step=8, loss=1.0, accuracy=0.5, learning_rate=0.1, images_per_sec=100.0)
    line = results.format_progress(dict(record, **skew), 16, 32)
    assert f"slowest worker 0 ({WORKER}): 0.250 s/update (median 0.175)" in line
    skew = consensus.step_time_skew(_Gather([0.30, 0.25]), 0.30)
    line = results.format_progress(dict(record, **skew), 16, 32)
    assert f"slowest chief 0 ({CHIEF}): 0.300 s/update" in line


def test_micro_batch_lines_name_the_chief_and_the_worker(on):
    on({"TF_CONFIG": _tf_config(TFJOB, "chief", 0)})
    tried = [dict(size=8, fits=True, peak_bytes=10**9)]
    workers = [
        dict(where=CHIEF, device="CPU", size=8, tried=tried),
        dict(where=WORKER, device="CPU", size=0, tried=[]),
    ]
    assert f"chief 0 ({CHIEF}) on CPU" in micro_batch._line(8, 16, workers, "start")
    assert f"worker 0 ({WORKER}) on CPU" in micro_batch._line(8, 16, workers, "start")
    line = micro_batch._none_fits(workers, None)
    assert f"fits on worker 0 ({WORKER}, CPU; tried nothing): a larger" in line


@pytest.fixture
def chief_board(monkeypatch, on):
    """The chief's board of a TFJob of two (chief, worker), names as ``Watch.start`` makes
    them, its own update count in ``steps[0]``; ``say(seq, step)`` sends the worker's genuine
    heartbeat number ``seq`` at update ``step``."""
    on({"TF_CONFIG": _tf_config(TFJOB, "chief", 0)})
    monkeypatch.setattr(heartbeats, "INTERVAL_S", 0.2)
    monkeypatch.setattr(heartbeats, "SILENT_S", 0.5)
    sock, address = heartbeats.open_socket("localhost")
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peers = [address, f"127.0.0.1:{peer.getsockname()[1]}"]
    prints = [{"where": w, "heartbeat": p} for w, p in zip((CHIEF, WORKER), peers)]
    names = heartbeats.peer_names(prints)
    assert names == [f"chief 0 ({CHIEF})", f"worker 0 ({WORKER})"]
    steps, key = [0], b"k" * wire.KEY_BYTES

    def progress():
        return {"reduced": steps[0], "step": steps[0]}

    b = heartbeats.Board(sock, 0, peers, names, progress, 0, key)

    def say(seq: int, step: int):
        message = wire.encode(key, 1, seq, "train", step, step)
        peer.sendto(message, heartbeats._address(address))
        deadline = time.monotonic() + 10
        while b.heard.get(1, (0, {}))[1].get("seq") != seq:
            assert time.monotonic() < deadline, b.heard
            time.sleep(0.02)

    yield b, steps, say
    b.phase = heartbeats.DONE
    heartbeats._CURRENT.clear()
    sock.close()
    peer.close()


def _until(condition, timeout: float = 10.0):
    """Waits until ``condition()`` is true (the watchdog looks every 0.1 s); fails after
    ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not so after {timeout} s"
        time.sleep(0.05)


def test_a_silent_peer_is_named_at_the_last_update_it_took_part_in(chief_board):
    """Its last heartbeat said update 16; the updates that completed here since needed its
    all-reduce: it went silent at the last of them, not at the heartbeat's."""
    b, steps, say = chief_board
    steps[0] = 16
    say(1, 16)
    _until(lambda: "went silent" in b.silent())
    assert b.silent().startswith(f"worker 0 ({WORKER}) went silent at update 16 (nothing heard")
    say(2, 17)
    steps[0] = 19  # three more updates, its heartbeats late (they come once a second)
    _until(lambda: "went silent at update 19" in b.silent())
    assert b.silent().startswith(f"worker 0 ({WORKER}) went silent at update 19 (nothing heard")
    assert b.culprit() == b.silent()


def test_a_stall_names_the_worker_behind(chief_board):
    b, steps, say = chief_board
    b.phase = "train"
    steps[0] = 5
    say(1, 3)  # alive, two all-reduces behind
    assert b.culprit().startswith(f"worker 0 ({WORKER}) alive but not at the all-reduce of")


def test_blocked_heartbeats_name_the_peer(chief_board):
    b, steps, say = chief_board
    say(1, 1)
    deadline = time.monotonic() + 10
    while not b.blocked():  # updates go on, its heartbeats do not arrive
        assert time.monotonic() < deadline, "still not named blocked after 10 s of updates"
        steps[0] += 1
        time.sleep(0.05)
    assert re.match(rf"no heartbeat from worker 0 \({WORKER}\) for \d s while all-r", b.blocked())
