"""The chaos loop of tests/e2e/test_chaos.py and bench/chaos_soak.py: a real run SIGKILLed at
random and at chosen moments, and started again with the same command until it finishes;
then what it left is held to the same command run uninterrupted.

A moment is one of:

- ``time``: a random time after the start (start-up, tracing, an update, a write: anything);
- ``startup``: a random time before the uninterrupted run began tracing;
- ``tracing``: a random delay (0-2 s) after the chief says it traces the train step;
- ``update``: 0-0.3 s after a drawn progress line of the attempt (mid-update, or the
  final evaluation, save and export after the last line);
- a write, through tfgpu's test-only pause (``tfgpu.files.TEST_PAUSE_ENV``): the N-th
  ``checkpoint`` (files written, index not yet), ``best``, ``metrics.jsonl`` or ``summary.csv``
  (half a row written), ``export`` (model.keras written, the SavedModel not yet); the kill
  comes once the process says it paused there;
- ``checkpoint-temp``: as soon as TensorFlow's temporary files of a checkpoint appear (the
  model dir polled every few ms; when the write is faster than that, the run goes on).

The kill takes every process of the job, or one (a multi-process job: the others must then
stop on their own, each with one line). Every choice comes from one seed, printed with every
kill; ``TFGPU_CHAOS_SEED`` replays a run's choices (not its timing, which the machine sets).
"""

import dataclasses
import json
import os
import random
import re
import signal
import sys
import time

import numpy as np
import psutil
from conftest import cli_flags, final_weights
from procs import Output, kill_tree, popen
from weights import named as named_weights

from tfgpu.cli import launch

SEED_ENV = "TFGPU_CHAOS_SEED"
PAUSE_POINTS = ("checkpoint", "best", "metrics.jsonl", "summary.csv", "export")
OTHERS_STOP_S = 120  # after one worker is killed, the others stop on their own within this
RUN_S = 600  # a bound on one attempt (a hang is a failure, not a wait)
# Rows compared with the uninterrupted run's: everything but the clock.
COMPARED = ("step", "split", "loss", "accuracy", "learning_rate", "grad_norm", "weight_norm")
COMPARED += ("top1", "top5", "skipped_updates", "clipped_updates", "epoch")


# Short deterministic runs: a checkpoint every 4 updates, a logged window every 2 (so windows
# start where a resumed run starts), no logging by the clock, no input probe.
TINY = dict(
    model="tiny_cnn",
    image_size=32,
    global_batch_size=16,
    train_steps=20,
    optimizer="adam",
    learning_rate=0.001,
    deterministic=True,
    seed=7,
    steps_per_loop=2,
    log_every_steps=2,
    log_every_s=10**6,
    checkpoint_every_steps=4,
    eval_every_steps=8,
    input_probe_s=0,
    export=False,
)
# BatchNorm, an EMA of the weights, the 2 best kept and the export: resnet20 at 16 px,
# evaluated at 4 and 8 (the end).
BATCHNORM = dict(
    TINY,
    model="resnet20",
    image_size=16,
    global_batch_size=8,
    train_steps=8,
    optimizer="sgd",
    learning_rate=0.05,
    ema_decay=0.9,
    eval_every_steps=4,
    keep_best=2,
    checkpoint_every_steps=2,
    export=True,
)


def jobs(data_dir: str) -> dict:
    """The jobs the chaos loop runs, by name, on the dataset in ``data_dir``."""
    tiny, batchnorm = cli_flags(TINY, data_dir=data_dir), cli_flags(BATCHNORM, data_dir=data_dir)
    return {
        "single": Job("tiny_cnn, 1 process", "single", tiny),
        "batchnorm": Job("resnet20 + EMA + keep_best + export", "single", batchnorm),
        "mwms": Job("tiny_cnn, 2 workers", "mwms", tiny),
        "horovod": Job("tiny_cnn, 2 Horovod ranks", "horovod", tiny),
    }


def chaos_seed() -> int:
    """TFGPU_CHAOS_SEED, or a fresh seed (printed by the caller)."""
    return int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(10**6))


