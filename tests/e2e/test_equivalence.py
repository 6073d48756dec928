"""Same seed, same global batch, same updates, as two processes: 2 multi_worker_mirrored
workers (tfgpu.launch) and 2 Horovod ranks (horovodrun) end with the weights one process ends
with (within 1e-5) and one gradient all-reduce per update, with every per-example draw and
the step's options on (SPREAD_RUN) and the large-batch settings (LARS, BCE on MixUp/CutMix
targets, poly decay, a scaled rate, the EMA's warm-up: LARGE_BATCH_RUN). The default tier runs
the multi_worker_mirrored case in tests/e2e/test_heartbeat_flood.py (the same run, flooded
with forged heartbeats) and Horovod's in tests/e2e/test_launch_jobs.py (the same run under
mpirun, Horovod over MPI); both launches here are heavy. In one process, the same under 2
mirrored replicas: tests/distribute/test_mirrored_equals_default.py."""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import (
    LARGE_BATCH_RUN,
    SPREAD_RUN,
    assert_one_all_reduce_per_update,
    cli_flags,
    final_weights,
)
from weights import assert_same_weights

STEPS = SPREAD_RUN["train_steps"]
FLAGS = SPREAD_RUN


def _assert_same(a, b):
    assert_same_weights(a, b, atol=1e-5)


def _cli_flags(data_dir, model_dir, strategy):
    return cli_flags(FLAGS, data_dir=data_dir, model_dir=model_dir, strategy=strategy)


def _fingerprints(output: str, workers: int = 2) -> set:
    """The weights fingerprint every worker printed; fails unless all ``workers`` did."""
    found = dict(re.findall(r"worker (\d+)/\d+ weights_sha256 (\w+)", output))
    assert len(found) == workers, output[-3000:]
    return set(found.values())


@pytest.fixture(scope="module")
def reference(reference_run):
    """The final weights of one process with FLAGS (the session's run)."""
    return final_weights(reference_run(**FLAGS))


def _check_two_process_run(cmd, model_dir, reference):
    """Runs a 2-process training command; both processes must end identical, equal to the
    reference, with one gradient all-reduce per update."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert len(_fingerprints(out.stdout)) == 1, "the processes ended with different weights"
    _assert_same(final_weights(model_dir), reference)
    assert_one_all_reduce_per_update(model_dir, STEPS)  # across processes


# The large-batch run holds this contract, with more settings on it, under both backends in the
# default tier (in test_heartbeat_flood.py and test_launch_jobs.py: below; test_launch_jobs.py
# also runs TINY_RUN as a TFJob): these, the same two launches with the plain settings, are
# heavy.
@pytest.mark.heavy
def test_multi_worker_two_processes_equals_default(small_dataset, reference, tmp_path):
    cmd = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--"]
    cmd += _cli_flags(small_dataset, tmp_path, "multi_worker_mirrored")
    _check_two_process_run(cmd, tmp_path, reference)


@pytest.mark.heavy
def test_horovod_two_ranks_equals_default(small_dataset, reference, tmp_path, horovodrun_tfgpu):
    cmd = list(horovodrun_tfgpu)
    cmd += _cli_flags(small_dataset, tmp_path, "horovod")
    _check_two_process_run(cmd, tmp_path, reference)


@pytest.fixture(scope="module")
def large_batch_reference(reference_run):
    """The final weights of one process with LARGE_BATCH_RUN (the session's run, shared with
    tests/e2e/test_heartbeat_flood.py)."""
    model_dir = reference_run(**LARGE_BATCH_RUN)
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        assert json.load(f)["optimizer"] == "lars"
    return final_weights(model_dir)


# Both heavy, each run by default elsewhere with the same checks (one fingerprint, the
# one-process weights within 1e-5, one all-reduce per update): multi_worker_mirrored's in
# tests/e2e/test_heartbeat_flood.py (2 workers under a flood of forged heartbeats), Horovod's
# in tests/e2e/test_launch_jobs.py (2 ranks under mpirun).
@pytest.mark.heavy
@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "horovod"])
def test_large_batch_settings_on_two_processes_equal_default(
    small_dataset, large_batch_reference, tmp_path, strategy, request
):
    if strategy == "horovod":
        cmd = list(request.getfixturevalue("horovodrun_tfgpu"))  # requires('horovod')
    else:
        cmd = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--"]
    flags = cli_flags(LARGE_BATCH_RUN, data_dir=small_dataset, model_dir=tmp_path)
    _check_two_process_run(
        cmd + flags + [f"--strategy={strategy}"], tmp_path, large_batch_reference
    )
