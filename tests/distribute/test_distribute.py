"""Backends chosen from the environment, TF_CONFIG checks, the launcher, and a worker killed -9
mid-training: the survivor stops with one clear line in bounded time, and a rerun resumes."""

import json
import os
import re
import socket
import sys

import pytest
from conftest import cli_flags
from procs import LOST_LINE, Output, kill_tree, popen, rank_process
import tensorflow as tf

from tfgpu.cli import launch
from tfgpu.distribute import (
    DistributeError,
    backends,
    devices,
    env,
    failures,
    heartbeats,
    horovod_backend,
)

EXIT_WORKER_LOST = 5
STOP_BOUND_S = 90  # kill -> survivor gone; measured ~2 s (MWMS) and <1 s (Horovod)
# 16x16: the claim is the lost worker's, not the model's (a tiny_cnn update at 16 costs ~2.5x
# less CPU than at 32).
RUN = {
    "model": "tiny_cnn",
    "image_size": 16,
    "global_batch_size": 16,
    "train_steps": 60,  # the kill lands near step 6-10; the rerun trains the rest
    "optimizer": "sgd",
    "learning_rate": 0.01,
    "lr_schedule": "constant",
    "deterministic": True,
    "seed": 7,
    "steps_per_loop": 2,
    "log_every_steps": 2,
    "checkpoint_every_steps": 4,
    "collective_timeout_s": 15,
    "export": False,
}


def _tf_config(workers: int, index: int = 0, task_type: str = "worker") -> str:
    cluster = {"worker": [f"localhost:{2000 + i}" for i in range(workers)]}
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


# --- choosing a backend -----------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch):
    for key in ("TF_CONFIG", "HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


@pytest.mark.fast
def test_auto_is_default_on_one_cpu_process(clean_env):
    assert env.resolve_strategy("auto", num_gpus=0) == "default"
    clean_env.setenv("TF_CONFIG", _tf_config(1))
    assert env.resolve_strategy("auto", num_gpus=0) == "default"


@pytest.mark.fast
def test_auto_is_multi_worker_when_tf_config_names_several_workers(clean_env):
    clean_env.setenv("TF_CONFIG", _tf_config(2, index=1))
    assert env.resolve_strategy("auto", num_gpus=0) == "multi_worker_mirrored"


@pytest.mark.fast
def test_auto_is_horovod_under_horovodrun(clean_env):
    clean_env.setenv("TF_CONFIG", _tf_config(2))
    clean_env.setenv("HOROVOD_RANK", "0")
    assert env.resolve_strategy("auto", num_gpus=0) == "horovod"
    assert env.resolve_strategy("mirrored", num_gpus=0) == "mirrored"  # an explicit choice wins


@pytest.mark.parametrize(
    "raw, why",
    [
        ("{not json", "malformed"),
        ('{"task": {"type": "worker", "index": 0}}', "cluster"),
        ('{"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}', "non-empty"),
        (_tf_config(2, task_type="ps"), "not worker or chief"),
        (_tf_config(2, index=2), "out of range"),
    ],
)
@pytest.mark.fast
def test_read_tf_config_rejects_malformed(clean_env, raw, why):
    clean_env.setenv("TF_CONFIG", raw)
    with pytest.raises(DistributeError, match=why) as err:
        env.read_tf_config()
    assert "\n" not in str(err.value)


@pytest.mark.fast
def test_multi_worker_without_tf_config_is_a_clear_error(clean_env):
    with pytest.raises(DistributeError, match="tfgpu.launch"):
        backends.build_backend("multi_worker_mirrored")
    with pytest.raises(DistributeError, match="horovodrun"):
        backends.build_backend("horovod")


@pytest.mark.fast
def test_launch_tf_configs_one_cluster_distinct_ports():
    configs = [json.loads(c) for c in launch.tf_configs(3)]
    workers = configs[0]["cluster"]["worker"]
    assert len(set(workers)) == 3 and all(w.startswith("localhost:") for w in workers)
    assert all(c["cluster"]["worker"] == workers for c in configs)
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]
    assert launch.shell_code(-9) == 137 and launch.shell_code(5) == 5


