"""One job under every launcher, for real: ``mpirun`` (Open MPI, as Kubeflow's MPIJob starts
processes) with Horovod's MPI controller and without Horovod, and a TFJob-style TF_CONFIG
(chief + worker, DNS names, ``"environment": "cloud"``). Each 2-process run ends with one
weights fingerprint and the weights of a one-process run (within 1e-5 of the largest weight),
on tiny_cnn, and with the heavy tests on resnet20 with synchronized BatchNorm too; a strategy
that cannot join the processes stops them all in one line. mpirun without Horovod is heavy
here: by default it runs across two hosts (tests/e2e/test_multihost.py), Horovod hidden."""

import json
import os
import re
import subprocess
import sys

import pytest
from procs import Output, kill_tree
from requires import requires
from conftest import (
    LARGE_BATCH_RUN,
    TINY_RUN,
    assert_one_all_reduce_per_update,
    cli_flags,
    final_weights,
    run_summary,
)
from weights import assert_same_weights, largest

from tfgpu.cli import launch
from tfgpu.cli.sidecar import watch

TIMEOUT_S = 240
# resnet20 at 16x16: synchronized BatchNorm's collectives as in any BatchNorm model, in 0.27M
# weights (resnet18's 11M made each update's all-reduce and the weights files 40 times larger).
BN_RUN = dict(TINY_RUN, model="resnet20", small_input=True, train_steps=4, sync_batchnorm=True)
BN_RUN.update(steps_per_loop=2, log_every_steps=2, checkpoint_every_steps=4, drop_path_rate=0.0)
BN_RUN.update(image_size=16)
# mpirun's Horovod job runs the large-batch settings (LARGE_BATCH_RUN: every per-example draw,
# the step's options, LARS, BCE on MixUp/CutMix, poly decay, the EMA's warm-up): it is
# tests/e2e/test_equivalence.py's Horovod case in the default tier (horovodrun's launch of it
# heavy there), with that test's checks added.
RUNS = {"tiny_cnn": TINY_RUN, "resnet20": BN_RUN, "large_batch": LARGE_BATCH_RUN}


@pytest.fixture(scope="module")
def references(reference_run):
    """``reference(model)``: the final weights of one default process (the session's runs,
    made once each, shared with other modules)."""

    def reference(model: str):
        return final_weights(reference_run(**RUNS[model]))

    return reference


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    # Open MPI refuses root unless told; CI runs as root.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # A rank that waits in an MPI call (its peer still tracing) yields the core instead of
    # spinning on it, as Open MPI does by itself when oversubscribed: the ranks share 2 cores
    # with the suite's other processes. How a rank waits changes no result; measured on the
    # large-batch job: 27.4-34.7 CPU-s spinning, 18.5-21.5 yielding.
    env.update(OMPI_MCA_mpi_yield_when_idle="1")
    return dict(env, TF_CPP_MIN_LOG_LEVEL="3", **extra)


def mpirun(args: list[str], np_: int = 2) -> list[str]:
    """``mpirun -np N`` as MPIJob users run it: no binding (TensorFlow's thread pools span the
    cores), then ``python -m tfgpu.main args``."""
    return [
        "mpirun",
        "-np",
        str(np_),
        "--bind-to",
        "none",
        sys.executable,
        "-m",
        "tfgpu.main",
        *args,
    ]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)


def check_one_job(out, model_dir, reference, strategy: str, replicas: int = 2) -> None:
    """The processes ran as one job: exit 0, one fingerprint, the chief's summary says so, and
    the weights equal the one-process run's within 1e-5 of the largest weight."""
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    pattern = r"worker (\d+)/\d+ weights_sha256 ([0-9a-f]{16})"
    found = dict(re.findall(pattern, text))
    assert sorted(found) == [str(i) for i in range(replicas)], text[-3000:]
    assert len(set(found.values())) == 1, f"the processes ended with different weights: {found}"
    summary = run_summary(model_dir)
    assert (summary["strategy"], summary["num_replicas"]) == (strategy, replicas)
    assert_same_weights(model_dir, reference, atol=1e-5 * largest(reference))


needs_mpirun = pytest.mark.requires("mpirun")


@needs_mpirun
@pytest.mark.parametrize(
    "model", ["large_batch", pytest.param("resnet20", marks=pytest.mark.heavy)]
)
def test_mpirun_auto_is_one_horovod_job(model, references, small_dataset, tmp_path):
    requires("horovod_mpi")
    flags = cli_flags(RUNS[model], data_dir=small_dataset, model_dir=tmp_path, strategy="auto")
    out = _run(mpirun(flags))
    reference = references(model)
    check_one_job(out, tmp_path, reference, "horovod")
    if model == "large_batch":  # test_equivalence's checks: module comment above RUNS
        assert_same_weights(tmp_path, reference, atol=1e-5)
        assert_one_all_reduce_per_update(tmp_path, LARGE_BATCH_RUN["train_steps"])  # across ranks


def horovod_hidden(folder) -> str:
    """A folder whose ``horovod`` package fails to import, for the front of a PYTHONPATH."""
    hide = os.path.join(folder, "no-horovod")
    os.makedirs(os.path.join(hide, "horovod"))
    with open(os.path.join(hide, "horovod", "__init__.py"), "w", encoding="utf-8") as f:
        f.write("raise ImportError('hidden by the test')\n")
    return hide


