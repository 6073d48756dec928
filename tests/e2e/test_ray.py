"""tfgpu-ray: tfgpu's own loop as a Ray Train job on a real local Ray cluster (CPU), with a
worker killed mid-run and restarted by Ray (its arguments, checked without Ray starting:
tests/cli/test_ray_command.py).

The Ray tests skip when Ray Train is not installed (``pip install '.[ray]'``; `make test`
installs it). Each starts ``python -m tfgpu.ray`` (= ``tfgpu-ray``), which starts its own local
Ray cluster: the cluster's processes are that command's descendants, and only they are killed.
"""

import os
import re
import signal
import sys
import time

import psutil
import pytest
from conftest import TINY_RUN, cli_flags, final_weights, run_summary
from procs import Output, kill_tree, popen
from requires import requires
from weights import assert_same_weights, largest

from tfgpu import train
from tfgpu.config import config_from, validate

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
    summary = run_summary(model_dir)
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
