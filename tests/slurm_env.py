"""What srun puts in a task's environment, for the tests of tfgpu under Slurm without Slurm
(tests/distribute/test_slurm.py, tests/e2e/test_slurm_job.py)."""

from tfgpu.distribute import slurm


def srun_environ(tasks_per_node: str, nodes: str, procid: int, job: int = 4711, **more) -> dict:
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
