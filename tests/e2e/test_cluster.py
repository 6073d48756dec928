"""Clusters as they are: node-local --model_dir (only the chief's holds checkpoints), workers
that disagree, a worker that lacks its data. Every worker is a real process with its own
--model_dir; the chief's checkpoint reaches the others by broadcast."""

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import TINY_RUN, cli_flags, final_weights, run_summary
from requires import requires
from weights import assert_same_weights

from tfgpu import train
from tfgpu.cli import launch
from tfgpu.config import config_from, validate
from tfgpu.distribute import DistributeError, heartbeats
from tfgpu.train.loop import agreed_input

# 16x16: the cluster is the claim, not the model (a tiny_cnn update ~25 ms of CPU instead of
# ~65 at 32, bench/README.md).
RUN = dict(TINY_RUN, train_steps=6, checkpoint_every_steps=3, image_size=16)
# --micro_batch_size=8 keeps the global batch of 16 whatever the count: 2 workers take one
# micro-batch each (as without it), one process takes two. Every part of a run uses the same
# flags.
RESIZED = dict(RUN, micro_batch_size=8)
TIMEOUT = 240


@pytest.fixture(scope="module")
def uninterrupted(reference_run):
    """RUN on one process (a session's run: RUN's checkpoints change no weight)."""
    return final_weights(reference_run(image_size=RUN["image_size"]))


def _env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def _mwms(flags_per_worker: list) -> list:
    """Runs one tfgpu.main per worker (TF_CONFIG filled in); returns their CompletedProcess."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tfgpu.main", "--strategy=multi_worker_mirrored", *flags],
            env=dict(_env(), TF_CONFIG=tf_config),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flags, tf_config in zip(flags_per_worker, launch.tf_configs(len(flags_per_worker)))
    ]
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


@pytest.fixture(scope="module")
def stopped_at_3(small_dataset, tmp_path_factory) -> list:
    """The node-local --model_dirs of 2 workers that ran RESIZED for 3 of 6 steps: the run
    that two tests go on with, each from its own copy (2 workers again; one process)."""
    root = tmp_path_factory.mktemp("stopped-at-3")
    dirs = [root / "node0", root / "node1"]
    flags = dict(RESIZED, train_steps=3)
    for out in _mwms([cli_flags(flags, data_dir=small_dataset, model_dir=d) for d in dirs]):
        assert out.returncode == 0, out.stderr[-3000:]
    return dirs


@pytest.fixture(scope="module")
def uninterrupted_resized(small_dataset, tmp_path_factory):
    """The final weights of RESIZED run for all 6 steps, uninterrupted, by one default process
    (this one, its 2 micro-batches of 8 each update): what the runs resumed at step 3 below
    end with, bit for bit, on 2 workers or on one process. 2 workers (one micro-batch each)
    end with the same bits: the sum of the two halves' gradients either way."""
    model_dir = tmp_path_factory.mktemp("resized") / "run"
    _default(small_dataset, model_dir, 6)
    return final_weights(model_dir)


def _horovod(horovodrun_tfgpu, flags: list, model_dir_pattern: str):
    """Two Horovod ranks, each with its own --model_dir (``pattern`` with {rank})."""
    python, rest = horovodrun_tfgpu[:-3], horovodrun_tfgpu[-3:]
    assert rest[1:] == ["-m", "tfgpu.main"]
    model_dir = model_dir_pattern.replace("{rank}", "$HOROVOD_RANK")
    script = f'exec "{rest[0]}" -m tfgpu.main --strategy=horovod --model_dir="{model_dir}" "$@"'
    cmd = [*python, "sh", "-c", script, "sh", *flags]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)


def _assert_same(weights, reference):
    assert_same_weights(weights, reference, atol=1e-5)


def _copies(dirs, to) -> list:
    """Copies of the run directories ``dirs`` (those that exist) under ``to``, same names."""
    copies = [to / os.path.basename(d) for d in dirs]
    for d, copy in zip(dirs, copies):
        if os.path.exists(d):
            shutil.copytree(d, copy)
    return copies


def test_node_local_model_dirs_resume_from_the_chief_mwms(
    small_dataset, uninterrupted_resized, stopped_at_3, tmp_path
):
    dirs = _copies(stopped_at_3, tmp_path)
    assert os.listdir(dirs[0] / "checkpoints") and not (dirs[1] / "checkpoints").exists()
    flags = [
        cli_flags(dict(RESIZED, train_steps=6), data_dir=small_dataset, model_dir=d) for d in dirs
    ]
    second = _mwms(flags)
    for out in second:
        assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from" in second[0].stdout and "at step 3" in second[0].stdout
    assert_same_weights(dirs[0], uninterrupted_resized)
    hashes = {
        h for out in second for h in re.findall(r"worker \d+/2 weights_sha256 (\w+)", out.stdout)
    }
    assert len(hashes) == 1  # the non-chief ended identical, with no files of its own


