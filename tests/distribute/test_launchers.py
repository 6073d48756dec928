"""Every launcher makes one job: what each one puts in the environment (horovodrun, mpirun,
Kubeflow's TFJob and MPIJob, Ray Train, srun) is read as the world it started, ``auto``
joins it, and a strategy that cannot join it stops in one line instead of training N copies."""

import json

import pytest

from tfgpu.distribute import DistributeError, env, mpi

LAUNCHER_VARIABLES = (
    "TF_CONFIG",
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "PMI_SIZE",
    "PMI_RANK",
    "MV2_COMM_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS",
)

# What Kubeflow's TFJob writes for a chief, one worker and an evaluator (DNS names, cloud):
# the evaluator is left out of the cluster, since it is not part of training.
TFJOB = {
    "cluster": {
        "chief": ["job-chief-0.job.default.svc:2222"],
        "worker": ["job-worker-0.job.default.svc:2222"],
    },
    "environment": "cloud",
}
# Ray Train's TensorflowTrainer: workers only, ephemeral ports.
RAY = {"cluster": {"worker": ["10.0.0.5:41233", "10.0.0.6:38101"]}}


@pytest.fixture
def clean_env(monkeypatch):
    for key in LAUNCHER_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def _tf_config(base: dict, task_type: str, index: int) -> str:
    return json.dumps(dict(base, task={"type": task_type, "index": index}))


@pytest.mark.parametrize(
    "variables, launcher, size, rank",
    [
        ({}, "", 1, 0),
        ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4"}, "horovodrun", 4, 1),
        ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, "mpirun", 2, 1),
        ({"PMI_SIZE": "3", "PMI_RANK": "2"}, "mpirun", 3, 2),
        ({"TF_CONFIG": _tf_config(TFJOB, "chief", 0)}, "tf_config", 2, 0),
        ({"TF_CONFIG": _tf_config(TFJOB, "worker", 0)}, "tf_config", 2, 1),
        ({"TF_CONFIG": _tf_config(TFJOB, "evaluator", 0)}, "tf_config", 2, -1),
        ({"TF_CONFIG": _tf_config(RAY, "worker", 1)}, "tf_config", 2, 1),
        ({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2"}, "slurm", 2, 1),
        # mpirun inside a Slurm allocation starts its daemons with srun: MPI's word counts.
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "OMPI_COMM_WORLD_SIZE": "4"}, "mpirun", 4, 0),
    ],
)
@pytest.mark.fast
def test_each_launcher_is_read_as_the_world_it_started(clean_env, variables, launcher, size, rank):
    for key, value in variables.items():
        clean_env.setenv(key, value)
    found = env.world()
    assert (found.launcher, found.size, found.rank) == (launcher, size, rank)


@pytest.mark.parametrize(
    "variables, horovod_mpi, strategy",
    [
        ({"OMPI_COMM_WORLD_SIZE": "2"}, True, "horovod"),
        ({"OMPI_COMM_WORLD_SIZE": "2"}, False, "multi_worker_mirrored"),
        ({"OMPI_COMM_WORLD_SIZE": "1"}, False, "default"),
        ({"TF_CONFIG": _tf_config(TFJOB, "chief", 0)}, False, "multi_worker_mirrored"),
        ({"TF_CONFIG": _tf_config(TFJOB, "worker", 0)}, True, "multi_worker_mirrored"),
        ({"TF_CONFIG": _tf_config(RAY, "worker", 0)}, False, "multi_worker_mirrored"),
        ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, False, "horovod"),
    ],
)
@pytest.mark.fast
def test_auto_joins_the_world(clean_env, variables, horovod_mpi, strategy):
    for key, value in variables.items():
        clean_env.setenv(key, value)
    assert env.resolve_strategy("auto", num_gpus=0, horovod_mpi=horovod_mpi) == strategy
    env.check_world(strategy, env.world())  # and it is one job


@pytest.mark.parametrize(
    "variables, strategy, expected",
    [
        ({"OMPI_COMM_WORLD_SIZE": "2"}, "mirrored", "OMPI_COMM_WORLD_SIZE=2"),
        ({"OMPI_COMM_WORLD_SIZE": "2"}, "default", "2 separate copies"),
        ({"TF_CONFIG": _tf_config(TFJOB, "worker", 0)}, "one_device", "1 chief, 1 worker"),
        ({"TF_CONFIG": _tf_config(RAY, "worker", 0)}, "horovod", "needs horovodrun or mpirun"),
        ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, "multi_worker_mirrored", "horovodrun"),
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}, "mirrored", "srun step of 2"),
    ],
)
@pytest.mark.fast
def test_a_strategy_that_cannot_join_stops_in_one_line(clean_env, variables, strategy, expected):
    for key, value in variables.items():
        clean_env.setenv(key, value)
    with pytest.raises(DistributeError, match=expected) as err:
        env.check_world(strategy, env.world())
    assert "\n" not in str(err.value)


