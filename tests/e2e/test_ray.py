"""tfgpu-ray: tfgpu's own loop as a Ray Train job on a real local Ray cluster (CPU), with a
worker killed mid-run and restarted by Ray; and its arguments, checked without Ray starting.

The Ray tests skip when Ray Train is not installed (``pip install '.[ray]'``; `make test`
installs it). Each starts ``python -m tfgpu.ray`` (= ``tfgpu-ray``), which starts its own local
Ray cluster: the cluster's processes are that command's descendants, and only they are killed.
"""

import json
import os
import re
import signal
import sys
import time

import psutil
import pytest
from conftest import TINY_RUN, cli_flags, final_weights
from procs import Output, kill_tree, popen
from requires import requires
from weights import assert_same_weights, largest

from tfgpu.cli import ray as tfgpu_ray
from tfgpu import train
from tfgpu.config import config_from, validate
from tfgpu.distribute import ray_train

# Long enough that a worker killed at the first checkpoint (step 4) dies mid-run; no input
# probe (a second per attempt).
RUN = dict(
    TINY_RUN,
    train_steps=24,
    checkpoint_every_steps=4,
    steps_per_loop=2,
    log_every_steps=4,
    input_probe_s=0,
)
TIMEOUT = 420
FINGERPRINT = re.compile(r"worker (\d+)/2 weights_sha256 (\w+)")
WORKER_PID = re.compile(r"tfgpu-ray: worker (\d+) of 2: pid (\d+)")


def _need_ray():
    requires("ray")


def _assert_close(weights, reference, atol):
    assert_same_weights(weights, reference, atol=atol)


def _start(data_dir, model_dir, *ray_flags):
    cmd = [sys.executable, "-m", "tfgpu.ray", "--num_workers=2", *ray_flags, "--"]
    return popen(cmd + cli_flags(RUN, data_dir=data_dir, model_dir=model_dir))


def _finish(proc, out: Output) -> str:
    try:
        proc.wait(timeout=TIMEOUT)
    finally:
        kill_tree(proc)  # the local Ray cluster's processes, if any were left
    return out.drained()


def _fingerprints(text: str) -> dict:
    """worker -> the weights fingerprint it printed last (the last attempt's)."""
    return {int(w): h for w, h in FINGERPRINT.findall(text)}


# Ray Train's detached placement-group cleaner polls the state API from a thread; when its
# actor is told to exit mid-poll (the job's end, on a loaded machine), the thread dies with a
# traceback that Ray forwards to the driver: Ray's own, after tfgpu's job has ended.
RAYS_OWN = "Exception in thread PlacementGroupCleanerMonitor:\nTraceback"


def _tracebacks(text: str) -> list:
    """The tracebacks in ``text`` (a few lines of each), but for RAYS_OWN."""
    found = [m.start() for m in re.finditer("Traceback", text)]
    return [text[max(i - 200, 0) : i + 2000] for i in found if not text[: i + 9].endswith(RAYS_OWN)]


def _pids(text: str) -> dict:
    """worker -> its process id, as each worker of ``text``'s attempt(s) said last."""
    return {int(w): int(pid) for w, pid in WORKER_PID.findall(text)}


@pytest.fixture(scope="module")
def reference(small_dataset, tmp_path_factory):
    """The final weights of the same run in one process (strategy default)."""
    _need_ray()
    model_dir = tmp_path_factory.mktemp("one-process")
    config = config_from(data_dir=small_dataset, model_dir=str(model_dir), strategy="default")
    train.run(validate(config.with_settings(**RUN)))
    return final_weights(model_dir)


def _first_pids(out: Output, proc) -> dict:
    """worker -> pid of the first attempt's two workers, once both said."""
    deadline = time.time() + TIMEOUT
    while len(_pids(out.text)) < 2:
        assert proc.poll() is None and time.time() < deadline, out.text[-5000:]
        time.sleep(0.2)
    return _pids(out.text)


def _wait_for_checkpoint(model_dir, proc, out: Output) -> None:
    deadline = time.time() + TIMEOUT
    while not (model_dir / "checkpoints" / "checkpoint").exists():
        assert proc.poll() is None and time.time() < deadline, out.text[-5000:]
        time.sleep(0.05)


