"""--data_service: the train pipeline on tf.data service workers, for real on localhost.

What each example becomes is checked in-process (``service.make_train_dataset`` alone, and
through an in-process dispatcher with two workers); the faults with real processes: a local
service, a worker killed with SIGKILL mid-run, a dispatcher killed and restarted on its work
dir, a dispatcher that is not there, and the server's own errors.
"""

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from conftest import as_train_command, cli_flags
from procs import Output

from tfgpu.config import ConfigError, config_from, validate
from tfgpu.convert import plan
from tfgpu.convert.manifest import items_from_arrays
from tfgpu.distribute import InputShard
from tfgpu.distribute.env import free_ports

NUM_TRAIN = 96

OUTAGE_S = 2  # how long a restarted dispatcher stays away (the heavy restart test)
# 16x16: the faults below are the service's, not the model's; a tiny_cnn update at 16 costs
# ~2.5x less CPU than at 32 (the killed-worker run's 200 updates were its trainer's 17 CPU-s).
RUN = dict(
    model="tiny_cnn",
    image_size=16,
    global_batch_size=16,
    optimizer="adam",
    learning_rate=0.003,
    weight_decay=0.0,
    crop_min_area=0.5,
    deterministic=True,
    seed=3,
    steps_per_loop=5,
    log_every_steps=10,
    checkpoint_every_steps=1000,
    export=False,
    strategy="default",
    in_memory="off",
)


# ---------------------------------------------------------------- helpers


