"""--mlflow_tracking_uri against a real ``mlflow server`` (on 127.0.0.1, its own SQLite store
and artifacts in the test's folder; `make mlflow-server` installs it in .venv-mlflow): what a
run logs is read back through MLflow's client and compared with the run's own files; a resumed
run continues its MLflow run; of two workers only the chief logs; a server killed mid-run or
never there costs one warning, and training goes on.

One server for the module, started once; the test that kills it runs last."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import TINY_RUN, cli_flags, run_summary
from procs import Output, assert_each_worker_quiet, kill_tree, popen
from requires import requires

from tfgpu import train
from tfgpu.config import config_from, validate
from tfgpu.results import tracking
from tfgpu.train.actions import Action

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.path.join(ROOT, ".venv-mlflow", "bin", "mlflow")
# The first test's set-up starts the server and trains twice: on 2 shared cores, minutes.
pytestmark = pytest.mark.timeout(900)
# Rows at steps 3 and 6: train and validation. 16x16: what is logged is the claim, not the
# model (a tiny_cnn update ~25 ms of CPU instead of ~65 at 32, bench/README.md).
RUN = dict(TINY_RUN, eval_every_steps=3, image_size=16)
WARNING = "MLflow tracking at"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A real ``mlflow server`` with its store in ``folder``, started at once (``ready``
    waits for it)."""

    def __init__(self, folder):
        port = _free_port()
        self.uri = f"http://127.0.0.1:{port}"
        cmd = [SERVER, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
        cmd += ["--backend-store-uri", f"sqlite:///{folder}/mlflow.db"]
        cmd += ["--artifacts-destination", str(folder / "artifacts")]
        # Without its job runner (a dozen Huey processes this test has no use for).
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        self.proc = popen(cmd, env)
        self.output = Output(self.proc)

    def ready(self, timeout: float = 400) -> "Server":
        deadline = time.time() + timeout
        while True:
            assert self.proc.poll() is None, self.output.text[-3000:]
            assert time.time() < deadline, "mlflow server not up: " + self.output.text[-3000:]
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.25)

    def kill(self) -> None:
        kill_tree(self.proc)
        self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    requires("mlflow_server")
    requires("mlflow")
    started = Server(tmp_path_factory.mktemp("mlflow"))
    try:
        yield started.ready()
    finally:
        started.kill()


def _client(uri):
    from mlflow import MlflowClient  # noqa: PLC0415 (after requires)

    return MlflowClient(tracking_uri=uri)