@pytest.mark.fast
def test_free_ports_are_below_the_ephemeral_range_and_bindable(tmp_path, monkeypatch):
    """Below the range outgoing connections take their ports from (where a port picked free
    can be taken before its server binds it); the OS's picks when there is no room there."""
    ports = env.free_ports(4)
    low = int(open(env.EPHEMERAL_RANGE).read().split()[0])
    assert len(set(ports)) == 4 and all(env.PORTS_FROM <= p < low for p in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("", port))
    narrow = tmp_path / "range"
    narrow.write_text(f"{env.PORTS_FROM + 10}\t60999\n")
    monkeypatch.setattr(env, "EPHEMERAL_RANGE", str(narrow))
    assert all(p >= env.PORTS_FROM + 10 for p in env.free_ports(2))  # the OS's, in its range


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "so_reuseport"])
def test_a_worker_whose_port_is_taken_says_so_in_one_line(small_dataset, tmp_path, shared):
    """TF_CONFIG names a port another process listens on: one line naming the address, exit
    2 (a usage error), no traceback. Also when that process listens with SO_REUSEPORT (the
    data service's servers do): a worker's server that bound beside it would have the kernel
    split the connections between the two; TensorFlow's does not, and this keeps it so."""
    configs = launch.tf_configs(2)
    address = json.loads(configs[0])["cluster"]["worker"][0]
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, int(shared))
        taken.bind(("", int(address.rsplit(":", 1)[1])))
        taken.listen()
        flags = _flags(small_dataset, tmp_path, "multi_worker_mirrored")
        proc = popen(
            [sys.executable, "-m", "tfgpu.main", *flags], dict(os.environ, TF_CONFIG=configs[0])
        )
        try:
            text, _ = proc.communicate(timeout=120)
        finally:
            kill_tree(proc)
    lines = [line for line in text.splitlines() if line.startswith("tfgpu: error:")]
    assert proc.returncode == 2 and "Traceback" not in text, text[-3000:]
    assert lines == [
        f"tfgpu: error: could not start this worker's server at {address} (TF_CONFIG's worker "
        "0): the port is in use, or the host is not this machine's"
    ], text[-3000:]


class _FakeConfig:
    """Stands in for tf.config: no GPU exists where tfgpu is tested."""

    def __init__(self, gpus):
        self.gpus, self.visible = gpus, None

    def list_physical_devices(self, kind):
        return list(self.gpus) if kind == "GPU" else []

    def set_visible_devices(self, device, kind):
        self.visible = (device, kind)


@pytest.mark.fast
def test_horovod_rank_sees_only_its_local_gpu():
    fake = _FakeConfig(["gpu0", "gpu1", "gpu2"])
    devices.pin_to_local_gpu(1, fake)
    assert fake.visible == ("gpu1", "GPU")
    devices.pin_to_local_gpu(0, _FakeConfig([]))  # CPU only: nothing to pin
    with pytest.raises(DistributeError, match="one rank per GPU"):
        devices.pin_to_local_gpu(3, fake)


@pytest.mark.fast
def test_lost_worker_message_only_for_lost_peers(clean_env):
    heartbeat = tf.errors.UnavailableError(
        None,
        None,
        "Collective ops is aborted by: Error reported from /job:worker/task:1: "
        "The following tasks are unhealthy (stopped sending heartbeats):\n"
        "/job:worker/replica:0/task:1\nThe tasks have crashed.",
    )
    shutdown = tf.errors.UnknownError(None, None, "Horovod has been shut down. This was ...")
    assert failures.lost_worker_message(heartbeat) is None  # one process: something else
    clean_env.setenv("TF_CONFIG", _tf_config(2))
    message = failures.lost_worker_message(heartbeat)
    assert "worker 1 (localhost:2001) stopped sending heartbeats" in message
    assert message.endswith(heartbeats.RESUME) and "\n" not in message
    assert failures.lost_worker_message(tf.errors.DeadlineExceededError(None, None, "x"))
    # What a worker other than the leader raises when the network to the leader is cut.
    partitioned = tf.errors.DeadlineExceededError(
        None,
        None,
        "Collective ops is aborted by: Deadline Exceeded\n\nRPC: "
        "/tensorflow.CoordinationService/Heartbeat\nThe error could be from a previous ...",
    )
    message = failures.lost_worker_message(partitioned)
    assert "(worker 0 (localhost:2000), the coordination leader, stopped answering)" in message
    assert failures.lost_worker_message(tf.errors.InvalidArgumentError(None, None, "x")) is None
    clean_env.setenv("HOROVOD_RANK", "0")
    clean_env.setenv("HOROVOD_SIZE", "2")
    assert "Horovod shut down" in failures.lost_worker_message(shutdown)