@dataclasses.dataclass
class Job:
    """How to start one attempt of a run: ``kind`` is "single", "mwms" (2 workers, each
    started with its TF_CONFIG), "launch" (the same 2 workers under ``tfgpu-launch
    --num_workers=2``: one output, each line prefixed ``[worker i]``; a pause's "one" kill takes
    either worker) or "horovod" (``tfgpu-horovodrun --gloo -np 2``); ``flags`` its tfgpu flags
    but --model_dir (--train_steps and --log_every_steps among them)."""

    name: str
    kind: str
    flags: list

    @property
    def workers(self) -> int:
        return 1 if self.kind == "single" else 2

    @property
    def kinds(self) -> list:
        """The moments that can come in this job's runs (best/ and the export need theirs)."""
        has = {
            "best": any(f.startswith("--keep_best=") and f != "--keep_best=0" for f in self.flags),
            "export": "--export" in self.flags,
        }
        return [k for k in KINDS if has.get(k, True)]

    def flag(self, name: str) -> int:
        return int(next(f.split("=")[1] for f in self.flags if f.startswith(f"--{name}=")))

    def start(self, model_dir: str, env: dict) -> list:
        """The processes of one attempt (for horovod: horovodrun, whose ranks it starts)."""
        flags = [*self.flags, f"--model_dir={model_dir}"]
        main = [sys.executable, "-m", "tfgpu.main"]
        if self.kind == "single":
            return [popen([*main, "--strategy=default", *flags], env)]
        if self.kind == "mwms":
            configs = launch.tf_configs(2)
            cmd = [*main, "--strategy=multi_worker_mirrored", *flags]
            return [popen(cmd, dict(env, TF_CONFIG=c)) for c in configs]
        if self.kind == "launch":
            launcher = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--"]
            return [popen([*launcher, "--strategy=multi_worker_mirrored", *flags], env)]
        # tfgpu-horovodrun: horovodrun, with one line for a failed rank instead of a traceback.
        hvdrun = [sys.executable, "-m", "tfgpu.distribute.hvdrun"]
        cmd = [*hvdrun, "--gloo", "-np", "2", "-H", "localhost:2", *main]
        return [popen([*cmd, "--strategy=horovod", *flags], env)]


KINDS = ("startup", "tracing", "update", "time", "checkpoint-temp", *PAUSE_POINTS)


@dataclasses.dataclass
class Moment:
    """When to kill (see the module docstring) and whom: "all", or "one" process. ``value``:
    seconds (startup, tracing, time), a fraction of the progress lines still to come (update)
    or the N-th write (a pause point)."""

    kind: str
    value: float = 0.0
    whom: str = "all"
    delay: float = 0.0  # update: seconds after the progress line
    line: int = 0  # update: the progress line of the attempt, once it started (1: its first)

    def __str__(self) -> str:
        if self.kind in ("startup", "time"):
            what = f"{self.value:.1f} s after the start"
        elif self.kind == "tracing":
            what = f"{self.value:.1f} s into tracing"
        elif self.kind == "update":
            what = f"{self.delay:.2f} s after the attempt's progress line {self.line}"
        elif self.kind == "checkpoint-temp":
            what = "while a checkpoint's temporary files exist"
        else:
            what = f"in write {int(self.value)} of {self.kind}"
        return f"{self.kind}: {what}, {self.whom}"


@dataclasses.dataclass
class Attempt:
    """One start of the job: how it ended, its output, and the kill (``moment`` None: it
    finished on its own)."""

    moment: Moment | None
    code: int | None
    text: str
    killed_at_s: float = 0.0
    newest_checkpoint: int = 0  # the index's newest step once it ended
    seconds: float = 0.0  # from its start to its end
    traced_s: float = 0.0  # from its start to the chief's "tracing the train step" (0: never)