@pytest.mark.heavy  # the MWMS case above shows the contract; this one is the other backend
def test_node_local_model_dirs_resume_from_the_chief_horovod(
    small_dataset, uninterrupted, tmp_path, horovodrun_tfgpu
):
    pattern = str(tmp_path / "rank{rank}")
    for steps in (3, 6):
        flags = cli_flags(dict(RUN, train_steps=steps), data_dir=small_dataset)
        out = _horovod(horovodrun_tfgpu, flags, pattern)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "resumed from" in out.stdout and "at step 3" in out.stdout
    assert not (tmp_path / "rank1" / "checkpoints").exists()
    _assert_same(final_weights(tmp_path / "rank0"), uninterrupted)


@pytest.fixture(scope="module")
def few_shards(tmp_path_factory) -> tuple:
    """A dataset of 1 train shard (32 images) and 1 evaluation example in 4 classes (fewer
    than the replicas of any run here), and what 2 workers (each with its own --model_dir)
    did on it with --keep_best and --early_stop_patience: (its folder, the two --model_dirs,
    their CompletedProcess). The run two tests check, each its claim: one pair of processes
    instead of two (measured: the module 63.2 -> 55.1 CPU-s)."""
    from conftest import make_image_arrays

    from tfgpu.convert import plan
    from tfgpu.convert.manifest import items_from_arrays

    root = tmp_path_factory.mktemp("few-shards")
    images, labels = make_image_arrays(33)
    items = items_from_arrays(images, labels, prefix="few")
    data = str(root / "data")
    plan.write_dataset(
        {"train": items[:32], "validation": items[32:]},
        ["a", "b", "c", "d"],
        data,
        "tests",
        {"train": 1, "validation": 1},
    )
    dirs = [root / "w0", root / "w1"]
    flags = dict(FEW, train_steps=20, input_probe_s=0, **BEST)
    return data, dirs, _mwms([cli_flags(flags, data_dir=data, model_dir=d) for d in dirs])


# 8 examples a step; top5 of 4 classes is 1.0 at every evaluation, so none is better than the
# first (at step 2) and, with patience 1, the run stops at the second: step 4 of the 20 planned.
FEW = dict(RUN, global_batch_size=8)
BEST = dict(keep_best=1, best_metric="top5", early_stop_patience=1, eval_every_steps=2)


def test_best_and_early_stop_under_two_workers(few_shards):
    """--keep_best and --early_stop_patience with 2 workers, each with its own --model_dir:
    every worker stops at the same step (one that went on would wait forever in a collective)
    and exits 0 with the same weights; only the chief's --model_dir has best/ (FEW, BEST)."""
    _, dirs, runs = few_shards
    for out in runs:
        assert out.returncode == 0, out.stderr[-3000:]
    ended = [re.findall(r"worker (\d)/2 weights_sha256 (\w+)", out.stdout) for out in runs]
    assert [worker for ((worker, _),) in ended] == ["0", "1"]
    assert len({sha for ((_, sha),) in ended}) == 1  # the same updates, so the same stop
    summary = run_summary(dirs[0])
    assert summary["stopped"] == "early_stop" and summary["stopped_at_step"] == 4
    assert summary["steps"] == 4 and "early stop at step 4" in runs[0].stdout
    (kept,) = json.load(open(dirs[0] / "best" / "best.json"))["kept"]
    assert kept["step"] == 2 and os.path.exists(kept["checkpoint"] + ".index")
    assert os.listdir(dirs[1]) == []  # no best/, nor anything else: only the chief writes


def _error_lines(out) -> list:
    return [line for line in out.stderr.splitlines() if line.startswith("tfgpu: error:")]


class _Gather:
    """A backend of 2 workers whose all-gather returns worker 0's blob, then worker 1's:
    ``theirs`` (what worker 1 sent), or this worker's own (None); ``sent``: its blob."""

    num_workers, num_replicas = 2, 2

    def __init__(self, is_chief: bool, theirs: bytes | None = None):
        self.is_chief, self.theirs, self.sent = is_chief, theirs, None

    def all_gather_bytes(self, blob: bytes) -> list:
        self.sent = blob
        return [blob, blob if self.theirs is None else self.theirs]


