"""--micro_batch_size=auto: the size found under an injected out-of-memory limit (TensorFlow's
own ResourceExhaustedError, raised by the probe's test hook or by an action mid-run), the
weights of an automatically sized run equal to a fixed split's, the back-off from the last
checkpoint to the same weights, two workers with different limits taking the smallest, and
hostile settings in one line."""

import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf
from conftest import TINY_RUN, cli_flags, final_weights
from weights import assert_same_weights
from hypothesis import given
from hypothesis import strategies as st
from outcomes import expects, outcome
from own_nets import write_module

from tfgpu import train
from tfgpu.cli import launch
from tfgpu.config import ConfigError, config_from, rundir, validate
from tfgpu.train.config import split_batch
from tfgpu.train.config import AUTO, memory_budget_bytes, micro_batch
from tfgpu.errors import OutOfMemory
from tfgpu.step import memory
from tfgpu.train.actions import Action
from tfgpu.train.micro_batch import RECORD, candidates

RUN = dict(TINY_RUN, train_steps=6, checkpoint_every_steps=3)


def _same(a, b, atol=1e-5):
    assert_same_weights(a, b, atol=atol)


def _run(data_dir, model_dir, actions=(), **kw):
    config = validate(config_from(data_dir=data_dir, model_dir=str(model_dir), **dict(RUN, **kw)))
    return train.run(config, actions=actions), final_weights(model_dir)


def _choices(model_dir) -> list:
    with open(os.path.join(model_dir, RECORD)) as f:
        return json.load(f)["choices"]


class OutOfMemoryAt(Action):
    """Raises TensorFlow's ResourceExhaustedError at the loop boundary of update ``step``
    while the run's micro-batch is above ``limit``: a device that ran out mid-run."""

    def __init__(self, step: int, limit: int):
        self.step, self.limit, self.raised = step, limit, 0

    def next_stop(self, step):
        return self.step if step < self.step else None

    def due(self, state):
        plan = state.plan
        return state.step == self.step and plan.replica_batch // plan.grad_accum_steps > self.limit

    def __call__(self, state):
        self.raised += 1
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating (injected)")


# --- the settings (no training) ----------------------------------------------------------


@pytest.mark.fast
def test_auto_and_counts_are_read_and_anything_else_is_one_line():
    assert micro_batch(config_from(micro_batch_size="auto").train) == AUTO
    assert micro_batch(config_from(micro_batch_size="8").train) == 8
    assert micro_batch(config_from(micro_batch_size=8).train) == 8  # the Python API's int
    assert split_batch(config_from(global_batch_size=16, micro_batch_size="4").train, 2) == (8, 2)
    # Until a run chooses, auto plans one micro-batch (what evaluation's build needs).
    assert split_batch(config_from(global_batch_size=16, micro_batch_size="auto").train, 2) == (
        8,
        1,
    )
    assert memory_budget_bytes(config_from(memory_budget_gb="2.5").train) == 2_500_000_000
    with pytest.raises(ConfigError, match="--memory_budget_gb is for --micro_batch_size=auto"):
        validate(config_from(memory_budget_gb="4"))
    with pytest.raises(ConfigError, match="not both"):
        validate(config_from(micro_batch_size="auto", grad_accum_steps=2))


@pytest.mark.fast
@expects("taken", "refused")
@given(st.text(max_size=12) | st.sampled_from(["auto", "8", "16", "2.5", "0.25", "1e3"]))
def test_hostile_micro_batch_sizes_and_budgets_are_one_line(text):
    for flag in ("micro_batch_size", "memory_budget_gb"):
        values = dict(dict(micro_batch_size="auto"), **{flag: text})
        try:
            validate(config_from(**values))
        except ConfigError as err:
            assert f"--{flag}=" in str(err) and "\n" not in str(err)
            outcome("refused")
        else:
            outcome("taken")


@pytest.mark.fast
@pytest.mark.parametrize("budget", ["0", "-1", "nan", "inf", "0.0000001", "lots"])
def test_budgets_that_cannot_work_are_named(budget):
    with pytest.raises(ConfigError, match=r"--memory_budget_gb=.* must be a positive number"):
        validate(config_from(micro_batch_size="auto", memory_budget_gb=budget))


@pytest.mark.fast
def test_candidates_are_the_divisors_largest_first():
    assert candidates(12) == [12, 6, 4, 3, 2, 1]
    assert candidates(12, below=6) == [4, 3, 2, 1]
    assert candidates(1, below=1) == []


@pytest.mark.fast
def test_a_run_that_stored_a_count_reads_back_as_one():
    """config.json of runs before auto holds an integer: read back as the same count."""
    stored = rundir.stored_settings({"micro_batch_size": 8}, "config.json")
    assert stored["micro_batch_size"] == "8"


@pytest.mark.fast
def test_the_probe_hook_raises_tensorflows_own_error(monkeypatch):
    device = memory.Device("CPU", 10**12, "test")
    monkeypatch.setenv(memory.TEST_HOOK, "4")
    ran = []
    over = memory.measure(lambda: ran.append(8), 8, device)
    assert not over.fits and over.why == "out of memory (injected)" and not ran
    under = memory.measure(lambda: ran.append(4), 4, device)
    assert under.fits and ran == [4] and under.peak_bytes is not None


