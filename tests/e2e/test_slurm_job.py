"""Slurm without Slurm: srun's variables for 2 tasks on one node, faked in the environment,
make --strategy=auto a multi_worker_mirrored run that ends with a single process's weights.

Heavy: by default tests/e2e/test_heartbeat_flood.py's two workers are such a job (srun's
variables, --strategy=auto, no TF_CONFIG), and check its start line, one fingerprint from both
workers and the one-process weights within 1e-5."""

import os
import re
import subprocess
import sys

import pytest
from conftest import TINY_RUN, cli_flags
from slurm_env import srun_environ as _srun
from weights import assert_same_weights

STEPS = 6


@pytest.mark.heavy  # test_heartbeat_flood's run: module docstring
def test_srun_with_two_tasks_ends_with_the_weights_of_one_process(
    small_dataset, reference_run, tmp_path
):
    run = dict(TINY_RUN, train_steps=STEPS)
    reference = reference_run(**run)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TF_CONFIG"))}
    job = 10_000 + os.getpid() % 50_000  # ports of this "job" differ from other test runs
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tfgpu.main", "--strategy=auto"]
            + cli_flags(run, data_dir=small_dataset, model_dir=tmp_path / f"task{i}"),
            env=dict(base, TF_CPP_MIN_LOG_LEVEL="3", **_srun("2", "localhost", i, job=job)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert outs[0][0].startswith("multi_worker_mirrored: 2 replica(s)"), outs[0][0][:300]
    hashes = {h for out, _ in outs for h in re.findall(r"worker \d/2 weights_sha256 (\w+)", out)}
    assert len(hashes) == 1
    assert_same_weights(tmp_path / "task0", reference, atol=1e-5)