@pytest.mark.fast
def test_check_launch_says_what_the_environment_alone_decides(clean_env):
    """tfgpu.main's check before TensorFlow's import: horovod needs a launcher even for one
    process; variables that do not parse stop any strategy, ``auto`` too; ``auto`` itself
    waits for the GPU count (resolve_strategy), and a plain process passes."""
    env.check_launch("auto")
    env.check_launch("mirrored")
    with pytest.raises(DistributeError, match="must run under horovodrun or mpirun"):
        env.check_launch("horovod")
    clean_env.setenv("TF_CONFIG", "{not json")
    with pytest.raises(DistributeError, match="TF_CONFIG is malformed"):
        env.check_launch("auto")
    clean_env.delenv("TF_CONFIG")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "2")
    env.check_launch("auto")  # multi_worker_mirrored or horovod, once TensorFlow is up
    with pytest.raises(DistributeError, match="2 separate copies"):
        env.check_launch("default")


@pytest.mark.fast
def test_an_explicit_strategy_on_one_process_is_kept(clean_env):
    """mpirun -np 1: a world of one, where a one-machine strategy is what it says; the same
    strategy in a world of two is refused (the check is live)."""
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "1")
    found = env.world()
    assert (found.size, found.launcher) == (1, "mpirun")
    for strategy in ("default", "mirrored", "one_device"):
        assert env.check_world(strategy, found) is None  # no error
        assert env.resolve_strategy(strategy, num_gpus=0, found=found) == strategy
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(DistributeError, match="2 separate copies"):
        env.check_world("mirrored", env.world())


@pytest.mark.fast
def test_tfjob_roles_order_the_chief_first_and_leave_the_evaluator_out(clean_env):
    config = json.loads(_tf_config(TFJOB, "worker", 0))
    assert env.training_tasks(config) == [*TFJOB["cluster"]["chief"], *TFJOB["cluster"]["worker"]]
    assert env.task_index(config) == 1
    clean_env.setenv("TF_CONFIG", _tf_config(TFJOB, "evaluator", 0))
    assert env.is_evaluator() and len(env.training_tasks(env.cluster())) == 2
    clean_env.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["h:1"]}, "task": TASK0}))
    assert env.world().size == 1  # a TFJob of one chief alone is one process


TASK0 = {"type": "chief", "index": 0}


@pytest.mark.fast
def test_parameter_servers_are_named_as_unsupported(clean_env):
    cluster = {"worker": ["h:1"], "ps": ["h:2"]}
    clean_env.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}})
    )
    with pytest.raises(DistributeError, match="parameter servers"):
        env.world()


@pytest.mark.fast
def test_an_mpi_world_becomes_one_cluster_in_rank_order():
    entries = [
        {"host": "node-a", "address": "node-a.jobs.svc", "port": 40001},
        {"host": "node-b", "address": "10.1.2.3", "port": 40002},
    ]
    config = mpi.cluster_from(entries, rank=1)
    assert config == {
        "cluster": {"worker": ["node-a.jobs.svc:40001", "10.1.2.3:40002"]},
        "task": {"type": "worker", "index": 1},
    }
    same_host = [dict(e, host="node-a") for e in entries]
    assert mpi.cluster_from(same_host, 0)["cluster"]["worker"] == [
        "localhost:40001",
        "localhost:40002",
    ]


@pytest.mark.fast
def test_the_local_address_is_never_loopback_when_another_exists():
    address = env.local_address()
    assert address and (not address.startswith("127.") or address == "127.0.0.1")


@pytest.mark.fast
def test_each_local_mpi_rank_gets_its_share_of_the_machines_gpus():
    local = {"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert mpi.local_gpus(8, local) == [4, 5]
    assert mpi.local_gpus(1, local) == [0]  # the launcher already gave each rank its own
    hydra = {"MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert mpi.local_gpus(2, hydra) == [1]
    assert mpi.local_gpus(4, {}) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "variables, named",
    [
        ({"OMPI_COMM_WORLD_SIZE": "two"}, "OMPI_COMM_WORLD_SIZE='two'"),
        ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "-1"}, "OMPI_COMM_WORLD_RANK"),
        ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": ""}, "HOROVOD_SIZE=''"),
        ({"PMI_SIZE": "1e9"}, "PMI_SIZE='1e9'"),
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "lots"}, "'lots'"),
    ],
)
@pytest.mark.fast
def test_a_launchers_variable_that_is_not_a_number_is_one_line(clean_env, variables, named):
    for key, value in variables.items():
        clean_env.setenv(key, value)
    with pytest.raises(DistributeError, match=named) as err:
        env.world()
    assert "\n" not in str(err.value)
    assert not env.multi_process()  # the error paths that ask never raise