# --- a worker killed -9 -----------------------------------------------------------------


def _flags(data_dir, model_dir, strategy):
    return cli_flags(RUN, data_dir=data_dir, model_dir=model_dir, strategy=strategy)


def _resumes_and_finishes(cmd, timeout: float = 240) -> str:
    """Runs ``cmd``, which resumes the run and finishes it; returns its output."""
    proc = popen(cmd)
    try:
        text, _ = proc.communicate(timeout=timeout)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, text[-3000:]
    assert re.search(r"resumed from \S+ckpt-\d+ at step [1-9]\d*", text), text[-3000:]
    assert re.search(rf"step\s+{RUN['train_steps']}/{RUN['train_steps']}\s", text), text[-3000:]
    return text


# Heavy: the default tier holds both halves elsewhere, on runs it makes anyway, both in
# tests/e2e/test_chaos.py's two-worker job under tfgpu.launch: the survivor's one lost-contact
# line, no traceback, before the launcher's grace (a worker killed -9 mid-update: its
# _check_launcher), and the resume to the uninterrupted run's weights and rows. No TensorFlow
# line from launched workers: tests/e2e/test_mlflow.py's two workers
# (procs.assert_each_worker_quiet).
@pytest.mark.heavy
def test_multi_worker_survivor_stops_with_clear_error_then_resumes(small_dataset, tmp_path):
    flags = _flags(small_dataset, tmp_path, "multi_worker_mirrored")
    cmd = [sys.executable, "-m", "tfgpu.main", *flags]
    procs = [popen(cmd, dict(os.environ, TF_CONFIG=c)) for c in launch.tf_configs(2)]
    chief, other = Output(procs[0]), Output(procs[1])
    try:
        chief.wait_for_step(6)
        procs[1].kill()
        procs[0].wait(timeout=STOP_BOUND_S)  # the survivor's end; past the bound it fails
    finally:
        for p in procs:
            kill_tree(p)
    chief.drained()
    other.drained()
    assert procs[0].returncode == EXIT_WORKER_LOST, chief.text[-3000:] + other.text[-500:]
    assert LOST_LINE in chief.text and "Traceback" not in chief.text, chief.text[-3000:]
    cmd = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--", *flags]
    text = _resumes_and_finishes(cmd)
    # No TensorFlow line from the running workers: neither its Python log's ("W1205 ...
    # mirrored_run.py:87] Using CollectiveAllReduceStrategy eagerly ...") nor tf.data's. (The
    # tests set TF_CPP_MIN_LOG_LEVEL, which the quiet start then leaves alone: TensorFlow's
    # import-time notices may show, as for a user who sets it.)
    logged = re.compile(r"^\[worker \d+\] [IWE]\d{4} .*(?:\.py:\d+\]|dataset\.cc)", re.M)
    assert not logged.search(text), text[-3000:]


@pytest.mark.heavy  # test_hangs: a killed MWMS worker's survivor, a frozen rank named
def test_horovod_survivor_stops_with_clear_error_then_resumes(
    small_dataset, tmp_path, horovodrun_tfgpu
):
    cmd = list(horovodrun_tfgpu)
    cmd += _flags(small_dataset, tmp_path, "horovod")
    proc = popen(cmd)
    output = Output(proc)
    try:
        output.wait_for_step(6)
        rank_process(proc, 1).kill()
        proc.wait(timeout=STOP_BOUND_S)  # the survivor's end; past the bound it fails
    finally:
        kill_tree(proc)
    output.drained()  # every rank's last words
    assert proc.returncode != 0
    # Which the survivor notices first is a race: Horovod's shutdown or gloo's broken socket.
    reasons = ("Horovod shut down", "connection reset by peer")
    assert any(LOST_LINE + r in output.text for r in reasons), output.text[-3000:]
    _resumes_and_finishes(cmd)