@pytest.fixture(scope="module")
def restarted(small_dataset, tmp_path_factory):
    """``tfgpu-ray --num_workers=2 --max_failures=1`` with worker 0 killed at the first
    checkpoint, run to its end: (output, model_dir, the first attempt's pids). One Ray job
    for the tests below (each Ray job costs ~50 s on 2 cores)."""
    _need_ray()
    model_dir = tmp_path_factory.mktemp("ray-restarted")
    started = time.time()
    proc = _start(small_dataset, model_dir, "--max_failures=1")
    out = Output(proc)
    try:
        first = _first_pids(out, proc)
        # Only a process of this command's own Ray cluster is killed.
        assert first[0] in {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        _wait_for_checkpoint(model_dir, proc, out)
        os.kill(first[0], signal.SIGKILL)
        killed_at = time.time() - started
    finally:
        text = _finish(proc, out)
    print(f"killed after {killed_at:.0f} s; the whole run took {time.time() - started:.0f} s")
    assert proc.returncode == 0, text[-5000:]
    return text, model_dir, first


def test_a_killed_worker_is_restarted_by_ray_and_the_run_resumes(restarted):
    text, _, first = restarted
    assert f"attempt 1 failed: worker 0 (pid {first[0]}): its process died" in text, text[-5000:]
    resumed = re.search(r"resumed from \S+ at step (\d+)", text)
    assert resumed and 0 < int(resumed.group(1)) < RUN["train_steps"], text[-5000:]
    # The restarted group ran in new processes (TensorFlow set up afresh in each).
    assert not set(_pids(text).values()) & set(first.values()), text[-5000:]


def test_ray_workers_log_no_tensorflow_python_line(restarted):
    """Neither attempt's workers print "Using CollectiveAllReduceStrategy eagerly has
    significant overhead" (TensorFlow's Python log, bare in a Ray worker: each window's
    agreement to go on printed it) nor tf.data's "dataset.cc" line."""
    text = restarted[0]
    logged = re.compile(r"eagerly has significant overhead|dataset\.cc|[A-Z]+:tensorflow:")
    assert not logged.search(text), text[-5000:]


def test_two_ray_workers_end_with_the_weights_of_one_process(restarted, reference):
    """The job, killed and restarted on the way, ends as one job: both workers with the same
    weights, those of one process, and the run's files written by the chief."""
    text, model_dir, _ = restarted
    _assert_close(final_weights(model_dir), reference, atol=1e-5)
    prints = _fingerprints(text)
    assert set(prints) == {0, 1}, text[-5000:]
    assert len(set(prints.values())) == 1, "the workers ended with different weights"
    with open(model_dir / "summary.json", encoding="utf-8") as f:
        summary = json.load(f)
    assert summary["strategy"] == "multi_worker_mirrored" and summary["num_replicas"] == 2
    assert summary["steps"] == RUN["train_steps"]
    for name in ("config.json", "metrics.jsonl", "final.weights.h5", "checkpoints"):
        assert (model_dir / name).exists(), name
    assert not _tracebacks(text) and "tfgpu-ray: done" in text, _tracebacks(text)


@pytest.mark.heavy  # one more Ray job (~50 s): the restarted run is within 1e-5 by default
def test_the_restarted_run_ends_bit_identical_to_an_uninterrupted_one(
    small_dataset, restarted, tmp_path
):
    proc = _start(small_dataset, tmp_path)
    text = _finish(proc, Output(proc))
    assert proc.returncode == 0, text[-5000:]
    assert not _tracebacks(text) and "tfgpu-ray: done" in text, _tracebacks(text)
    # Same strategy, same updates: the resumed run ends as the uninterrupted one, to the bit.
    _assert_close(final_weights(restarted[1]), final_weights(tmp_path), atol=1e-6)


# --- arguments, without Ray starting -----------------------------------------------------


def _error_line(capsys, argv) -> str:
    code = tfgpu_ray.main(["tfgpu-ray", *argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("tfgpu-ray: error: ")
    return lines[0]


@pytest.mark.fast
@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--num_workers=2", "--model=tiny_cnn"], "no `--` before the tfgpu flags"),
        (["--num_workers=0", "--"], "--num_workers=0 must be at least 1"),
        (["--num_workers=two", "--"], "num_workers"),
        (["--"], "--num_workers is required"),
        (["--num_workers=2", "--max_failures=-2", "--"], "--max_failures=-2 must be -1"),
        (["--num_workers=2", "--model_dir=x", "--"], "model_dir"),
    ],
)
def test_bad_arguments_are_one_line(capsys, argv, expected):
    assert expected in _error_line(capsys, argv)


@pytest.mark.fast
def test_bad_tfgpu_flags_are_one_line_before_ray_starts(capsys, tmp_path):
    _need_ray()
    line = _error_line(capsys, ["--num_workers=2", "--", "--model=resnet5"])
    assert "--model='resnet5' is unknown" in line
    line = _error_line(capsys, ["--num_workers=2", "--", "--strategy=mirrored"])
    assert "runs --strategy=multi_worker_mirrored, not --strategy=mirrored" in line


@pytest.mark.fast
def test_without_ray_installed_it_says_how_to_install_it(capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails
    line = _error_line(capsys, ["--num_workers=2", "--"])
    assert (
        line
        == "tfgpu-ray: error: tfgpu-ray needs Ray Train: pip install '.[ray]' in tfgpu's folder"
    )


@pytest.mark.fast
def test_the_job_ray_is_given(small_dataset, tmp_path):
    """What the TensorflowTrainer is built with: workers, one GPU each with --use_gpu, the
    failures it restarts after, Ray's storage under --model_dir, and the tfgpu Config."""
    _need_ray()
    job, tfgpu_argv = tfgpu_ray.parse(
        ["--num_workers=3", "--use_gpu", "--max_failures=2", "--", f"--model_dir={tmp_path}"]
    )
    assert job == ray_train.RayJob(num_workers=3, use_gpu=True, max_failures=2, address="")
    argv = [*tfgpu_argv, f"--data_dir={small_dataset}", "--model=tiny_cnn", "--image_size=32"]
    config = tfgpu_ray.make_config(argv, local=True)
    assert config.dist.strategy == "multi_worker_mirrored"
    trainer = ray_train.build_trainer(config, job, tfgpu_ray.train_worker)
    scaling, run = trainer.scaling_config, trainer.run_config
    assert scaling.num_workers == 3 and scaling.use_gpu and scaling.num_gpus_per_worker == 1
    assert run.failure_config.max_failures == 2
    assert run.storage_path == str(tmp_path / "ray")
    assert trainer.train_loop_config["config"] == config


class Raised(Exception):
    """How Ray hands over an exception a worker raised (its wrapper keeps it as _base_exc)."""

    def __init__(self, raised):
        super().__init__("Traceback (most recent call last): ...")
        self._base_exc = raised


class GaveUp(Exception):
    """Ray Train's error when its restarts ran out: rank -> each worker's failure."""

    def __init__(self, failures):
        super().__init__("Training failed due to worker errors")
        self.worker_failures = failures


DIED = Exception("A worker health check failed.\nWorker info: ... pid=4242,\n...")


@pytest.mark.fast
def test_a_worker_failure_is_named_in_one_line():
    from tfgpu.errors import DataError

    line, code, raised = ray_train.describe_failure(1, Raised(DataError("no shards in /d")))
    assert (line, code) == ("worker 1: no shards in /d", 2) and isinstance(raised, DataError)
    line, code, raised = ray_train.describe_failure(0, DIED)
    assert line == "worker 0 (pid 4242): its process died (killed, out of memory, or it exited)"
    assert code == 5 and raised is None


@pytest.mark.fast
def test_when_ray_gives_up_the_root_cause_is_the_error():
    from tfgpu.errors import DataError, WorkerLost

    job = ray_train.RayJob(num_workers=2, max_failures=1)
    lost = Raised(WorkerLost("lost contact with another worker"))
    # The dead worker, not the one that lost it, and the exit code of a lost worker (5).
    with pytest.raises(
        WorkerLost, match=r"^worker 0 \(pid 4242\): its process died .*; Ray gave up"
    ):
        tfgpu_ray.job_failed(GaveUp({0: DIED, 1: lost}), job)
    with pytest.raises(DataError, match=r"^worker 1: no shards; Ray gave up after 1 restart"):
        tfgpu_ray.job_failed(GaveUp({0: DIED, 1: Raised(DataError("no shards"))}), job)


@pytest.mark.fast
def test_tfgpu_ray_is_a_console_script_of_the_ray_extra():
    import configparser
    import pathlib

    setup = configparser.ConfigParser()
    setup.read(pathlib.Path(__file__).resolve().parents[2] / "setup.cfg")
    assert "tfgpu-ray = tfgpu.cli.ray:run" in setup["options.entry_points"]["console_scripts"]
    assert setup["options.extras_require"]["ray"].strip().startswith("ray[train]")
    assert callable(tfgpu_ray.run)


BN_RUN = dict(TINY_RUN, model="resnet18", small_input=True, train_steps=4, sync_batchnorm=True)
BN_RUN.update(steps_per_loop=2, log_every_steps=2, checkpoint_every_steps=4, drop_path_rate=0.0)


@pytest.mark.heavy  # the contract on a BatchNorm model; tiny_cnn's case runs in the default tier
def test_two_ray_workers_with_synchronized_batchnorm_equal_one_device(small_dataset, tmp_path):
    _need_ray()
    one = tmp_path / "one-device"
    config = config_from(data_dir=small_dataset, model_dir=str(one), strategy="default")
    train.run(validate(config.with_settings(**BN_RUN)))
    reference = final_weights(one)
    model_dir = tmp_path / "ray"
    cmd = [sys.executable, "-m", "tfgpu.ray", "--num_workers=2", "--"]
    proc = popen(cmd + cli_flags(BN_RUN, data_dir=small_dataset, model_dir=model_dir))
    text = _finish(proc, Output(proc))
    assert proc.returncode == 0, text[-5000:]
    assert len(set(_fingerprints(text).values())) == 1, text[-3000:]
    _assert_close(final_weights(model_dir), reference, atol=1e-5 * largest(reference))