def _rows(model_dir) -> list[dict]:
    with open(os.path.join(model_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _run(data_dir, model_dir, uri, actions=(), **settings):
    values = dict(RUN, mlflow_tracking_uri=uri, mlflow_experiment="runs", **settings)
    config = config_from(strategy="default", data_dir=data_dir, model_dir=str(model_dir), **values)
    return train.run(validate(config), actions=actions)


@pytest.fixture(scope="module")
def tracked(server, small_dataset, tmp_path_factory):
    """(model_dir, the MLflow run id after the first run) of a run of 6 updates, then resumed
    to 9 with its export (one export: the resumed run's is the MLflow run's artifact, and its
    changed --export a tag)."""
    model_dir = tmp_path_factory.mktemp("tracked")
    _run(small_dataset, model_dir, server.uri, export=False)
    with open(model_dir / tracking.RUN_FILE, encoding="utf-8") as f:
        first_id = json.load(f)["run_id"]
    _run(small_dataset, model_dir, server.uri, export=True, train_steps=9)
    return model_dir, first_id


def _assert_history_is_metrics_jsonl(client, run_id, model_dir) -> None:
    """Every number of every metrics.jsonl row is the MLflow metric ``<split>/<key>`` at the
    row's step, and nothing else under train/ or validation/ was logged."""
    expected: dict = {}
    for row in _rows(model_dir):
        for key, value in tracking.metrics_of(row, row["split"]).items():
            expected.setdefault(key, []).append((row["step"], value))
    logged = client.get_run(run_id).data.metrics
    assert {k for k in logged if k.split("/")[0] in ("train", "validation")} == set(expected)
    for key, points in expected.items():
        history = [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        assert sorted(history) == sorted(points), key


def test_params_metrics_and_artifacts_read_back(server, tracked, tmp_path):
    model_dir, run_id = tracked
    client = _client(server.uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    with open(model_dir / "config.json", encoding="utf-8") as f:
        params = tracking.params_of(json.load(f))
    # MLflow's params never change: the resumed run's new length and export are tags.
    assert run.data.params == dict(params, train_steps="6", export="False")
    assert run.data.tags["resumed/train_steps"] == "9"
    assert run.data.tags["resumed/export"] == "True"
    _assert_history_is_metrics_jsonl(client, run_id, model_dir)
    summary = run_summary(model_dir)
    assert run.data.metrics["final/top1"] == summary["final_eval"]["top1"]
    assert run.data.metrics["summary/wall_time_s"] == summary["wall_time_s"]
    root = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.json", "metrics.jsonl", "summary.csv", "summary.json", "export"} <= root
    exported = {a.path for a in client.list_artifacts(run_id, "export")}
    assert {"export/model.keras", "export/saved_model"} <= exported
    copy = client.download_artifacts(run_id, "metrics.jsonl", str(tmp_path))
    with open(copy, "rb") as a, open(model_dir / "metrics.jsonl", "rb") as b:
        assert a.read() == b.read()


def test_a_resumed_run_continues_its_mlflow_run(server, tracked):
    model_dir, first_id = tracked
    with open(model_dir / tracking.RUN_FILE, encoding="utf-8") as f:
        assert json.load(f)["run_id"] == first_id
    client = _client(server.uri)
    experiment = client.get_experiment_by_name("runs")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [first_id]
    steps = [m.step for m in client.get_metric_history(first_id, "train/loss")]
    assert sorted(steps) == [3, 6, 9]


def test_two_workers_log_once_to_the_environments_server(server, small_dataset, tmp_path):
    """Of two workers under tfgpu.launch only the chief logs. The same run holds
    tests/cli/test_quiet_start.py's multi-worker claim (a launch of its own there cost ~10
    CPU-s): with TF_CPP_MIN_LOG_LEVEL=3 neither worker prints one of TensorFlow's early
    lines."""
    # No flag: MLflow's own environment variables say where (the command reads them).
    env = dict(os.environ, MLFLOW_TRACKING_URI=server.uri, MLFLOW_EXPERIMENT_NAME="two")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    cmd = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--"]
    cmd += cli_flags(
        RUN, data_dir=small_dataset, model_dir=tmp_path, strategy="multi_worker_mirrored"
    )
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert WARNING not in out.stderr, out.stderr[-3000:]
    assert_each_worker_quiet(out.stdout + out.stderr)
    client = _client(server.uri)
    runs = client.search_runs([client.get_experiment_by_name("two").experiment_id])
    assert len(runs) == 1
    _assert_history_is_metrics_jsonl(client, runs[0].info.run_id, tmp_path)
    with open(tmp_path / "config.json", encoding="utf-8") as f:
        assert json.load(f)["mlflow_tracking_uri"] == server.uri


class _KillServer(Action):
    """Kills ``server`` at step 3, once the run's MLflow run is open there."""

    every = 3

    def __init__(self, server):
        self.server = server

    def __call__(self, state):
        if state.step == 3:
            deadline = time.time() + 120
            while state.writer.tracker.run_id is None and time.time() < deadline:
                time.sleep(0.1)
            self.server.kill()


# Kills the module's server: the last test that needs it.
def test_a_server_killed_mid_run_is_one_warning(server, small_dataset, tmp_path, capsys):
    killer = _KillServer(server)
    summary = _run(small_dataset, tmp_path, server.uri, actions=[killer], train_steps=9)
    said = capsys.readouterr().err
    assert summary["steps"] == 9
    assert said.count(WARNING) == 1, said
    assert os.path.exists(tmp_path / tracking.RUN_FILE)  # it was open before the kill
    steps = {
        split: [r["step"] for r in _rows(tmp_path) if r["split"] == split]
        for split in ("train", "validation")
    }
    assert steps == {"train": [3, 6, 9], "validation": [3, 6, 9]}


def test_a_refused_connection_costs_seconds(tmp_path, capsys):
    requires("mlflow")
    uri = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    tracker = tracking.Tracker(uri, "", str(tmp_path), {"model": "tiny_cnn"}, export=False)
    started = time.time()
    for step in (1, 2, 3):
        tracker.log_row({"step": step, "split": "train", "loss": 1.0})
    tracker.finish({"steps": 3, "final_eval": {"top1": 0.5}})
    assert time.time() - started < 30  # MLflow's defaults: ~4 minutes of retries
    assert capsys.readouterr().err.count(WARNING) == 1
    assert tracker.run_id is None and not os.listdir(tmp_path)
