"""Two of a kind (issue 48): two side-car evaluators on one run (heavy here; by default in
tests/inference/test_watch.py), exports into one folder at once (one output twice, another
beside it), tfgpu-evaluate while the trainer replaces its checkpoints. Real processes
started together: each works or stops with one line, and no file is left half-written or
interleaved."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import tensorflow as tf
from conftest import TINY_RUN, cli_flags

from tfgpu import train
from tfgpu.config import config_from, validate

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def _command(module: str, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def _ended(proc, timeout: float = 900) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert "Traceback" not in err, err[-3000:]
    return proc.returncode, out, err


def _error_lines(err: str, prog: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(f"{prog}: error:")]


@pytest.fixture(scope="module")
def finished_run(small_dataset, tmp_path_factory) -> str:
    """TINY_RUN with a checkpoint every 2 updates, all kept: the heavy side-car test's run."""
    model_dir = str(tmp_path_factory.mktemp("run"))
    settings = dict(TINY_RUN, checkpoint_every_steps=2, keep_checkpoints=10, input_probe_s=0.0)
    train.run(
        validate(
            config_from(strategy="default", data_dir=small_dataset, model_dir=model_dir, **settings)
        )
    )
    return model_dir


# Heavy: tests/inference/test_watch.py's watcher that follows a restarted trainer starts a
# second watcher on its run (exit 2, one line naming the first's pid) and checks that the first
# evaluates each checkpoint once, in order, to the run's end (sidecar.json's step included).
@pytest.mark.heavy
@pytest.mark.timeout(900)  # two watchers: 91 s on 2 cores at load ~17
def test_a_second_side_car_on_one_run_stops_in_one_line_and_the_first_writes_alone(
    finished_run, tmp_path
):
    """The first watcher waits for the run's end (its summary.json is moved away meanwhile);
    a second one started then stops at once, naming the first; the first then ends, each
    checkpoint evaluated once."""
    summary = os.path.join(finished_run, "summary.json")
    os.rename(summary, tmp_path / "summary.json")
    watch = ["--watch", "--watch_interval_s=0.2", "--watch_timeout_s=600"]
    first = _command("tfgpu.cli.evaluate", f"--model_dir={finished_run}", *watch)
    deadline = time.time() + 600
    while not os.path.exists(os.path.join(finished_run, "sidecar.json")):  # it holds the lock
        assert first.poll() is None and time.time() < deadline, first.communicate()
        time.sleep(0.1)
    second = _command("tfgpu.cli.evaluate", f"--model_dir={finished_run}", *watch)
    code, _, err = _ended(second)
    lines = _error_lines(err, "tfgpu-evaluate")
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert "watched by another side-car evaluator" in lines[0] and f"pid {first.pid}" in lines[0]
    os.rename(tmp_path / "summary.json", summary)
    os.utime(summary)  # newer than config.json: the run is over
    code, out, err = _ended(first)
    assert code == 0, err[-3000:]
    with open(os.path.join(finished_run, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]  # every line whole
    evaluated = [r["step"] for r in rows if r["split"] == "validation"]
    steps = list(range(2, TINY_RUN["train_steps"] + 1, 2))
    assert sorted(evaluated) == sorted([TINY_RUN["train_steps"], *steps]), evaluated  # + loop's
    with open(os.path.join(finished_run, "sidecar.json"), encoding="utf-8") as f:
        assert json.load(f)["step"] == TINY_RUN["train_steps"]


@pytest.fixture
def session_run_copy(reference_run, tmp_path) -> str:
    """A copy of the session's TINY_RUN run (one default process; other modules compare with
    it), to export into."""
    model_dir = str(tmp_path / "run")
    shutil.copytree(reference_run(), model_dir)
    return model_dir


def _left_over(folder) -> list[str]:
    names = []
    for _, dirs, files in os.walk(folder):
        names += [n for n in dirs + files if ".unchecked" in n or n.endswith(".tmp")]
    return names


@pytest.mark.timeout(1200)  # three exports at once on 2 shared cores: 208 s at load ~17
def test_exports_into_one_folder_at_once_each_land_whole(session_run_copy):
    """Three exports into the run's export/ started together: its SavedModel twice (one
    output) and its ONNX model (another output, the same report.json and folder). Each ends
    with its export in place, whole, and the report keeps both entries."""
    finished_run = session_run_copy
    common = [f"--model_dir={finished_run}", "--check_images=8", "--batch_size=8"]
    procs = [_command("tfgpu.cli.export", *common) for _ in range(2)]
    procs.append(_command("tfgpu.cli.export", *common, "--format=onnx"))
    for proc in procs:
        code, _, err = _ended(proc)
        assert code == 0, err[-3000:]
    export = os.path.join(finished_run, "export")
    assert tf.saved_model.load(os.path.join(export, "saved_model")).signatures  # whole
    with open(os.path.join(export, "report.json"), encoding="utf-8") as f:
        report = json.load(f)["exports"]
    assert {report[k]["verdict"] for k in ("saved_model", "model.onnx")} == {"ok"}  # both kept
    with open(os.path.join(export, "labels.txt"), encoding="utf-8") as f:
        assert f.read() == "a\nb\nc\nd\n"
    assert _left_over(export) == []


@pytest.mark.timeout(900)  # a trainer and two evaluations: 84 s on 2 cores at load ~17
def test_evaluate_while_the_trainer_replaces_its_checkpoints_reads_a_whole_one(
    small_dataset, tmp_path
):
    """A checkpoint every update, only the newest kept: the one `latest` named is deleted
    before it is read, and tfgpu-evaluate follows the newest. Two at once into one --output:
    the file holds one whole result."""
    run = str(tmp_path / "run")
    settings = dict(TINY_RUN, train_steps=5000, checkpoint_every_steps=1, keep_checkpoints=1)
    settings.update(steps_per_loop=1, log_every_steps=50, input_probe_s=0.0)
    flags = cli_flags(settings, data_dir=small_dataset, model_dir=run, strategy="default")
    trainer = _command("tfgpu.main", *flags)
    try:
        deadline = time.time() + 600
        while not tf.train.latest_checkpoint(os.path.join(run, "checkpoints")):
            assert trainer.poll() is None and time.time() < deadline, trainer.communicate()
            time.sleep(0.1)
        output = str(tmp_path / "eval.json")
        args = [f"--model_dir={run}", f"--output={output}", "--tensorboard_dir="]
        evaluations = [_command("tfgpu.cli.evaluate", *args) for _ in range(2)]
        results = [_ended(p) for p in evaluations]
        assert trainer.poll() is None, "the trainer ended first: the test saw no race"
    finally:
        trainer.kill()
        trainer.communicate()
    for code, _, err in results:
        assert code == 0, err[-3000:]
    with open(output, encoding="utf-8") as f:
        result = json.load(f)
    assert result["num_examples"] == 24 and result["checkpoint"].endswith(f"ckpt-{result['step']}")
    assert _left_over(tmp_path) == []