def draw(rng: random.Random, kind: str, whom: str = "", *, job: Job, whole: Attempt) -> Moment:
    """A moment of ``kind`` with its random part drawn (``whole``: the uninterrupted run's
    attempt, for its times; ``whom``: "" draws it, for a multi-process job)."""
    whom = whom or ("all" if job.workers == 1 else rng.choice(["all", "one"]))
    if kind == "startup":
        return Moment(kind, rng.uniform(0.5, whole.traced_s), whom)
    if kind == "time":
        return Moment(kind, rng.uniform(0.5, whole.seconds), whom)
    if kind == "tracing":
        return Moment(kind, rng.uniform(0.0, 2.0), whom)
    if kind == "update":
        return Moment(kind, rng.random(), whom, delay=rng.uniform(0.0, 0.3))
    nth = {"checkpoint": 3, "best": 2, "metrics.jsonl": 6, "summary.csv": 2, "export": 1}
    return Moment(kind, rng.randint(1, nth.get(kind, 1)), whom)


def newest_checkpoint(model_dir: str) -> int:
    """The step of the newest checkpoint its index lists (0: none), read as TensorFlow does."""
    try:
        with open(os.path.join(model_dir, "checkpoints", "checkpoint"), encoding="utf-8") as f:
            found = re.search(r'^model_checkpoint_path: ".*-(\d+)"', f.read(), re.M)
    except FileNotFoundError:
        return 0
    return int(found.group(1)) if found else 0


def _temp_files(model_dir: str) -> bool:
    """True while TensorFlow writes a checkpoint (its ``*_temp`` folder or files)."""
    try:
        return any("_temp" in n for n in os.listdir(os.path.join(model_dir, "checkpoints")))
    except FileNotFoundError:
        return False


class _Watch:
    """What one attempt has shown so far, and whether its moment has come."""

    def __init__(self, moment: Moment | None, outputs, model_dir: str, remaining_lines: int):
        self.moment, self.outputs, self.model_dir = moment, outputs, model_dir
        self.started, self.traced, self.progress_at = time.time(), 0.0, 0.0
        if moment is not None and moment.kind == "update":
            moment.line = 1 + int(moment.value * max(remaining_lines, 1))

    def due(self) -> bool:
        now, m, chief = time.time(), self.moment, self.outputs[0].text
        if not self.traced and "tracing the train step" in chief:
            self.traced = now
        if m is None:
            return False
        if m.kind in ("startup", "time"):
            return now - self.started >= m.value
        if m.kind == "tracing":
            return bool(self.traced) and now - self.traced >= m.value
        if m.kind == "update":
            if not self.progress_at and len(PROGRESS.findall(chief)) >= m.line:
                self.progress_at = now
            return bool(self.progress_at) and now - self.progress_at >= m.delay
        if m.kind == "checkpoint-temp":
            return _temp_files(self.model_dir)
        return any(f"tfgpu-test: paused in {m.kind}" in o.text for o in self.outputs)


PROGRESS = re.compile(r"step +\d+/\d+ +loss")  # a progress line, also behind a rank prefix


def _pythons(proc) -> list:
    """The tfgpu processes of ``proc``: itself, for tfgpu-launch its workers, or for
    horovodrun its ranks."""
    if "tfgpu.launch" in proc.args:
        children = sorted(psutil.Process(proc.pid).children(), key=lambda c: c.pid)
        return [c for c in children if "tfgpu.main" in " ".join(c.cmdline())]
    if "tfgpu.distribute.hvdrun" not in proc.args:
        return [psutil.Process(proc.pid)]
    ranks = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            # Not the signal guardian each rank forks (tfgpu.train.signals): its child.
            parent = " ".join(child.parent().cmdline())
            if "tfgpu.main" in " ".join(child.cmdline()) and "tfgpu.main" not in parent:
                ranks.append(child)
        except psutil.Error:
            continue
    return ranks


def _kill(procs, outputs, moment: Moment, rng: random.Random) -> None:
    """SIGKILLs the tfgpu processes ``moment`` names: all of them, or one: for a pause, the
    one that paused (it sits in the write), else one drawn at random."""
    groups = [_pythons(proc) for proc in procs]
    targets = [p for group in groups for p in group]
    if moment.whom == "one":
        paused = [i for i, o in enumerate(outputs) if "tfgpu-test: paused" in o.text]
        group = groups[paused[0]] if paused else targets
        targets = [rng.choice(group)] if group else []
    for target in targets:
        try:
            target.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass


