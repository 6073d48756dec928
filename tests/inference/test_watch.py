"""python -m tfgpu.evaluate --watch (tfgpu/watch.py): a side-car evaluator that follows a run's
checkpoints to its end and writes what the loop's evaluation writes, with the same numbers."""

import csv
import json
import os
import shutil
import signal
import sys
import time

import pytest
from conftest import TINY_RUN, cli_flags
from procs import Output, kill_tree, popen

from tfgpu import train
from tfgpu.config import ConfigError, config_from, validate
from tfgpu.errors import CheckpointError
from tfgpu.cli.app import run_command
from tfgpu.cli.sidecar import watch

KEYS = ("top1", "top5", "loss", "num_examples", "non_finite")


def _rows(model_dir, split="validation") -> list[dict]:
    with open(os.path.join(model_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r["split"] == split]


def _csv(model_dir) -> list[dict]:
    with open(os.path.join(model_dir, "summary.csv"), encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _read(model_dir, name) -> dict:
    with open(os.path.join(model_dir, name), encoding="utf-8") as f:
        return json.load(f)


def _listed_steps(model_dir) -> list[int]:
    """The steps of the checkpoints the run's index names."""
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(os.path.join(model_dir, "checkpoints"))
    return sorted(int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths)


@pytest.fixture(scope="module")
def in_loop_run(small_dataset, tmp_path_factory):
    """A run that evaluates in its loop every 2 updates and checkpoints every 2 (one device)."""
    model_dir = str(tmp_path_factory.mktemp("inloop"))
    settings = dict(TINY_RUN, eval_every_steps=2, checkpoint_every_steps=2, keep_checkpoints=10)
    settings.update(ema_decay=0.9, eval_batch_size=10, input_probe_s=0.0)  # EMA, a padded batch
    config = config_from(
        strategy="default", data_dir=small_dataset, model_dir=model_dir, **settings
    )
    train.run(validate(config))
    return model_dir


def _without_evaluations(model_dir, to) -> str:
    """A copy of the run in ``model_dir`` without its evaluations (rows, summary.csv)."""
    shutil.copytree(model_dir, to)  # mtimes kept: summary.json stays newer than config.json
    rows = [r for r in _rows(to, "train")]
    with open(os.path.join(to, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.remove(os.path.join(to, "summary.csv"))
    return str(to)


def test_watcher_rows_equal_the_loops_exactly(in_loop_run, tmp_path):
    copy = _without_evaluations(in_loop_run, tmp_path / "copy")
    lines = []
    assert watch(copy, interval_s=0.05, timeout_s=60, log=lines.append) == 3
    loop, side = _rows(in_loop_run), _rows(copy)
    assert [r["step"] for r in side] == [r["step"] for r in loop] == [2, 4, 6]
    for a, b in zip(loop, side, strict=True):
        assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}, a["step"]  # exactly
    assert len(_csv(in_loop_run)) == len(_csv(copy)) > 0
    for a, b in zip(_csv(in_loop_run), _csv(copy), strict=True):
        assert [a[k] for k in ("step", "epoch", "top1", "top5", "loss", "learning_rate")] == [
            b[k] for k in ("step", "epoch", "top1", "top5", "loss", "learning_rate")
        ]
    assert _read(copy, "sidecar.json")["step"] == 6
    assert "evaluates in its loop too" in lines[0] and "ended at step 6" in lines[-1]
    # TensorBoard eval/ scalars at each step.
    assert _scalar_steps(os.path.join(copy, "tensorboard", "eval"), "top1") >= {2, 4, 6}
    # Started again on a run it has followed to its end: nothing new, no row twice.
    assert watch(copy, interval_s=0.05, timeout_s=60, log=lines.append) == 0
    assert len(_rows(copy)) == 3


def _scalar_steps(logdir, tag) -> set:
    import tensorflow as tf

    steps = set()
    for path in tf.io.gfile.glob(os.path.join(logdir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            steps.update(event.step for v in event.summary.value if v.tag == tag)
    return steps


def test_a_half_written_checkpoint_is_read_again_and_a_deleted_one_named(in_loop_run, tmp_path):
    """The index names ckpt-4 while its data file is still short (a copy, or a trainer
    writing it): the read fails, is tried again, and reads once the file is whole. ckpt-2,
    deleted before the watcher saw it (--keep_checkpoints), is named in a line."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(os.path.join(in_loop_run, "config.json"), run)
    source = os.path.join(in_loop_run, "checkpoints")
    (data,) = [n for n in os.listdir(source) if n.startswith("ckpt-4.data")]
    shutil.copy(os.path.join(source, "ckpt-4.index"), run / "checkpoints")
    whole = open(os.path.join(source, data), "rb").read()
    (run / "checkpoints" / data).write_bytes(whole[: len(whole) // 2])
    index = 'model_checkpoint_path: "ckpt-4"\nall_model_checkpoint_paths: "ckpt-4"\n'
    (run / "checkpoints" / "checkpoint").write_text(index)
    (run / "summary.json").write_text(json.dumps({"steps": 4}))  # the run ended at 4

    lines = []

    def log(line):
        lines.append(line)
        if "read failed, retry 1" in line:  # the trainer finishes writing it
            (run / "checkpoints" / data).write_bytes(whole)

    assert watch(str(run), interval_s=0.05, timeout_s=60, log=log) == 1
    text = "\n".join(lines)
    assert "ckpt-4: read failed, retry 1" in text and "retry 2" not in text
    assert "1 checkpoint(s) deleted before they could be read (steps 2;" in text
    (row,) = _rows(run)
    expected = next(r for r in _rows(in_loop_run) if r["step"] == 4)
    assert {k: row[k] for k in KEYS} == {k: expected[k] for k in KEYS}


@pytest.mark.fast
def test_waiting_too_long_is_one_line_naming_the_wait(tmp_path, capsys):
    with pytest.raises(CheckpointError, match="waited 0.[0-9] s for the run's config.json in"):
        watch(str(tmp_path), interval_s=0.05, timeout_s=0.2)
    code = run_command(watch, "", prog="tfgpu-evaluate")
    assert code == 2 and "--watch needs --model_dir" in capsys.readouterr().err


@pytest.mark.fast
def test_sidecar_eval_settings():
    validate(config_from(sidecar_eval=True, keep_best=2, early_stop_patience=3))  # valid
    with pytest.raises(ConfigError, match="--eval_every_steps and --eval_every_epochs must be 0"):
        validate(config_from(sidecar_eval=True, eval_every_steps=2))
    with pytest.raises(ConfigError, match="--export_best needs evaluations in the loop"):
        validate(config_from(sidecar_eval=True, export_best=True))
    with pytest.raises(ConfigError, match="or --sidecar_eval"):
        validate(config_from(keep_best=2))


@pytest.mark.fast
def test_a_tfjob_evaluator_is_an_evaluator(monkeypatch):
    from tfgpu.distribute import env

    cluster = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]}  # as TFJob writes it
    task = {"type": "evaluator", "index": 0}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    assert env.is_evaluator()


SIDECAR_RUN = dict(
    TINY_RUN,
    sidecar_eval=True,
    log_every_steps=2,
    steps_per_loop=2,
    keep_checkpoints=50,
    input_probe_s=0.0,
)


LAST = 40  # the restarted trainer's run: its last update


def _wait_for(predicate, procs, timeout=150):
    deadline = time.time() + timeout
    while not predicate():
        for proc, out in procs:
            assert proc.poll() is None, out.text[-3000:]
        assert time.time() < deadline, "\n".join(out.text[-2000:] for _, out in procs)
        time.sleep(0.1)


def _finished(proc, out, timeout=180) -> int:
    try:
        return proc.wait(timeout=timeout)
    except Exception:
        kill_tree(proc)
        raise AssertionError(out.text[-3000:]) from None


def test_a_watcher_started_first_follows_a_restarted_trainer_to_its_end(
    small_dataset, tmp_path, capsys
):
    """The watcher starts before the trainer; the trainer is stopped mid-way (SIGTERM: its
    checkpoint, exit 75) and started again; the watcher evaluates every checkpoint once and
    exits 0 at the run's end, and summary.json gets its final evaluation. A second watcher
    started meanwhile on the same run stops at once in one line naming the first (two would
    write every result twice); the first writes alone."""
    model_dir = str(tmp_path / "run")
    watcher_cmd = [sys.executable, "-m", "tfgpu.evaluate", f"--model_dir={model_dir}", "--watch"]
    watcher = popen([*watcher_cmd, "--watch_interval_s=0.3", "--watch_timeout_s=150"])
    watched = Output(watcher)
    # 40 updates, a checkpoint every 10, the stop's between: the signal is sent once step 10
    # is logged and lands mid-run for sure, as the trainer waits inside its checkpoint of
    # step 20 (the test-only pause, tfgpu/files.py) until the signal is sent.
    settings = dict(SIDECAR_RUN, train_steps=LAST, checkpoint_every_steps=10)
    trainer_cmd = [sys.executable, "-m", "tfgpu.main", *cli_flags(settings)]
    trainer_cmd += [f"--data_dir={small_dataset}", f"--model_dir={model_dir}", "--strategy=default"]
    sent = tmp_path / "sigterm-sent"
    pause = dict(TFGPU_TEST_PAUSE="checkpoint@2", TFGPU_TEST_PAUSE_UNTIL=str(sent))
    try:
        first = popen(trainer_cmd, env=dict(os.environ, **pause, TFGPU_TEST_PAUSE_S="600"))
        out = Output(first)
        _wait_for(lambda: f"step 10/{LAST}" in out.text, [(first, out), (watcher, watched)])
        first.send_signal(signal.SIGTERM)
        sent.touch()
        assert _finished(first, out) == 75, out.text[-3000:]
        _a_second_watcher_stops_naming(watcher, model_dir, capsys)
        again = _restarted_here(settings, small_dataset, model_dir, capsys)
        assert _finished(watcher, watched) == 0, watched.text[-3000:]
    finally:
        for proc in (watcher, first):
            kill_tree(proc)
    assert "resumed from" in again and "eval  step" not in out.text + again
    steps = _listed_steps(model_dir)
    assert steps[0] == 10 and steps[-1] == LAST and len(steps) >= 4
    assert [r["step"] for r in _rows(model_dir)] == steps  # each checkpoint once, in order
    assert [int(r["step"]) for r in _csv(model_dir)] == steps
    summary, last = _read(model_dir, "summary.json"), _rows(model_dir)[-1]
    assert summary["steps"] == LAST
    assert summary["final_eval"] == {
        k: last[k] for k in ("top1", "top5", "loss", "non_finite", "tta")
    }
    assert f"the run ended at step {LAST}" in watched.text
    assert _read(model_dir, "sidecar.json")["step"] == LAST


def _restarted_here(settings: dict, data_dir, model_dir, capsys) -> str:
    """The stopped trainer's run started again on ``model_dir`` in this process (train.run,
    as the command runs it: a process of its own cost ~3.5 CPU-s of TensorFlow's start, and
    the watcher, the other process, is the claim); what it printed."""
    capsys.readouterr()
    values = dict(settings, strategy="default", data_dir=data_dir, model_dir=model_dir)
    train.run(validate(config_from(**values)))
    return capsys.readouterr().out


def _a_second_watcher_stops_naming(watcher, model_dir, capsys) -> None:
    """A second side-car on the run ``watcher`` watches (it holds the run's side-car lock
    once sidecar.json is there): exit 2, one line naming the first's pid. Started in this
    process (the command's function, as test_waiting_too_long_is_one_line_naming_the_wait
    does): the lock is the other process's flock either way, and a process of its own cost
    ~1.8 CPU-s of TensorFlow's start. Its timeout is short: a watcher that took the lock
    would give up there instead of following the run."""
    _wait_for(lambda: os.path.exists(os.path.join(model_dir, "sidecar.json")), [])
    capsys.readouterr()
    code = run_command(watch, model_dir, 0.3, 5.0, prog="tfgpu-evaluate")
    said = capsys.readouterr()
    assert code == 2, said.out[-3000:] + said.err[-3000:]
    lines = [line for line in said.err.splitlines() if line.startswith("tfgpu-evaluate: error:")]
    assert len(lines) == 1 and said.out == "", said.out[-3000:] + said.err[-3000:]
    assert "watched by another side-car evaluator" in lines[0], lines
    assert f"pid {watcher.pid}" in lines[0], lines


def test_the_evaluator_task_keeps_the_best_and_stops_the_trainer_early(small_dataset, tmp_path):
    """A TF_CONFIG evaluator task (tfgpu.main, the trainers' flags) keeps best/ and counts
    evaluations without a better top5 (always 1.0 with 4 classes: only the first is better);
    the trainer, evaluating nothing itself, reads the verdict and stops after 3 evaluations."""
    model_dir = str(tmp_path / "run")
    settings = dict(SIDECAR_RUN, train_steps=3000, checkpoint_every_steps=4)
    settings.update(keep_best=2, best_metric="top5", early_stop_patience=2)
    flags = cli_flags(settings, data_dir=small_dataset, model_dir=model_dir, strategy="default")
    # As TFJob writes it: the evaluator is not in the cluster, whose tasks it never reaches
    # (tests/e2e/test_launch_jobs.py's TFJob follows its chief with this evaluator's function).
    cluster = {"chief": ["localhost:1"], "worker": ["localhost:2"]}
    task = {"type": "evaluator", "index": 0}
    tf_config = json.dumps({"cluster": cluster, "task": task, "environment": "cloud"})
    evaluator_cmd = [sys.executable, "-m", "tfgpu.main", *flags, "--watch_interval_s=0.2"]
    evaluator = popen(evaluator_cmd, env=dict(os.environ, TF_CONFIG=tf_config))
    watched = Output(evaluator)
    trainer = popen([sys.executable, "-m", "tfgpu.main", *flags])
    out = Output(trainer)
    try:
        assert _finished(trainer, out) == 0, out.text[-3000:]
        assert _finished(evaluator, watched) == 0, watched.text[-3000:]
    finally:
        kill_tree(trainer)
        kill_tree(evaluator)
    summary = _read(model_dir, "summary.json")
    assert summary["stopped"] == "early_stop" and summary["steps"] < 3000, summary
    assert "early stop at step" in out.text and "the side-car counts" in out.text
    assert "early stop verdict at step 12" in watched.text
    evaluated = [r["step"] for r in _rows(model_dir)]
    assert evaluated[:3] == [4, 8, 12] and evaluated[-1] == summary["steps"]
    kept = _read(model_dir, "best/best.json")["kept"]
    assert [e["step"] for e in kept] == [4, 8]
    assert sorted(os.listdir(os.path.join(model_dir, "best")))[:2] == [
        "best.json",
        "ckpt-4.data-00000-of-00001",
    ]
    assert summary["best"] == {"metric": "top5", "step": 4, "value": 1.0}
    state = _read(model_dir, "sidecar.json")
    assert state["step"] == summary["steps"] and state["evals_since_best"] >= 2
    # best/ckpt-4 is the trainer's checkpoint of step 4, as tfgpu.evaluate reads it.
    from tfgpu.cli.evaluate import evaluate

    result = evaluate(model_dir, checkpoint="best", log=lambda _: None)
    row = _rows(model_dir)[0]
    assert result["step"] == 4 and {k: result[k] for k in KEYS} == {k: row[k] for k in KEYS}


@pytest.mark.heavy  # ~90 s: 2 workers and the side-car; the 1-process case above stays
def test_two_workers_stop_together_on_the_side_cars_verdict(small_dataset, tmp_path):
    """The chief reads sidecar.json; both workers take its reading (a collective at every loop
    boundary) and stop at the same step with the same weights."""
    model_dir = str(tmp_path / "run")
    settings = dict(SIDECAR_RUN, train_steps=3000, checkpoint_every_steps=4, log_every_steps=20)
    settings.update(keep_best=2, best_metric="top5", early_stop_patience=2)
    flags = cli_flags(settings, data_dir=small_dataset, model_dir=model_dir)
    watcher_cmd = [sys.executable, "-m", "tfgpu.evaluate", f"--model_dir={model_dir}", "--watch"]
    watcher = popen([*watcher_cmd, "--watch_interval_s=0.3", "--watch_timeout_s=200"])
    watched = Output(watcher)
    launch = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--"]
    trainers = popen([*launch, "--strategy=multi_worker_mirrored", *flags])
    out = Output(trainers)
    try:
        assert _finished(trainers, out, timeout=400) == 0, out.text[-3000:]
        assert _finished(watcher, watched) == 0, watched.text[-3000:]
    finally:
        kill_tree(trainers)
        kill_tree(watcher)
    summary = _read(model_dir, "summary.json")
    assert summary["stopped"] == "early_stop" and summary["num_replicas"] == 2
    assert "[worker 0] early stop at step" in out.text
    ends = [line.split()[-1] for line in out.text.splitlines() if "/2 weights_sha256 " in line]
    assert ends == [summary["weights_sha256"]] * 2  # both workers, one step, the same weights
    assert _rows(model_dir)[-1]["step"] == summary["steps"]


@pytest.mark.fast
@pytest.mark.parametrize(
    "text",
    [
        "[4, 8]",
        "not json {",
        '{"step": "12", "evals_since_best": 3}',
        '{"step": 12, "evals_since_best": true}',
        '{"step": 12, "best_value": "0.9"}',
        '{"step": 12.5}',
    ],
)
def test_a_sidecar_file_that_is_not_the_side_cars_is_no_verdict(tmp_path, text):
    """The trainers read sidecar.json at every loop boundary: a file from elsewhere reads as no
    verdict (never a traceback in the trainer)."""
    from tfgpu.checkpoint.best import SIDECAR_FILE, read_sidecar

    (tmp_path / SIDECAR_FILE).write_text(text)
    assert read_sidecar(str(tmp_path)) == {}
    (tmp_path / SIDECAR_FILE).write_text('{"step": 12, "evals_since_best": 3, "best_value": 1}')
    assert read_sidecar(str(tmp_path))["evals_since_best"] == 3


@pytest.mark.fast
@pytest.mark.timeout(20)
def test_special_files_in_place_of_json_are_one_line_never_a_hang(tmp_path):
    from tfgpu.files import read_json
    from tfgpu.checkpoint.best import SIDECAR_FILE, read_sidecar

    os.mkfifo(tmp_path / SIDECAR_FILE)  # opening it to read would wait for a writer
    assert read_sidecar(str(tmp_path)) == {}
    os.mkdir(tmp_path / "dir.json")
    for path in (tmp_path / SIDECAR_FILE, tmp_path / "dir.json"):
        with pytest.raises(ValueError, match="is not readable JSON") as err:
            read_json(str(path))
        assert "\n" not in str(err.value) and str(path) in str(err.value)