# --- runs --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixed(reference_run):
    """The reference: one micro-batch of 16 per update, 6 updates (the session's TINY_RUN;
    RUN's checkpoints change no weight)."""
    return final_weights(reference_run())


def test_auto_finds_the_size_that_fits_backs_off_mid_run_and_trains_the_same_weights(
    small_dataset, fixed, tmp_path, monkeypatch, capfd
):
    """The device holds 8 at the start (16 runs out): auto takes 8. At update 4 it runs out
    with 8: the run starts again from the checkpoint of update 3 with 4, says so once, and
    ends with the weights of the run that took all 16 at once."""
    monkeypatch.setenv(memory.TEST_HOOK, "8")
    oom = OutOfMemoryAt(step=4, limit=4)
    summary, weights = _run(small_dataset, tmp_path, [oom], micro_batch_size="auto")
    out = capfd.readouterr().out
    assert oom.raised == 1 and out.count("backing off") == 1, out[-3000:]
    assert re.search(r"resumed from .*ckpt-3 at step 3", out), out[-3000:]
    assert summary["steps"] == 6 and summary["grad_accum_steps"] == 4
    _same(weights, fixed)
    first, second = _choices(tmp_path)
    tried = first["workers"][0]["tried"]
    assert [(t["size"], t["fits"]) for t in tried] == [(16, False), (8, True)]
    # >= 0, not > 0: in a process that ran other tests first (a pytest worker) the step may
    # reuse memory the process already holds, and a CPU's peak then does not grow.
    assert tried[-1]["peak_bytes"] >= 0 and first["reason"] == "start"
    assert second["micro_batch_size"] == 4 and second["reason"] == "out of memory at 8"
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["micro_batch_size"] == "auto"  # a resumed run chooses again


def test_out_of_memory_without_auto_says_what_to_set(small_dataset, tmp_path):
    with pytest.raises(OutOfMemory) as err:
        _run(small_dataset, tmp_path, [OutOfMemoryAt(step=3, limit=4)], micro_batch_size="8")
    line = str(err.value)
    assert "micro-batches of 8" in line and "--micro_batch_size=4" in line and "\n" not in line
    assert "--micro_batch_size=auto" in line


def test_a_budget_too_small_for_one_example_is_one_line(small_dataset, tmp_path):
    """In a process of its own: a warm one may hold memory the step reuses, so that its
    growth (what a CPU measures) shows nothing; a fresh one grows by TensorFlow's runtime."""
    values = dict(RUN, global_batch_size=2, micro_batch_size="auto", memory_budget_gb="0.001")
    flags = cli_flags(values, data_dir=small_dataset, model_dir=tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "tfgpu.main", *flags],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("tfgpu: error: --micro_batch_size=auto: no micro-batch fits on worker 0")
    assert "2: " in line and "1: " in line and "over budget" in line


def test_batchnorm_auto_equals_the_fixed_split_it_chose(small_dataset, tmp_path, monkeypatch):
    """With BatchNorm each micro-batch normalizes with its own statistics, so the split is
    part of the arithmetic: an auto run equals the fixed run of the size it chose (the probe
    leaves the initial weights, the statistics and the random state as they were). On a user's
    two Conv-BatchNorm blocks (own_nets.functional_bn; resnet20's three traces took ~37 CPU-s)."""
    model = f"{write_module(tmp_path)}:functional_bn"
    bn = dict(model=model, image_size=16, global_batch_size=8)
    bn.update(train_steps=2, steps_per_loop=2, log_every_steps=2)
    _, at_4 = _run(small_dataset, tmp_path / "fixed", micro_batch_size="4", **bn)
    monkeypatch.setenv(memory.TEST_HOOK, "4")
    summary, auto = _run(small_dataset, tmp_path / "auto", micro_batch_size="auto", **bn)
    assert summary["grad_accum_steps"] == 2
    _same(auto, at_4, atol=1e-6)


@pytest.mark.timeout(600)  # two processes: ~25 s of CPU, minutes on 2 shared cores
def test_two_workers_with_different_limits_take_the_smallest(small_dataset, tmp_path):
    """Two multi_worker_mirrored processes (8 examples per replica): one fits 8, the other 2;
    both train with 2, and end with the same weights."""
    values = dict(RUN, train_steps=2, steps_per_loop=2, micro_batch_size="auto")
    flags = cli_flags(values, data_dir=small_dataset)
    dirs = [tmp_path / "w0", tmp_path / "w1"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tfgpu.main", "--strategy=multi_worker_mirrored", *flags]
            + [f"--model_dir={d}"],
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_CONFIG=tf_config, **limit),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for d, tf_config, limit in zip(
            dirs, launch.tf_configs(2), [{memory.TEST_HOOK: "8"}, {memory.TEST_HOOK: "2"}]
        )
    ]
    try:
        outs = [p.communicate(timeout=540)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    line = re.search(r"^micro-batch: auto chose .*$", outs[0], re.M)
    assert line and "chose 2 of 8 per replica" in line.group(0), outs[0][-3000:]
    (choice,) = _choices(dirs[0])
    assert [w["size"] for w in choice["workers"]] == [8, 2]
    sums = {re.search(r"weights_sha256 (\w+)", out).group(1) for out in outs}
    assert len(sums) == 1