def attempt(job: Job, model_dir: str, moment: Moment | None, rng: random.Random) -> Attempt:
    """Starts the job once; kills it at ``moment`` (None: lets it finish). Returns how the
    attempt ended, with every process's output (each line prefixed with its index)."""
    env, steps_left = dict(os.environ), job.flag("train_steps") - newest_checkpoint(model_dir)
    if moment is not None and moment.kind == "checkpoint":
        # A write past the attempt's last (one per --checkpoint_every_steps) would never come:
        # the attempt would finish, ending the chaos run with the kinds after it unkilled.
        writes_left = -(-steps_left // job.flag("checkpoint_every_steps"))
        moment.value = min(moment.value, max(1, writes_left))
    if moment is not None and moment.kind in PAUSE_POINTS:
        env.update(TFGPU_TEST_PAUSE=f"{moment.kind}@{int(moment.value)}", TFGPU_TEST_PAUSE_S="120")
    remaining = steps_left // job.flag("log_every_steps")
    procs = job.start(model_dir, env)
    outputs = [Output(p) for p in procs]
    watch, killed_at = _Watch(moment, outputs, model_dir, remaining), 0.0
    poll_s = 0.005 if moment and moment.kind == "checkpoint-temp" else 0.05
    try:
        while any(p.poll() is None for p in procs):
            if not killed_at and watch.due():
                _kill(procs, outputs, moment, rng)
                killed_at = time.time() - watch.started
            limit = killed_at + OTHERS_STOP_S if killed_at else RUN_S
            assert time.time() - watch.started < limit, _tail(outputs)
            time.sleep(poll_s)
    finally:
        for p in procs:
            kill_tree(p)
    text = "".join(
        "".join(f"[{i}] {line}" for line in o.drained(10).splitlines(True))
        for i, o in enumerate(outputs)
    )
    codes = [p.returncode for p in procs]
    code = 0 if all(c == 0 for c in codes) else next(c for c in codes if c != 0)
    ended, traced = time.time() - watch.started, watch.traced and watch.traced - watch.started
    newest = newest_checkpoint(model_dir)
    return Attempt(moment if killed_at else None, code, text, killed_at, newest, ended, traced)


def _tail(outputs) -> str:
    return "\n".join(o.text[-2000:] for o in outputs)


def check_attempt(a: Attempt, before: int) -> None:
    """What every attempt must show: no traceback, no damaged checkpoint, no refusal; once it
    trained, the resume from the newest checkpoint there was (``before``: its step, 0: none);
    after one process was killed, at most one error line from each other one (the peer it
    lost); a finished attempt exits 0."""
    assert "Traceback" not in a.text, a.text[-4000:]
    for bad in ("does not read back", "damaged", "in use by another run", "contradicts"):
        assert bad not in a.text, a.text[-4000:]
    if before and ("tracing the train step" in a.text or a.moment is None):
        resumed = re.findall(r"resumed from \S+-\d+ at step (\d+)", a.text)
        assert resumed and {int(s) for s in resumed} == {before}, (before, a.text[-4000:])
    errors = re.findall(r"^\[(\d)\] .*tfgpu: error: ", a.text, re.M)
    if a.moment is None:
        assert a.code == 0 and not errors, a.text[-4000:]
    elif a.moment.whom == "all":
        assert not errors, a.text[-4000:]
    else:
        assert all(errors.count(i) <= 1 for i in set(errors)), a.text[-4000:]


def run_until_done(job, model_dir, moments, rng, log=print) -> list:
    """Kills the job at each of ``moments`` in turn, starting it again after each, then lets
    it finish; checks every attempt. Returns the attempts."""
    attempts = []
    for moment in [*moments, None]:
        before = newest_checkpoint(model_dir)
        a = attempt(job, model_dir, moment, rng)
        check_attempt(a, before)
        attempts.append(a)
        if a.moment is not None:
            log(
                f"{job.name}: attempt {len(attempts)} killed {a.moment} (at {a.killed_at_s:.1f}"
                f" s; exit {a.code}; newest checkpoint then: step {a.newest_checkpoint})"
            )
        elif moment is not None:
            log(f"{job.name}: attempt {len(attempts)} finished before {moment}")
        if a.moment is None and a.code == 0:
            break
    assert attempts[-1].moment is None and attempts[-1].code == 0
    return attempts


def chaos_run(job: Job, model_dir: str, reference: tuple, kinds: list, rng, log=print):
    """The job killed at a moment of each of ``kinds`` in turn (a kind, or "kind:whom": "all"
    or "one" of its processes) until it finishes in ``model_dir``; ``reference``: (the folder
    of its uninterrupted run, that run's ``Attempt``: ``run_until_done`` with no moments).
    Returns (the attempts, ``lost_bytes`` against the uninterrupted run)."""
    reference_dir, whole = reference
    moments = [draw(rng, *kind.split(":"), job=job, whole=whole) for kind in kinds]
    attempts = run_until_done(job, model_dir, moments, rng, log)
    return attempts, lost_bytes(model_dir, reference_dir)


def rows(model_dir: str, name: str) -> list:
    """metrics.jsonl's records or summary.csv's rows, each as a dict of COMPARED fields
    (summary.csv's values as text); every line must be whole."""
    path = os.path.join(model_dir, name)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.endswith("\n"), f"{name} ends in a torn line"
    if name.endswith(".jsonl"):
        records = [json.loads(line) for line in text.splitlines()]
    else:
        lines = text.splitlines()
        header = lines[0].split(",")
        records = [dict(zip(header, line.split(","))) for line in lines[1:]]
    return [{k: r[k] for k in COMPARED if k in r} for r in records]


def lost_bytes(model_dir: str, reference_dir: str) -> dict:
    """What the chaos run holds that the uninterrupted one does not, or lacks, in bytes:
    "weights" (final.weights.h5's array elements that differ), "metrics.jsonl" and
    "summary.csv" (rows missing, extra or duplicated, as JSON), and where the run has them,
    "export" (export/model.keras' array elements that differ) and "best" (best/best.json's
    kept list and best/'s files that differ, as JSON)."""
    lost = {"weights": _differing_bytes(final_weights(model_dir), final_weights(reference_dir))}
    for name in ("metrics.jsonl", "summary.csv"):
        mine, theirs = rows(model_dir, name), rows(reference_dir, name)
        wrong = [r for r in theirs if r not in mine] + [r for r in mine if r not in theirs]
        lost[name] = sum(len(json.dumps(r)) for r in wrong + _duplicates(mine))
    if os.path.exists(os.path.join(reference_dir, "export", "model.keras")):
        lost["export"] = _differing_bytes(_keras_arrays(model_dir), _keras_arrays(reference_dir))
    if os.path.exists(os.path.join(reference_dir, "best", "best.json")):
        mine, theirs = _best(model_dir), _best(reference_dir)
        lost["best"] = 0 if mine == theirs else len(json.dumps(mine)) + len(json.dumps(theirs))
    return lost


def _duplicates(records: list) -> list:
    seen, twice = set(), []
    for r in records:
        key = (r.get("step"), r.get("split"))
        if key in seen:
            twice.append(r)
        seen.add(key)
    return twice


def _differing_bytes(mine: dict, theirs: dict) -> int:
    """Bytes of ``theirs`` (named arrays) that ``mine`` lacks or holds otherwise: a weight
    missing or of another shape counts whole; one that ``mine`` has in excess, its bytes."""
    extra = sum(a.nbytes for name, a in mine.items() if name not in theirs)
    return extra + sum(
        int(np.sum(mine[name] != b)) * b.itemsize
        if name in mine and mine[name].shape == b.shape
        else b.nbytes
        for name, b in theirs.items()
    )


def _keras_arrays(model_dir: str) -> dict:
    """The named arrays of export/model.keras (a zip holding model.weights.h5)."""
    import io
    import zipfile

    with zipfile.ZipFile(os.path.join(model_dir, "export", "model.keras")) as z:
        return named_weights(io.BytesIO(z.read("model.weights.h5")))


def _best(model_dir: str) -> dict:
    """best.json's kept list (checkpoint names, not paths) and the files of best/."""
    folder = os.path.join(model_dir, "best")
    with open(os.path.join(folder, "best.json"), encoding="utf-8") as f:
        kept = json.load(f)["kept"]
    for entry in kept:
        entry["checkpoint"] = os.path.basename(entry["checkpoint"])
    return {"kept": kept, "files": sorted(os.listdir(folder))}
