"""Slurm without Slurm: srun's variables for 2 tasks on one node, faked in the environment,
make --strategy=auto a multi_worker_mirrored run that ends with a single process's weights;
host lists, ports and GPU shares are read as srun means them."""

import os
import re
import subprocess
import sys

import pytest
from conftest import TINY_RUN, cli_flags
from weights import assert_same_weights

from tfgpu.distribute import DistributeError, env, slurm

STEPS = 6


def _srun(tasks_per_node: str, nodes: str, procid: int, job: int = 4711, **more) -> dict:
    """What srun sets in a task's environment (the variables tfgpu reads, and a few more)."""
    counts = slurm.expand_counts(tasks_per_node)
    nodeid, local = 0, procid
    while local >= counts[nodeid]:
        local, nodeid = local - counts[nodeid], nodeid + 1
    return {
        "SLURM_JOB_ID": str(job),
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(nodeid),
        "SLURM_NTASKS": str(sum(counts)),
        "SLURM_STEP_NUM_TASKS": str(sum(counts)),
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_JOB_NODELIST": nodes,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_TASKS_PER_NODE": tasks_per_node,
        "SLURM_DISTRIBUTION": "block",
        **more,
    }


@pytest.mark.fast
def test_host_lists_keep_slurms_order_and_widths():
    assert slurm.expand_hostlist("n[9-10]") == ["n9", "n10"]  # not sorted as strings
    assert slurm.expand_hostlist("node[01-03,7],gpu5") == [
        "node01",
        "node02",
        "node03",
        "node7",
        "gpu5",
    ]
    assert slurm.expand_hostlist("rack[0-1]_b[1-2]") == [
        "rack0_b1",
        "rack0_b2",
        "rack1_b1",
        "rack1_b2",
    ]
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(DistributeError, match="range"):
        slurm.expand_hostlist("n[a-b]")


@pytest.mark.fast
def test_tasks_map_to_their_own_node_in_block_order():
    for procid, host in enumerate(["n9", "n9", "n10", "n10"]):
        config = slurm.tf_config(_srun("2(x2)", "n[9-10]", procid))
        assert config["task"] == {"type": "worker", "index": procid}
        assert config["cluster"]["worker"][procid].split(":")[0] == host
    workers = slurm.tf_config(_srun("2(x2)", "n[9-10]", 0))["cluster"]["worker"]
    assert len({w.split(":")[1] for w in workers[:2]}) == 2  # two tasks on n9: two ports
    with pytest.raises(DistributeError, match="block"):
        slurm.tf_config(_srun("2", "n1", 0, SLURM_DISTRIBUTION="cyclic"))


@pytest.mark.fast
def test_two_jobs_on_one_node_get_different_ports():
    ports = {slurm.port_base(_srun("2", "n1", 0, job=job)) for job in (4711, 4712)}
    assert len(ports) == 2 and all(20000 <= p < 60000 for p in ports)


@pytest.mark.fast
def test_each_local_task_gets_its_share_of_the_visible_gpus():
    # Every task sees the node's 4 GPUs (no --gpus-per-task): each takes its own 2.
    assert slurm.local_gpus(4, _srun("2", "n1", 1)) == [2, 3]
    assert slurm.local_gpus(4, _srun("2", "n1", 0)) == [0, 1]
    # --gpus-per-task=1: Slurm already gave each task its own (CUDA_VISIBLE_DEVICES kept).
    assert slurm.local_gpus(1, _srun("2", "n1", 1)) == [0]
    assert slurm.local_gpus(0, _srun("2", "n1", 1)) == []


@pytest.mark.fast
def test_auto_is_multi_worker_under_srun(monkeypatch):
    for key in ("TF_CONFIG", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in _srun("2", "localhost", 1).items():
        monkeypatch.setenv(key, value)
    assert env.resolve_strategy("auto", num_gpus=0) == "multi_worker_mirrored"
    assert env.task_name("worker", 1).startswith("task 1 (localhost:")


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
