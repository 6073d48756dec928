"""A real two-worker run under a flood of malformed, forged and replayed heartbeat datagrams
from another process (``tests/flood.py``) ends as it would have without it: exit 0, the same
weights as an uninterrupted single-process run, with the datagrams counted as dropped.

The run is tests/e2e/test_equivalence.py's multi_worker_mirrored case (LARGE_BATCH_RUN: every
per-example draw, the step's options and the large-batch settings), whose claim this test holds
in the default tier: both workers end with one fingerprint, the one-process run's weights
within 1e-5, and one gradient all-reduce per update. That
the stall watchdog still names a frozen worker under the same flood (replays of its genuine
messages included) is shown by tests/e2e/test_hangs.py's frozen-worker scenario.

The two workers are a Slurm job without Slurm (tests/e2e/test_slurm_job.py's claim, heavy
there): srun's variables for 2 tasks on one node, faked in each one's environment, no
TF_CONFIG, make --strategy=auto a two-worker multi_worker_mirrored run. The start line says
so before the flood's checks and the weights': a wrong cluster from srun's variables fails on
that line."""

import os
import re
import sys

import pytest
from conftest import LARGE_BATCH_RUN, assert_one_all_reduce_per_update, cli_flags, final_weights
from procs import Output, kill_tree, popen, start_flood, wait_for
from slurm_env import srun_environ
from weights import assert_same_weights

TIMEOUT = 240


@pytest.fixture(scope="module")
def reference(reference_run):
    """The one-process run (the session's, shared with tests/e2e/test_equivalence.py)."""
    return final_weights(reference_run(**LARGE_BATCH_RUN))


def test_a_flood_of_forged_datagrams_changes_nothing(small_dataset, reference, tmp_path):
    dirs = [tmp_path / "w0", tmp_path / "w1"]
    cmd = [sys.executable, "-m", "tfgpu.main", "--strategy=auto"]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TF_CONFIG"))}
    job = 10_000 + os.getpid() % 50_000  # this "job"'s ports differ from other test runs'
    # The chief pauses in its first checkpoint write until the flood is under way (its
    # capture done and replays sent, as root): a short run would end before that.
    release = tmp_path / "flood-under-way"
    hold = {
        "TFGPU_TEST_PAUSE": "checkpoint",
        "TFGPU_TEST_PAUSE_UNTIL": str(release),
        "TFGPU_TEST_PAUSE_S": str(TIMEOUT),
    }
    procs = [
        popen(
            [*cmd, *cli_flags(LARGE_BATCH_RUN, data_dir=small_dataset, model_dir=d)],
            {**base, **srun_environ("2", "localhost", i, job=job), **(hold if i == 0 else {})},
        )
        for i, d in enumerate(dirs)
    ]
    outs, flood = [Output(p) for p in procs], None
    try:
        # Slurm's two tasks (srun's variables alone) made one two-worker job.
        started = wait_for(outs[0], r"(?m)^\S+: \d+ replica\(s\)", TIMEOUT).group(0)
        slurm = "srun's 2 tasks, --strategy=auto: " + outs[0].text[-3000:]
        assert started == "multi_worker_mirrored: 2 replica(s)", slurm
        flood = start_flood(outs[0])
        flooding = Output(flood)
        wait_for(flooding, "flood: under way", TIMEOUT)
        release.touch()
        for p in procs:
            p.wait(timeout=TIMEOUT)
    finally:
        for p in [*procs, *([flood] if flood else [])]:
            kill_tree(p)
    flooded = flooding.drained()
    texts = [o.text for o in outs]
    for p, text in zip(procs, texts):
        assert p.returncode == 0 and "Traceback" not in text, text[-3000:]
    assert_same_weights(dirs[0], reference, atol=1e-5)
    hashes = dict(h for t in texts for h in re.findall(r"worker (\d)/2 weights_sha256 (\w+)", t))
    assert sorted(hashes) == ["0", "1"] and len(set(hashes.values())) == 1, texts
    assert_one_all_reduce_per_update(dirs[0], LARGE_BATCH_RUN["train_steps"])  # across both workers
    # The flood reached both workers and was counted: from strangers and, as root, from the
    # workers' own addresses (forged, and genuine ones replayed once captured).
    assert "flood: spoofing" in flooded, flooded
    root = "spoofing on" in flooded
    assert not root or re.search(r"flood: captured [1-9]\d* genuine", flooded), flooded
    for i, text in enumerate(texts):
        found = rf"worker {i}: heartbeats: (\d+) heard from peers, (\d+) dropped \((.*)\)"
        dropped = re.search(found, text)
        assert dropped and int(dropped.group(1)) > 0 and int(dropped.group(2)) > 20, text[-3000:]
        assert "not from a peer's address" in dropped.group(3)
        if root:
            for reason in ("bad signature", "too large", "replayed or out of order"):
                assert reason in dropped.group(3), dropped.group(3)