def test_workers_that_disagree_stop_naming_the_field_and_the_workers(
    small_dataset, tmp_path, monkeypatch
):
    """Each worker's start-up agreement as tfgpu.main makes it (train.loop.agreed_input:
    its own input, its settings, its TF_CONFIG's address), worker 0 given what worker 1 sent:
    the first field that differs, who holds which value. That the processes then stop with
    that one line, exit 2, nothing trained, is the no-data pair's below (the same way out);
    two real workers disagreeing: the heavy test after it."""
    configs, sent, line = launch.tf_configs(2), [], ""
    for i, lr in ((1, 0.02), (0, 0.01)):
        monkeypatch.setenv("TF_CONFIG", configs[i])
        values = dict(RUN, learning_rate=lr, strategy="multi_worker_mirrored")
        config = validate(
            config_from(data_dir=small_dataset, model_dir=str(tmp_path / f"w{i}"), **values)
        )
        backend = _Gather(is_chief=i == 0, theirs=sent[0] if sent else None)
        try:
            agreed_input(config, backend, heartbeats.Watch().announced)
        except DistributeError as err:
            line = str(err)
        sent.append(backend.sent)
    addresses = json.loads(configs[0])["cluster"]["worker"]
    assert line == (
        f"the workers disagree on --learning_rate: 0.01 on worker 0 ({addresses[0]}), "
        f"0.02 on worker 1 ({addresses[1]})"
    ), line


@pytest.mark.heavy  # the agreement in-process above, the processes' way out in the no-data pair
def test_two_worker_processes_that_disagree_stop_naming_the_field_and_the_workers(
    small_dataset, tmp_path
):
    runs = _mwms(
        [
            cli_flags(
                dict(RUN, learning_rate=lr), data_dir=small_dataset, model_dir=tmp_path / f"w{i}"
            )
            for i, lr in enumerate((0.01, 0.02))
        ]
    )
    for out in runs:
        assert out.returncode == 2, out.stderr[-3000:]
        (line,) = _error_lines(out)
        assert "the workers disagree on --learning_rate: 0.01 on worker 0 (" in line, line
        assert "0.02 on worker 1 (localhost:" in line and "Traceback" not in out.stderr
    assert not (tmp_path / "w0" / "checkpoints").exists()  # nothing trained


def test_a_worker_without_its_data_is_named_by_every_worker(small_dataset, tmp_path):
    empty = tmp_path / "not-copied-to-this-node"
    empty.mkdir()
    runs = _mwms(
        [
            cli_flags(RUN, data_dir=small_dataset, model_dir=tmp_path / "w0"),
            cli_flags(RUN, data_dir=empty, model_dir=tmp_path / "w1"),
        ]
    )
    for out in runs:
        assert out.returncode == 2, out.stderr[-3000:]
        (line,) = _error_lines(out)
        assert "worker 1 (localhost:" in line and "holds no train-* shards" in line, line
        assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert not (tmp_path / "w0" / "checkpoints").exists()  # nothing trained


# --- restarts on another number of workers --------------------------------------------------


def _default(data_dir, model_dir, steps) -> str:
    """RESIZED for ``steps`` on one default process: this one (the pytest worker's; the
    worker count that changes is the claim, not how the one process starts). Returns what
    the run printed."""
    return _in_this_process(
        dict(RESIZED, train_steps=steps, strategy="default"), data_dir, model_dir
    )


def _in_this_process(values: dict, data_dir, model_dir) -> str:
    """``values`` (Config settings) trained on ``data_dir`` into ``model_dir`` by this
    process; returns what the run printed."""
    config = validate(config_from(data_dir=str(data_dir), model_dir=str(model_dir), **values))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        train.run(config)
    return printed.getvalue()


def _two_workers(data_dir, model_dir, steps):
    dirs = [model_dir, f"{model_dir}-worker1"]
    flags = [
        cli_flags(dict(RESIZED, train_steps=steps), data_dir=data_dir, model_dir=d) for d in dirs
    ]
    runs = _mwms(flags)
    for out in runs:
        assert out.returncode == 0, out.stderr[-3000:]
    return runs[0]


def test_two_workers_then_one_process_ends_bit_identical(
    small_dataset, stopped_at_3, uninterrupted_resized, tmp_path
):
    shutil.copytree(stopped_at_3[0], tmp_path / "resized")  # the chief's directory goes on
    out = _default(small_dataset, tmp_path / "resized", 6)
    assert "at step 3" in out and "2 micro-batch(es) of 8" in out, out[-3000:]
    assert_same_weights(tmp_path / "resized", uninterrupted_resized)


