"""More than one host, for real: two network namespaces (tests/multihost.py), each with its own
address, hostname and node-local --model_dir. multi_worker_mirrored workers talk over the
addresses in TF_CONFIG; horovodrun starts rank 1 over ssh, with its environment forwarded and
the network interface picked from those both hosts share. Both end with the weights of a
single-process run (to 1e-5), as in tests/e2e/test_equivalence.py.

The TF_CONFIG case is heavy: by default multi_worker_mirrored crosses the hosts under mpirun
(its cluster built from the MPI world), with the same checks (weights, one all-reduce per
update, nothing in the non-chief's --model_dir) and the heartbeats' (each on its host's own
address, each worker heard the other, none dropped); TF_CONFIG naming the hosts' addresses is
what tests/e2e/test_partitions.py's default runs start with (heartbeats on each host's
address checked there too)."""

import json
import os
import re
import shutil
import sys

import pytest
from conftest import TINY_RUN, assert_one_all_reduce_per_update, cli_flags, final_weights
from multihost import SSH_PORT, Sshd, TwoHosts
from requires import requires
from test_launch_jobs import horovod_hidden
from weights import assert_same_weights


STEPS = 6
FLAGS = dict(TINY_RUN, train_steps=STEPS)
TIMEOUT_S = 150  # ~10-30 s when the machine is quiet
TF_PORT = 23456  # free: each host's namespace starts with no sockets


@pytest.fixture(scope="module")
def hosts():
    requires("netns")
    two = TwoHosts()
    try:
        yield two
    finally:
        two.close()


@pytest.fixture(scope="module")
def reference(reference_run):
    return final_weights(reference_run(**FLAGS))


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.pop("TF_CONFIG", None)
    return dict(env, TF_CPP_MIN_LOG_LEVEL="3", **extra)


def _fingerprints(outputs: str) -> dict:
    return dict(re.findall(r"worker (\d+)/2 weights_sha256 ([0-9a-f]{16})", outputs))


def _check_trained(chief_dir, other_dir, output: str, reference) -> None:
    """Both workers ended identical, equal to the reference; only the chief's node-local
    --model_dir holds results, with one gradient all-reduce per update across the hosts."""
    found = _fingerprints(output)
    assert sorted(found) == ["0", "1"], output[-3000:]
    assert len(set(found.values())) == 1, f"the hosts ended with different weights: {found}"
    assert_same_weights(chief_dir, reference, atol=1e-5)
    assert_one_all_reduce_per_update(chief_dir, STEPS)  # across hosts
    left = set(os.listdir(other_dir)) if os.path.isdir(other_dir) else set()
    assert left <= {"config.json"}, f"the non-chief wrote {sorted(left)} to its --model_dir"


@pytest.mark.heavy  # test_mpirun_across_two_hosts' default case: module docstring
def test_multi_worker_across_two_hosts(hosts, reference, small_dataset, tmp_path):
    cluster = {"worker": [f"{h.address}:{TF_PORT}" for h in hosts.hosts]}
    procs, logs = [], []
    for index, host in enumerate(hosts.hosts):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        model_dir = str(tmp_path / host.name)
        flags = cli_flags(
            FLAGS, data_dir=small_dataset, model_dir=model_dir, strategy="multi_worker_mirrored"
        )
        logs.append(str(tmp_path / f"{host.name}.log"))
        argv = [sys.executable, "-m", "tfgpu.main", *flags]
        procs.append(hosts.start(host, argv, logs[-1], env=_env(TF_CONFIG=tf_config)))
    outputs = hosts.wait(procs, logs, TIMEOUT_S)
    _check_trained(tmp_path / hosts.a.name, tmp_path / hosts.b.name, "\n".join(outputs), reference)
    _check_heartbeats(hosts, outputs[0], outputs)


def _check_heartbeats(hosts, chief: str, outputs: list[str]) -> None:
    """The heartbeats listen on each host's own address only (the chief's start-up line), and
    each worker heard the other and dropped nothing."""
    addresses = ", ".join(rf"{re.escape(h.address)}:\d+" for h in hosts.hosts)
    assert re.search(rf"heartbeats on UDP {addresses} \(", chief), chief[-3000:]
    for i, text in enumerate(outputs):
        found = rf"worker {i}: heartbeats: [1-9]\d* heard from peers, none dropped"
        assert re.search(found, text), text[-3000:]


@pytest.fixture(scope="module")
def sshd(hosts, tmp_path_factory):
    requires("sshd")
    return Sshd(hosts, hosts.b, str(tmp_path_factory.mktemp("ssh")))


# Each rank says where it runs, what horovodrun forwarded, then trains with a node-local
# --model_dir (<dir>/<hostname>).
_RANK = (
    'echo "rank $HOROVOD_RANK on $(hostname) via ${SSH_CONNECTION:-no ssh} iface '
    '$HOROVOD_GLOO_IFACE env $TFGPU_TEST_MARK"; exec "$@" --model_dir="$0/$(hostname)"'
)