class Proc:
    """A process in its own session (killed with its group however the test ends), its
    merged output read as it comes."""

    def __init__(self, args: list):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        self.proc = subprocess.Popen(
            args,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.out = Output(self.proc)

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while text not in self.out.text:
            assert self.proc.poll() is None, self.out.text[-3000:]
            assert time.time() < deadline, f"no {text!r} in {timeout} s: " + self.out.text[-3000:]
            time.sleep(0.1)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running after {timeout} s: " + self.out.text[-3000:])

    def signal(self, sig) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


@pytest.fixture
def procs():
    """``start(args) -> Proc``; every process started is killed at the end of the test."""
    started = []

    def start(args):
        p = Proc(args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


def service(start, *args: str) -> Proc:
    """``python -m tfgpu.data.service_server ARGS``, once it says it serves."""
    p = start([sys.executable, "-m", "tfgpu.data.service_server", *args])
    p.wait_for("serving")
    return p


def trainer(start, data_dir, model_dir, port, **overrides) -> Proc:
    values = dict(RUN, **overrides)
    flags = cli_flags(values, data_dir=data_dir, model_dir=model_dir)
    return start(
        [sys.executable, "-m", "tfgpu.main", *flags, f"--data_service=grpc://localhost:{port}"]
    )


def train_here(data_dir, model_dir, port, actions=(), **overrides) -> dict:
    """``trainer``'s run in this process (train.run, as the command runs it: the service's
    processes are the claim; a trainer of its own costs ~3.5 CPU-s of TensorFlow's start);
    its summary."""
    from tfgpu import train  # noqa: PLC0415 (TensorFlow's work: only the tests that train)

    values = dict(RUN, **overrides, data_service=f"grpc://localhost:{port}")
    values.update(data_dir=data_dir, model_dir=str(model_dir))
    return train.run(validate(config_from(**values)), actions=list(actions))


def logged_step(model_dir) -> int:
    path = os.path.join(model_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return 0
    lines = [json.loads(line) for line in open(path) if line.strip().endswith("}")]
    return max((r["step"] for r in lines if "loss" in r), default=0)


def wait_for_step(p: Proc, model_dir, step: int, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while logged_step(model_dir) < step:
        assert p.proc.poll() is None, p.out.text[-3000:]
        assert time.time() < deadline, "no progress: " + p.out.text[-3000:]
        time.sleep(0.1)


def cpu_seconds(p: Proc) -> float:
    times = psutil.Process(p.proc.pid).cpu_times()
    return times.user + times.system


def summary(model_dir) -> dict:
    with open(os.path.join(model_dir, "summary.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def id_dataset(tmp_path_factory) -> str:
    """96 train images in 4 shards whose label is their index (96 + 24 classes): a batch's
    labels say which examples it holds."""
    out = str(tmp_path_factory.mktemp("ids"))
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(120, 40, 40, 3), dtype=np.uint8)
    items = items_from_arrays(images, np.arange(120), prefix="ids")
    plan.write_dataset(
        {"train": items[:NUM_TRAIN], "validation": items[NUM_TRAIN:]},
        class_names=[str(i) for i in range(120)],
        output_dir=out,
        source="tests",
        num_shards={"train": 4, "validation": 1},
    )
    return out


def _spec_and_data(data_dir):
    from tfgpu.data.spec import load_spec

    config = config_from(data_dir=data_dir, image_size=32, shuffle_buffer=32, in_memory="off")
    return load_spec(config.data), config.data


def _labels(batches) -> collections.Counter:
    counts = collections.Counter()
    for batch in batches:
        counts.update(int(x) for x in batch["label"].numpy())
    return counts


# ---------------------------------------------------------------- in-process


@pytest.mark.parametrize(
    "count, index, deterministic, batch, global_batch, per_epoch",
    [
        (1, 0, False, 8, 8, 12),  # one pipeline
        (1, 0, True, 10, 10, 9),  # 96 = 9 x 10 + 6: the last 6 of each epoch are dropped
        (2, 1, False, 8, 16, 6),  # its own files: 2 of 4 shards, 48 records
        (2, 1, True, 8, 16, 6),  # its half of each global batch
        (2, 0, True, 10, 20, 5),  # 96 = 4 x 20 + 16: its 10 of the last global batch too
    ],
)
def test_the_service_stream_visits_each_example_at_most_once_per_epoch(
    id_dataset, count, index, deterministic, batch, global_batch, per_epoch
):
    from tfgpu.data import service_client as service
    from tfgpu.data.stream import Stream

    spec, data = _spec_and_data(id_dataset)
    shard = InputShard(count, index)
    assert service.epoch_batches(spec, shard, batch, global_batch, deterministic) == per_epoch
    ds = service.make_train_dataset(
        spec, data, shard, Stream(batch, global_batch, 1, deterministic)
    )
    epochs = 3
    batches = list(ds.take(epochs * per_epoch))
    for e in range(epochs):
        counts = _labels(batches[e * per_epoch : (e + 1) * per_epoch])
        assert max(counts.values()) == 1  # no example twice in an epoch


def _key(batch) -> tuple:
    return tuple(batch["label"].numpy()), batch["image"].numpy().tobytes()


def test_two_service_workers_share_the_epochs_and_never_repeat_one(id_dataset):
    """Through an in-process dispatcher and two workers: tfgpu's stream, by epochs, is split
    between the workers (no batch twice); the pipeline's own endless stream would be produced
    whole by each worker: every batch twice, identical (why ``service`` wraps it)."""
    import tensorflow as tf

    from tfgpu.data import pipeline
    from tfgpu.data import service_client as service
    from tfgpu.data.stream import Stream

    svc = tf.data.experimental.service
    dispatcher = svc.DispatchServer()
    target = dispatcher.target.split("://")[1]
    config = svc.WorkerConfig(dispatcher_address=target, heartbeat_interval_ms=100)
    workers = [svc.WorkerServer(config) for _ in range(2)]
    try:
        spec, data = _spec_and_data(id_dataset)
        stream = Stream(batch_size=8, global_batch_size=8, seed=1, deterministic=True)
        streams = {
            "service": service.make_train_dataset(spec, data, InputShard(1, 0), stream),
            "pipeline": pipeline.make_train_dataset(
                spec, data, InputShard(1, 0), stream, name_broken=False
            ),
        }
        seen = {}
        for name, ds in streams.items():
            # Both workers registered as they were made (WorkerServer's start registers):
            # the job, made as it is read, has both.
            ds = ds.apply(svc.distribute(service.PROCESSING_MODE, dispatcher.target, job_name=name))
            batches = list(ds.take(10 * NUM_TRAIN // 8))
            seen[name] = collections.Counter(_key(b) for b in batches)
            assert _labels(batches).total() == 10 * NUM_TRAIN
        assert max(seen["service"].values()) == 1
        # A worker that joined late (a loaded host) still repeats the other's stream from its
        # start: read on until it shows (once, under a full suite, not within 10 epochs).
        more = iter(ds)
        for _ in range(30 * NUM_TRAIN // 8):
            if max(seen["pipeline"].values()) > 1:
                break
            seen["pipeline"][_key(next(more))] += 1
        assert max(seen["pipeline"].values()) == 2
    finally:
        for server in [*workers, dispatcher]:
            server.stop()


@pytest.mark.fast
def test_job_names_follow_the_stream_not_the_run_length(id_dataset):
    from tfgpu.data import service_client as service
    from tfgpu.data.stream import Stream

    spec, _ = _spec_and_data(id_dataset)
    base = config_from(data_dir=id_dataset, model_dir="/tmp/run-a", seed=1, train_steps=10)

    def name(config, shard=None):
        stream = Stream(8, config.train.global_batch_size, config.seed, config.deterministic)
        return service.job_name(
            config.data, spec, shard or InputShard(1, 0), stream, config.model_dir
        )

    assert name(base) == name(base.with_settings(train_steps=20, learning_rate=0.5))
    assert name(base) == name(base.with_settings(data_service="grpc://elsewhere:1"))
    assert name(base) != name(base.with_settings(seed=2))
    assert name(base) != name(base.with_settings(model_dir="/tmp/run-b"))
    assert name(base) != name(base.with_settings(crop_min_area=0.5))
    assert name(base, InputShard(2, 1)).endswith("-shard1of2")


@pytest.mark.fast
def test_the_job_name_covers_every_data_flag_that_machines_share():
    """``DataConfig.shared`` (what the job's name hashes) is the data section's flags
    as the flag tables list them (``settings.collect``), less the per-node ones."""
    from tfgpu.data.config import DataConfig
    from tfgpu.settings import collect

    data = config_from(data_dir="/data", num_classes=3, crop_min_area=0.5).data
    table = collect(DataConfig, {})
    want = {flag: s.get(data) for flag, s in table.items() if not s.per_node}
    assert data.shared() == want
    assert "crop_min_area" in want and "data_service" not in want  # its address: per node


@pytest.mark.fast
def test_an_unreachable_dispatcher_is_a_data_error_within_the_timeout():
    from tfgpu.data import service_client as service
    from tfgpu.data.spec import DataError

    port = free_ports(1)[0]
    start = time.monotonic()
    with pytest.raises(DataError, match=f"localhost:{port}") as err:
        service.check_reachable(f"grpc://localhost:{port}", 1.0)
    # Without the timeout gRPC waits for ever: a bound ten times the timeout tells the two
    # apart on a loaded host too (3.5 s against a 2 s timeout failed once at load 8).
    assert 1.0 <= time.monotonic() - start < 10.0
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(data_service="localhost:5050"), "must be grpc://HOST:PORT"),
        (dict(data_service="grpc://localhost:99999"), "must be grpc://HOST:PORT"),
        (dict(data_service="grpc://h:1", synthetic_data=True), "--synthetic_data"),
        (dict(data_service="grpc://h:1", in_memory="on"), "--in_memory=on"),
        (dict(data_service="grpc://h:1", data_service_compression="zip"), "is unknown"),
    ],
)
@pytest.mark.fast
def test_data_service_flags_are_checked_before_tensorflow(values, message):
    with pytest.raises(ConfigError, match=message):
        validate(config_from(**values))
    validate(config_from(data_service="grpc://[::1]:5050"))


# ---------------------------------------------------------------- real processes


def _kill_worker_at_work(workers, idle):
    """An action of the run (train.run's ``actions``, a tfgpu ``Action``, imported here with
    TensorFlow): at the first loop boundary from step 40 on where both ``workers`` (the two
    workers' processes; the first may hold the dispatcher too, whose share is its heartbeats)
    have used 0.5 CPU-s since ``idle`` (a worker learns of a job by heartbeat; their share of
    the decoding is counted in updates more than in seconds: 0.5 CPU-s by update 70-90), kills
    the second with SIGKILL; its ``killed_at``: the step."""
    from tfgpu.train.actions import Action  # noqa: PLC0415 (TensorFlow: only when training)

    class KillWorkerAtWork(Action):
        every = 5  # RUN's steps_per_loop
        killed_at = None

        def due(self, state) -> bool:
            return self.killed_at is None and state.step >= 40 and not state.last

        def __call__(self, state) -> None:
            if min(cpu_seconds(w) - t for w, t in zip(workers, idle)) >= 0.5:
                workers[1].proc.send_signal(signal.SIGKILL)
                self.killed_at = state.step

    return KillWorkerAtWork()


def test_a_local_service_says_what_it_guarantees_and_a_worker_killed_mid_run_is_survived(
    procs, small_dataset, tmp_path, capsys
):
    """The local service (a dispatcher and a worker: one process) says where it listens; a
    second worker, a process of its own, joins it. A run through the two, in this process
    (``train_here``), says in one line what the service guarantees, learns, and goes on to its
    last update though the second worker is killed with SIGKILL mid-run; the local service
    then stops on SIGINT. (Two tests before, each with its own service processes and run.)"""
    port = free_ports(1)[0]
    local = service(procs, "--role=local", "--num_workers=1", f"--port={port}")
    assert f"grpc://localhost:{port} with 1 worker(s)" in local.out.text
    # What it says about where it listens is what the kernel says (docs/security.md).
    listening = {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process(local.proc.pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }
    assert len({p for _, p in listening}) == 2 and (port in {p for _, p in listening})
    assert {ip for ip, _ in listening} <= {"0.0.0.0", "::"}, listening
    assert "it listens on EVERY interface, unauthenticated" in local.out.text
    flags = ("--role=worker", f"--dispatcher=localhost:{port}", "--worker_host=localhost")
    workers = [local, service(procs, *flags)]
    killer = _kill_worker_at_work(workers, [cpu_seconds(w) for w in workers])
    capsys.readouterr()
    summary_ = train_here(small_dataset, tmp_path / "run", port, [killer], train_steps=160)
    _assert_said_and_learnt(capsys.readouterr().out, tmp_path / "run")
    assert killer.killed_at is not None and killer.killed_at < 160
    assert summary_["steps"] == 160 and summary(tmp_path / "run")["steps"] == 160
    assert workers[1].proc.wait(timeout=30) == -signal.SIGKILL
    assert local.proc.poll() is None
    local.signal(signal.SIGINT)
    assert local.wait(60) == 0 and "stopped by SIGINT" in local.out.text  # 60: a safety net


def _assert_said_and_learnt(said: str, model_dir) -> None:
    """The run's printed ``said`` holds one data service line (2 workers, its job, what the
    service guarantees); its metrics.jsonl's last loss is below its first."""
    lines = [line for line in said.splitlines() if line.startswith("data service ")]
    assert len(lines) == 1, said[-3000:]
    assert "2 worker(s)" in lines[0] and "job tfgpu-" in lines[0]
    assert "at most once per epoch" in lines[0] and "no exact resume" in lines[0]
    assert "--deterministic keeps" in lines[0]
    records = [json.loads(r) for r in open(model_dir / "metrics.jsonl")]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0], losses


@pytest.mark.heavy  # 80 s; the killed service worker above keeps the fault-tolerance claim
def test_a_restarted_trainer_rejoins_its_job(procs, small_dataset, tmp_path):
    """Killed with SIGKILL after a checkpoint, the same command on the same --model_dir names
    the same job, resumes from the checkpoint and finishes through the service."""
    port = free_ports(1)[0]
    service(procs, "--role=local", "--num_workers=1", f"--port={port}")
    run_dir = tmp_path / "run"
    length = dict(train_steps=200, checkpoint_every_steps=20)
    first = trainer(procs, small_dataset, run_dir, port, **length)
    wait_for_step(first, run_dir, 40)
    first.kill()
    second = trainer(procs, small_dataset, run_dir, port, **length)
    assert second.wait(120) == 0, second.out.text[-3000:]
    jobs = [re.search(r"job (tfgpu-\S+)\)", p.out.text).group(1) for p in (first, second)]
    assert jobs[0] == jobs[1]
    assert re.search(r"resumed from \S+ at step [1-9]", second.out.text), second.out.text[-3000:]
    assert summary(run_dir)["steps"] == 200


@pytest.mark.heavy  # 80-120 s; a killed worker (above) shows the service survives a loss
def test_a_dispatcher_restarted_on_its_work_dir_is_survived(procs, small_dataset, tmp_path):
    port, journal = free_ports(1)[0], f"--work_dir={tmp_path / 'journal'}"
    dispatcher = service(procs, "--role=dispatcher", f"--port={port}", journal)
    assert "fault-tolerant" in dispatcher.out.text
    flags = ("--role=worker", f"--dispatcher=localhost:{port}", "--worker_host=localhost")
    for _ in range(2):
        service(procs, *flags)
    run = trainer(procs, small_dataset, tmp_path / "run", port, train_steps=200)
    wait_for_step(run, tmp_path / "run", 40)
    dispatcher.proc.send_signal(signal.SIGKILL)
    dispatcher.proc.wait(timeout=10)
    killed_at = logged_step(tmp_path / "run")
    time.sleep(OUTAGE_S)  # the scenario: the run goes on without its dispatcher this long
    service(procs, "--role=dispatcher", f"--port={port}", journal)
    assert run.wait(150) == 0, run.out.text[-3000:]
    assert killed_at < 200 and summary(tmp_path / "run")["steps"] == 200


def test_an_unreachable_dispatcher_is_one_line_naming_it(small_dataset, tmp_path, capsys):
    """A run whose --data_service has no dispatcher, through the command's own ending
    (``run_command`` with tfgpu-train's translation, in this process: the claim is the line,
    not the process): exit 2, one line naming the address, within the timeout."""
    port = free_ports(1)[0]
    values = dict(RUN, train_steps=5, data_service=f"grpc://localhost:{port}")
    values.update(data_service_timeout_s=3, data_dir=small_dataset, model_dir=str(tmp_path / "r"))
    config = validate(config_from(**values))
    start = time.monotonic()
    code = as_train_command(config)
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("tfgpu: error:")]
    assert len(lines) == 1 and f"at localhost:{port} within" in lines[0], err[-3000:]
    assert "Traceback" not in err
    assert took < 3 + 40  # the model's build + the timeout


def test_the_servers_own_errors_are_one_line(tmp_path):
    busy = socket.socket()
    busy.bind(("", 0))
    busy.listen()
    port = busy.getsockname()[1]
    cases = [
        (["--role=dispatcher", f"--port={port}"], f"port {port} is already in use"),
        (["--role=local", f"--port={port}"], f"port {port} is already in use"),
        (["--role=worker"], "needs --dispatcher=HOST:PORT"),
        (["--role=chef"], "--role='chef': choose from dispatcher, worker, local"),
        (["--role=dispatcher", f"--port={free_ports(1)[0]}", "--work_dir=/proc/x"], "not writable"),
        (["--role=dispatcher", "--no_such_flag"], "no_such_flag"),
    ]
    try:
        for args, message in cases:
            proc = subprocess.run(
                [sys.executable, "-m", "tfgpu.data.service_server", *args],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode == 2, (args, proc.stderr)
            assert proc.stderr.count("\n") == 1 and message in proc.stderr, (args, proc.stderr)
            assert proc.stderr.startswith("tfgpu-data-service: error: ")
    finally:
        busy.close()


# A server whose stop() never returns (as a worker's may, waiting on a dead dispatcher). The
# process imports no TensorFlow (~3.5 CPU-s of a start): service_cluster's stop_all (which
# calls each server's stop(), workers first) is stood in for by a loop doing the same, as the
# servers are; the claim is _stop_all's own timer, its line and os._exit(0).
STUCK_STOP = """
import sys, threading, types
from tfgpu.cli import data_service as s
s.STOP_TIMEOUT_S = 0.5
class Stuck:
    def stop(self):
        threading.Event().wait()
class Stop:
    name = "SIGTERM"
cluster = types.SimpleNamespace(stop_all=lambda servers: [x.stop() for x in servers[::-1]])
assert "tensorflow" not in sys.modules
s._stop_all(cluster, [Stuck()], Stop())
"""


def test_a_stop_that_never_ends_still_says_so_and_exits_0():
    out = subprocess.run(
        [sys.executable, "-c", STUCK_STOP], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines() == [
        "tfgpu-data-service: stopped by SIGTERM (its servers had not stopped after 0.5 s)"
    ], out.stdout + out.stderr