@pytest.mark.heavy  # the worker count changes in the tests beside it, both ways round here
def test_one_process_then_two_workers(small_dataset, uninterrupted, tmp_path):
    _default(small_dataset, tmp_path / "run", 3)
    out = _two_workers(small_dataset, tmp_path / "run", 6)
    assert "at step 3" in out.stdout and "1 micro-batch(es) of 8" in out.stdout
    _assert_same(final_weights(tmp_path / "run"), uninterrupted)


@pytest.mark.heavy  # the worker count changes above; this changes the backend too
def test_horovod_then_multi_worker_mirrored(
    small_dataset, uninterrupted, tmp_path, horovodrun_tfgpu
):
    flags = cli_flags(dict(RESIZED, train_steps=3), data_dir=small_dataset)
    out = _horovod(horovodrun_tfgpu, flags, str(tmp_path / "run") + "{rank}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    os.rename(tmp_path / "run0", tmp_path / "run")  # the chief's directory goes on
    out = _two_workers(small_dataset, tmp_path / "run", 6)
    assert "at step 3" in out.stdout
    _assert_same(final_weights(tmp_path / "run"), uninterrupted)


def test_fewer_shards_than_workers_and_fewer_eval_examples_than_replicas(few_shards, tmp_path):
    """1 train shard for 2 workers, 1 evaluation example for 2 replicas (2 workers, one
    replica each, and 2 devices in one process): no deadlock, every worker runs every step,
    the example is evaluated once (the replicas without one count nothing)."""
    data, _, runs = few_shards
    for out in runs:
        assert out.returncode == 0, out.stderr[-3000:]
    assert "2 replica(s), 20 updates" in runs[0].stdout
    # Every evaluation (at step 2, at the early stop's 4 and the final one) counts 1 example.
    evals = re.findall(r"^eval +step (\d+): .* \((\d+) examples\)$", runs[0].stdout, re.M)
    assert {s for s, _ in evals} == {"2", "4"} and {n for _, n in evals} == {"1"}, evals
    # mirrored on this process's 2 logical devices (tests/conftest.py): the replicas are the
    # claim, not the process (a subprocess of its own cost ~5 CPU-s more).
    out = _in_this_process(dict(FEW, eval_every_steps=3, strategy="mirrored"), data, tmp_path)
    assert "mirrored: 2 replica(s)" in out and out.count("(1 examples)") == 2, out[-3000:]


@pytest.mark.heavy  # ~95 s on a starved core: a diagnostic, not a contract
def test_the_chief_logs_the_slowest_worker_per_window(small_dataset, tmp_path):
    """A straggler made for real: worker 1 shares its CPU core with three busy loops."""
    requires("two_cores")  # to slow one worker down and not the other
    busy = ["taskset", "-c", "1", sys.executable, "-c", "while True: pass"]
    hogs = [subprocess.Popen(busy) for _ in range(3)]  # a third of the core is left to it
    try:
        run = dict(RUN, train_steps=20, log_every_steps=4, steps_per_loop=4, in_memory="off")
        run["deterministic"] = False  # TensorFlow refuses the clock it needs under determinism
        cmd = [sys.executable, "-m", "tfgpu.main", "--strategy=multi_worker_mirrored"]
        procs = [
            subprocess.Popen(
                ["taskset", "-c", str(i), *cmd]
                + cli_flags(run, data_dir=small_dataset, model_dir=tmp_path / f"w{i}"),
                env=dict(_env(), TF_CONFIG=tf_config),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i, tf_config in enumerate(launch.tf_configs(2))
        ]
        outs = [p.communicate(timeout=TIMEOUT) for p in procs]
    finally:
        for hog in hogs:
            hog.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    records = [json.loads(line) for line in open(tmp_path / "w0" / "metrics.jsonl")]
    windows = [r for r in records if r["split"] == "train"][1:]  # the first includes tracing
    assert len(windows) == 4 and all("slowest_worker" in r for r in windows)
    slow = [r for r in windows if r["slowest_worker"] == 1]
    assert len(slow) >= 3, windows
    assert all(r["slowest_compute_s"] > r["median_compute_s"] for r in slow), windows
    assert re.search(r"slowest worker 1 \(localhost:\d+\):", outs[0][0]), outs[0][0][-3000:]
