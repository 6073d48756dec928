"""Slurm without Slurm: srun's variables, faked in the environment, read as srun means them:
host lists, each task's node and port, GPU shares, --strategy=auto (a real 2-task job:
tests/e2e/test_slurm_job.py)."""

import pytest
from slurm_env import srun_environ as _srun

from tfgpu.distribute import DistributeError, env, slurm


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