@pytest.mark.fast
def test_every_backend_offers_the_verbs_of_the_backend_protocol():
    """``distribute.Backend`` names what the step and the run may use; both backends have it
    all (attributes on a live default backend, methods on both classes)."""
    from tfgpu.distribute import Backend

    verbs = [n for n, v in vars(Backend).items() if callable(v) and not n.startswith("_")]
    verbs.append("num_replicas")
    assert {"each_replica", "all_reduce_sum", "sum_over_replicas"} <= set(verbs)
    for cls in (backends.StrategyBackend, horovod_backend.HorovodBackend):
        missing = [v for v in verbs if not hasattr(cls, v)]
        assert not missing, f"{cls.__name__} lacks {missing}"
    live = backends.build_backend("default")
    missing = [a for a in Backend.__annotations__ if not hasattr(live, a)]
    assert not missing, f"StrategyBackend instances lack {missing}"


@pytest.mark.fast
def test_gathering_bytes_traces_once_per_width_not_once_per_call(monkeypatch):
    """A run gathers bytes across workers at every log window; each call used to trace a new
    collective. Two replicas in this process stand for two workers (one replica each)."""
    backend = backends.build_backend("mirrored")
    monkeypatch.setattr(backend, "num_workers", 2)
    blobs = [b"x" * n for n in (1, 3, 5, 7, 8, 20, 30, 3, 5, 30)]
    for blob in blobs:
        assert backend.all_gather_bytes(blob) == [blob, blob]
    # Widths padded to a power of two: lengths (1) and rows of 1, 4, 8, 32.
    assert backend._gather_rows.experimental_get_tracing_count() == 4


def _no_eager_run(*args, **kwargs):
    raise AssertionError("strategy.run outside a tf.function (TensorFlow logs its overhead)")


@pytest.mark.fast
def test_agreeing_and_broadcasting_run_no_eager_strategy_run(monkeypatch):
    """any_worker (every log window) and broadcast_from_chief (each restore) under several
    workers: the chief's first replica's values everywhere, a flag raised anywhere seen
    everywhere, and no eager ``strategy.run``, which multi_worker_mirrored announced with
    "Using CollectiveAllReduceStrategy eagerly has significant overhead" each time. Two
    replicas in this process stand for two workers."""
    backend = backends.build_backend("mirrored")
    monkeypatch.setattr(backend, "num_workers", 2)
    with backend.scope():
        mirrored = tf.Variable([1.0, 2.0])
        on_read = tf.Variable(
            [[3.5, 4.25]],
            dtype=tf.float64,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.MEAN,  # as BatchNorm statistics
        )
    for var, other in ((mirrored, [7.0, 8.0]), (on_read, [[9.0, 10.0]])):
        backend.local_values(var)[1].assign(other)  # the second "worker" differs
    chief = [backend.local_values(v)[0].numpy().tolist() for v in (mirrored, on_read)]
    monkeypatch.setattr(backend.strategy, "run", _no_eager_run)
    backend.broadcast_from_chief([mirrored, on_read])
    for var, value in zip((mirrored, on_read), chief, strict=True):
        assert [v.numpy().tolist() for v in backend.local_values(var)] == [value, value]
    assert backend.any_worker(True) and not backend.any_worker(False)


@pytest.mark.fast
def test_a_cpu_replica_reads_its_dataset_as_it_is():
    """one_device on a CPU (as multi_worker_mirrored with one CPU replica a worker): the
    dataset itself, no tf.distribute fetching (its MultiDeviceIterator made tf.data log
    "GeneratorDatasetOp ... will not be optimized" for each iterator); two local replicas
    still get theirs through tf.distribute."""
    dataset = tf.data.Dataset.range(4).batch(2)
    one = backends.build_backend("one_device")
    assert one.distribute_dataset(lambda shard: dataset) is dataset
    two = backends.build_backend("mirrored")
    assert two.distribute_dataset(lambda shard: dataset) is not dataset