def test_horovodrun_across_two_hosts_over_ssh(hosts, sshd, reference, small_dataset, tmp_path):
    a, b = hosts.hosts
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable))
    assert horovodrun, "horovodrun not found: run `make test` (it builds Horovod)"
    flags = cli_flags(FLAGS, data_dir=small_dataset, strategy="horovod")
    # Run from hostA: hostA's ranks start locally, hostB's over ssh. No --network-interface:
    # horovodrun finds the interfaces both hosts route (eth0 here) through its task services.
    cmd = [horovodrun, "--gloo", "-np", "2", "-H", f"{a.name}:1,{b.name}:1", "-p", str(SSH_PORT)]
    cmd += ["-i", sshd.key, "--disable-cache", "--start-timeout", "60"]
    cmd += ["sh", "-c", _RANK, str(tmp_path), sys.executable, "-m", "tfgpu.main", *flags]
    log = str(tmp_path / "horovodrun.log")
    mark = f"forwarded-{os.getpid()}"  # in the environment of horovodrun, not of sshd
    env = _env(PATH=f"{sshd.bin_dir}:{os.environ['PATH']}", TFGPU_TEST_MARK=mark)
    (output,) = hosts.wait([hosts.start(a, cmd, log, env=env)], [log], TIMEOUT_S)

    ranks = dict(re.findall(r"rank (\d) on (\S+ via .+)", output))
    assert ranks.get("0") == f"{a.name} via no ssh iface eth0 env {mark}", output[-3000:]
    ssh = rf"{a.address} \d+ {b.address} {SSH_PORT}"  # $SSH_CONNECTION: from a, to b's sshd
    assert re.fullmatch(rf"{b.name} via {ssh} iface eth0 env {mark}", ranks["1"]), ranks
    # horovodrun's ssh check, the task service that tested the interfaces, rank 1.
    assert sshd.sessions_from(a.address) == 3, open(sshd.log).read()
    _check_trained(tmp_path / a.name, tmp_path / b.name, output, reference)


# An MPI rank says where it runs, then trains with a node-local --model_dir.
_MPI_RANK = (
    'echo "mpi rank $OMPI_COMM_WORLD_RANK on $(hostname) via ${SSH_CONNECTION:-no ssh}"; '
    'exec "$@" --model_dir="$0/$(hostname)"'
)


def _mpirun_across(hosts, sshd, flags: list, tmp_path, path=()) -> str:
    """``mpirun -H a,b`` started on host a, as Kubeflow's MPIJob launcher does: Open MPI starts
    its daemon on b over ssh (port SSH_PORT), the ranks find each other over eth0. ``path``:
    folders put before the ranks' import path."""
    a, b = hosts.hosts
    cmd = ["mpirun", "-np", "2", "-H", f"{a.name}:1,{b.name}:1", "--bind-to", "none"]
    cmd += ["--mca", "plm_rsh_args", f"-p {SSH_PORT}"]
    cmd += ["--mca", "oob_tcp_if_include", "eth0", "--mca", "btl_tcp_if_include", "eth0"]
    cmd += ["-x", "PATH", "-x", "TF_CPP_MIN_LOG_LEVEL", "-x", "PYTHONPATH"]
    cmd += ["sh", "-c", _MPI_RANK, str(tmp_path), sys.executable, "-m", "tfgpu.main", *flags]
    log = str(tmp_path / "mpirun.log")
    pythonpath = os.pathsep.join([*path, *sys.path])
    env = _env(PATH=f"{sshd.bin_dir}:{os.environ['PATH']}", PYTHONPATH=pythonpath)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    (output,) = hosts.wait([hosts.start(a, cmd, log, env=env)], [log], TIMEOUT_S)
    ranks = dict(re.findall(r"mpi rank (\d) on (\S+) via", output))
    assert ranks == {"0": a.name, "1": b.name}, output[-3000:]
    assert re.search(rf"mpi rank 1 on {b.name} via {a.address} \d+ {b.address} {SSH_PORT}", output)
    return output


@pytest.mark.requires("mpirun")
@pytest.mark.parametrize(
    "strategy", ["multi_worker_mirrored", pytest.param("auto", marks=pytest.mark.heavy)]
)
def test_mpirun_across_two_hosts(strategy, hosts, sshd, reference, small_dataset, tmp_path):
    """Without Horovod (hidden from the ranks: an import of it fails), multi_worker_mirrored
    builds its cluster from the MPI world alone: each rank's address (its host name, which
    resolves to eth0 there) travels through mpi4py (test_launch_jobs' one-host case is heavy:
    this one holds its claim). With Horovod built with MPI, auto is Horovod over MPI."""
    flags = cli_flags(FLAGS, data_dir=small_dataset, strategy=strategy)
    hidden = [horovod_hidden(tmp_path)] if strategy == "multi_worker_mirrored" else []
    output = _mpirun_across(hosts, sshd, flags, tmp_path, hidden)
    expected = "horovod" if strategy == "auto" else strategy
    assert f"{expected}: 2 replica(s)" in output, output[-3000:]
    a, b = hosts.hosts
    _check_trained(tmp_path / a.name, tmp_path / b.name, output, reference)
    if strategy == "multi_worker_mirrored":  # both ranks' lines are in mpirun's one output
        _check_heartbeats(hosts, output, [output, output])