# Heavy: the default tier runs multi_worker_mirrored under mpirun with Horovod hidden across two
# hosts (tests/e2e/test_multihost.py's mpirun case, the same checks). resnet20's synchronized
# BatchNorm across multi_worker_mirrored processes is heavy as under Horovod and TFJob; the
# default tier shows it on a user's Conv-BatchNorm model under tfgpu.launch
# (tests/e2e/test_own_model_runs.py: two workers equal one device with sync).
@pytest.mark.heavy
@needs_mpirun
@pytest.mark.parametrize("model", ["tiny_cnn", "resnet20"])
def test_mpirun_multi_worker_mirrored_needs_no_horovod(model, references, small_dataset, tmp_path):
    # Horovod hidden: the cluster comes from the MPI world alone (addresses through mpi4py).
    strategy = "multi_worker_mirrored"
    model_dir = tmp_path / "run"  # beside the hiding folder: a model_dir holds a run only
    flags = cli_flags(RUNS[model], data_dir=small_dataset, model_dir=model_dir, strategy=strategy)
    hide = horovod_hidden(tmp_path)
    cmd = mpirun(flags)
    env_path = os.pathsep.join(p for p in (hide, os.environ.get("PYTHONPATH", "")) if p)
    out = subprocess.run(
        cmd, env=_env(PYTHONPATH=env_path), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    check_one_job(out, model_dir, references(model), strategy)


@needs_mpirun
def test_mpirun_with_a_one_machine_strategy_stops_every_process_in_one_line(
    small_dataset, tmp_path
):
    flags = cli_flags(TINY_RUN, data_dir=small_dataset, model_dir=tmp_path, strategy="mirrored")
    out = _run(mpirun(flags))
    errors = [line for line in (out.stdout + out.stderr).splitlines() if "tfgpu: error" in line]
    assert out.returncode == 2 and len(errors) == 2, out.stdout + out.stderr
    assert "OMPI_COMM_WORLD_SIZE=2" in errors[0] and "2 separate copies" in errors[0]
    assert os.listdir(tmp_path) == [], "nothing is written"


def tfjob_configs(host: str = "localhost") -> list[str]:
    """TF_CONFIG of a TFJob's chief, worker and evaluator, as Kubeflow writes them: DNS
    names, ``"environment": "cloud"``, the evaluator left out of the cluster."""
    chief, worker = (f"{host}:{p}" for p in launch.free_ports(2))
    cluster = {"chief": [chief], "worker": [worker]}
    tasks = [{"type": t, "index": 0} for t in ("chief", "worker", "evaluator")]
    return [json.dumps({"cluster": cluster, "task": t, "environment": "cloud"}) for t in tasks]


@pytest.mark.parametrize("model", ["tiny_cnn", pytest.param("resnet20", marks=pytest.mark.heavy)])
def test_a_tfjob_is_one_job_the_chief_writes_and_its_evaluator_follows(
    model, references, small_dataset, tmp_path
):
    """The chief and the worker (node-local --model_dirs) train as one job with the chief
    writing; the side-car evaluator on the chief's directory evaluates every checkpoint as it
    appears and fills in the run's final evaluation. It runs in this process (the function
    the evaluator task's command runs, ``cli.sidecar.watch``): that the trainers' own command
    with the TFJob's evaluator TF_CONFIG is that evaluator is
    tests/inference/test_watch.py's evaluator task (a process there); a third process here
    cost ~3.5 CPU-s of TensorFlow's start."""
    dirs = [tmp_path / "chief", tmp_path / "worker"]
    run = dict(RUNS[model], sidecar_eval=True, checkpoint_every_steps=2)
    procs = []
    for tf_config, model_dir in zip(tfjob_configs(), dirs):
        flags = cli_flags(run, data_dir=small_dataset, model_dir=model_dir)
        cmd = [sys.executable, "-m", "tfgpu.main", "--strategy=auto", "--watch_interval_s=0.2"]
        env = _env(TF_CONFIG=tf_config)
        procs.append(
            subprocess.Popen(
                [*cmd, *flags], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )
    outs = [Output(p) for p in procs]  # read as they come: this process is busy evaluating
    try:
        evaluated = watch(str(dirs[0]), 0.2, TIMEOUT_S, log=lambda _: None)
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            kill_tree(p)
    trainers = subprocess.CompletedProcess([], codes[0] or codes[1], "", "")
    trainers.stdout = "\n".join(o.drained() for o in outs)
    check_one_job(trainers, dirs[0], references(model), "multi_worker_mirrored")
    assert set(os.listdir(dirs[1])) <= {"config.json"}, "the worker wrote results"
    with open(dirs[0] / "metrics.jsonl", encoding="utf-8") as f:
        rows = [r for r in map(json.loads, f) if r["split"] == "validation"]
    steps = run["train_steps"]
    assert [r["step"] for r in rows] == list(range(2, steps + 1, 2)), rows
    assert evaluated == len(rows)
    assert run_summary(dirs[0])["final_eval"]["top1"] == rows[-1]["top1"]
