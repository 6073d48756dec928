"""The side-car evaluator: ``tfgpu-evaluate --model_dir=DIR --watch`` (and a TF_CONFIG
``evaluator`` task of ``tfgpu-train``) evaluates every checkpoint of a training run as it
appears, in step order, until the run's last, so that the trainers (``--sidecar_eval``) never
pause for evaluation. docs/evaluator.md is the user's page.

It writes what the loop's evaluation writes, with the loop's own code: the run's settings
(config.json, read by the command: same data, model, preprocessing), its network (an
``opened.Opened``: the model and optimizer built as the run built them, on one device, no
strategy: a TF_CONFIG cluster is never joined), the ``Evaluator`` (``inference.evaluate``), the
run's ``RunWriter`` (metrics.jsonl eval rows, TensorBoard ``eval/``, summary.csv) and
``checkpoint.best.Best`` (best/ and best/best.json; each best/ckpt-S holds the model, the
optimizer and the step of the trainer's checkpoint S, and the best so far). On one device its
numbers for a checkpoint are those of the loop's evaluation at that step, exactly.
``SIDECAR_FILE`` (sidecar.json) says what it has done: the last step evaluated and, when the
run keeps its best, the best so far and the evaluations since (what the trainers'
``actions.SidecarStop`` reads for --early_stop_patience; what a watcher started again goes on
from).

How it follows the run:

- config.json is waited for (a watcher may start before the trainer);
- a checkpoint is read only once the ``checkpoint`` index file names it (the trainer writes
  the index after the checkpoint's files), every one it names, in step order
  (``tf.train.checkpoints_iterator`` yields only the newest at each look, and knows neither
  the run's end nor a read that fails); a read that fails is tried again ``READ_TRIES``
  times, ``RETRY_S`` apart (its files may be being replaced), then skipped with a warning; one
  deleted (--keep_checkpoints) before it was read is named in a line and skipped;
- a trainer that restarts writes further checkpoints; steps already evaluated are not again;
- the run is over once summary.json, which the trainer's chief writes last (after its final
  checkpoint), is newer than config.json (which every start of the trainer writes again) and
  names a step already evaluated: then, with --sidecar_eval, summary.json gets the side-car's
  ``final_eval`` and ``best``, and ``watch`` returns;
- one watcher per run: a second one started on the same run stops in one line naming the
  first (``runlock.SIDECAR_LOCK_FILE``: two would write every result twice);
- ``timeout_s`` (--watch_timeout_s) bounds a wait with nothing new (config.json, a checkpoint
  or the end): past it, a CheckpointError naming the wait.
"""

import json
import os
import time

import tensorflow as tf

from tfgpu.checkpoint import network
from tfgpu.checkpoint.best import SIDECAR_FILE, Best, read_sidecar
from tfgpu.errors import CheckpointError, UsageError
from tfgpu.files import read_json, write_json
from tfgpu.inference import evaluate as evaluation
from tfgpu.results import runlock
from tfgpu.results.writer import RunWriter, eval_context, final_eval_of, timed

READ_TRIES = 5  # reads of one checkpoint before it is skipped
RETRY_S = 1.0  # seconds between them


class _Wait:
    """The watcher's waits: ``sleep(what)`` waits ``interval_s`` more, or raises a
    CheckpointError naming ``what`` once ``timeout_s`` have passed since ``progress()``."""

    def __init__(self, interval_s: float, timeout_s: float):
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.progress()

    def progress(self) -> None:
        self._since = time.monotonic()

    def sleep(self, what: str) -> None:
        waited = time.monotonic() - self._since
        if waited >= self.timeout_s:
            raise CheckpointError(
                f"--watch: waited {waited:.1f} s for {what} (--watch_timeout_s="
                f"{self.timeout_s:g}); the run has not ended (no summary.json newer than its "
                "config.json)"
            )
        time.sleep(max(min(self.interval_s, self.timeout_s - waited), 0.01))


def watch(
    model_dir: str, open_run, interval_s: float = 10.0, timeout_s: float = 3600.0, log=print
) -> int:
    """Follows the run in ``model_dir`` to its end, evaluating each of its checkpoints once
    (see the module docstring), looking every ``interval_s`` seconds; ``log(line)`` says what
    it does. ``open_run(model_dir)``: the run opened once its config.json is there (an
    ``opened.Opened``, its optimizer built: the learning rate of each row; no checkpoint
    read), by the command that reads config.json. Returns how many checkpoints it
    evaluated."""
    if not model_dir:
        raise UsageError("--watch needs --model_dir (the trainers')")
    model_dir = os.path.expanduser(model_dir)
    wait = _Wait(interval_s, timeout_s)
    while not os.path.exists(os.path.join(model_dir, "config.json")):
        wait.sleep(f"the run's config.json in {model_dir}")
    held = runlock.claim(model_dir, runlock.SIDECAR_LOCK_FILE)  # one watcher per run
    if held:
        raise UsageError(held)
    try:
        return _follow(Sidecar(open_run(model_dir), log), wait)
    finally:
        runlock.release(model_dir, runlock.SIDECAR_LOCK_FILE)


def _follow(sidecar: "Sidecar", wait: _Wait) -> int:
    """``watch``'s loop, once it holds the run's side-car lock."""
    while True:
        if sidecar.evaluate_new():
            wait.progress()
        elif run_over(sidecar.model_dir, sidecar.last):
            sidecar.finish()
            return sidecar.count
        else:
            wait.sleep(f"a new checkpoint in {sidecar.directory}")


class Sidecar:
    """What the watcher holds: the run (``trained``, an ``opened.Opened``: its network built
    once, its settings) with its Evaluator and RunWriter, the best (``best.Best``, when the
    run keeps it and evaluates by side-car), the last step evaluated and its result (from
    ``SIDECAR_FILE`` when it was started before)."""

    def __init__(self, trained, log):
        self.run, self._log, self.count = trained, log, 0
        self.t, self.model_dir = trained.train, trained.model_dir  # the run's train section
        self.evaluate = evaluation.of(self.run)
        self.writer = RunWriter(self.model_dir, is_chief=True)
        self.directory = os.path.join(self.model_dir, "checkpoints")
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False)  # best/'s step
        state = read_sidecar(self.model_dir)
        self.last, self.result = state.get("step", -1), state.get("result")
        self.best = self._best(state)
        t = self.t
        in_loop = t.eval_every_steps or t.eval_every_epochs
        also = " (it evaluates in its loop too: rows from both)" if in_loop else ""
        after = f"after step {self.last}" if self.last >= 0 else "from the first"
        log(
            f"watching {self.directory}{also}: {trained.model_settings.name} on "
            f"{self.run.spec.num_eval} "
            f"validation examples, checkpoints {after}"
        )

    def _best(self, state: dict):
        """The run's best.Best when the side-car keeps it (--sidecar_eval with --keep_best,
        --early_stop_patience or --best_metric), as ``state`` left it; else None."""
        t = self.t
        if not (t.sidecar_eval and t.tracks_best):
            return None
        best = Best(t, self.run.backend, self.model_dir)
        # best/ckpt-S holds what a use of the run reads of the trainer's checkpoint of S (the
        # model, the optimizer with its EMA, the step), and the best so far.
        net = self.run.network
        parts = dict(model=net.model, optimizer=net.optimizer, step=self._step)
        best.checkpoint = tf.train.Checkpoint(**parts, **best.tracked())
        if state.get("best_step") is not None:
            best.value.assign(state["best_value"])
            best.step.assign(state["best_step"])
            best.stale.assign(state["evals_since_best"])
        best.resume(self.last)
        return best

    def evaluate_new(self) -> int:
        """Evaluates, in step order, each checkpoint the index names past the last evaluated
        one; returns how many it took (evaluated or skipped)."""
        listed = listed_checkpoints(self.directory)
        new = sorted(s for s in listed if s > self.last)
        if new:
            self._say_missed(new)
        for step in new:
            self._one(step, listed[step])
        return len(new)

    def _say_missed(self, new: list) -> None:
        """A line naming the checkpoints (every --checkpoint_every_steps) that were deleted
        before this watcher saw them: it is slower than the trainer, which keeps
        --keep_checkpoints."""
        t = self.t
        missed = missed_steps(self.last, new, t.checkpoint_every_steps)
        if missed:
            steps = ", ".join(map(str, missed[:5])) + (", ..." if len(missed) > 5 else "")
            self._log(
                f"not evaluated: {len(missed)} checkpoint(s) deleted before they could be read "
                f"(steps {steps}; the trainer keeps --keep_checkpoints={t.keep_checkpoints}); "
                f"going on with step {new[0]}"
            )

    def _one(self, step: int, path: str) -> None:
        """Evaluates the checkpoint ``path`` of ``step`` as the loop's actions do (evaluate,
        then keep the best), then writes SIDECAR_FILE. A checkpoint that cannot be read is
        passed."""
        read = read_checkpoint(self.run.network, step, path, self.directory, self._log)
        if read is not None:
            result = self._evaluated(read)
            if self.best is not None and result:
                self._step.assign(read)
                if self.best.observe(read, result):
                    self.writer.info(f"best {self.best.metric} so far at step {read}")
                self._say_verdict(read)
            self.result, self.count = result or None, self.count + 1
        self.last = max(step, read or 0)
        self._write_state()

    def _evaluated(self, step: int) -> dict:
        """The evaluation of the checkpoint read, at ``step``, written as the loop's
        ``Evaluate`` action writes it (its row: the epoch, the learning rate and the
        trainer's images/s then)."""
        started = time.time()
        result = self.evaluate()
        seconds = time.time() - started
        ips = train_images_per_sec(self.model_dir, step)
        batch, num_train = self.t.global_batch_size, self.run.spec.num_train
        context = eval_context(batch, num_train, self.run.optimizer)(step, ips)
        self.writer.log_eval(step, timed(result, seconds), context)
        return result

    def _say_verdict(self, step: int) -> None:
        """A line when the trainers are told to stop (--early_stop_patience), once."""
        patience, stale = self.t.early_stop_patience, int(self.best.stale.numpy())
        if patience and stale == patience:
            self._log(
                f"early stop verdict at step {step}: {stale} evaluation(s) without a better "
                f"{self.best.metric} (the trainers stop at their next loop boundary)"
            )

    def _write_state(self) -> None:
        """SIDECAR_FILE: the last step evaluated, its result and the best bookkeeping."""
        state = {"step": self.last, "result": self.result}
        if self.best is not None:
            best = self.best.summary()
            state.update(metric=best["metric"], best_step=best["step"], best_value=best["value"])
            state["evals_since_best"] = int(self.best.stale.numpy())
        write_json(os.path.join(self.model_dir, SIDECAR_FILE), state)

    def finish(self) -> None:
        """At the run's end, with --sidecar_eval: summary.json's ``final_eval`` (the trainer
        has none) and ``best`` are the side-car's."""
        self._log(f"the run ended at step {self.last}: {self.count} checkpoint(s) evaluated")
        if not self.t.sidecar_eval:
            return
        summary = read_json(os.path.join(self.model_dir, "summary.json"))
        if self.result and summary.get("steps") == self.last:
            summary["final_eval"] = final_eval_of(self.result)
        if self.best is not None:
            summary["best"] = self.best.summary()
        self.writer.write_summary(summary)


def listed_checkpoints(directory: str) -> dict:
    """{step: checkpoint path} of what ``directory``'s ``checkpoint`` index file names now (by
    name in this folder: the paths in it are where the trainer wrote them)."""
    try:
        state = tf.train.get_checkpoint_state(directory)
    except tf.errors.OpError:
        return {}  # not readable now (it is replaced atomically): the next look
    listed = {}
    for path in state.all_model_checkpoint_paths if state else ():
        name = os.path.basename(path)
        if name.rpartition("-")[2].isdigit():
            listed[int(name.rpartition("-")[2])] = os.path.join(directory, name)
    return listed


def read_checkpoint(net, step: int, path: str, directory: str, log) -> int | None:
    """Reads checkpoint ``path`` of ``step`` (one of ``directory``'s) into ``net``, the run's
    network (``network.restore``); returns its step, or None when it was deleted meanwhile or
    still does not read after READ_TRIES tries, RETRY_S apart (``log(line)`` says which)."""
    name = os.path.basename(path)
    for attempt in range(1, READ_TRIES + 1):
        try:
            return network.restore(net, path)
        except CheckpointError as err:
            if step not in listed_checkpoints(directory):
                log(f"not evaluated: {name} was deleted before it could be read")
                return None
            if attempt < READ_TRIES:
                log(f"{name}: read failed, retry {attempt} in {RETRY_S:g} s ({err})")
                time.sleep(RETRY_S)
    log(f"tfgpu: WARNING: not evaluated: {name} does not read after {READ_TRIES} tries")
    return None


def run_over(model_dir: str, last: int) -> bool:
    """True once the trainer of the run in ``model_dir`` has ended (summary.json, its last
    file, newer than its config.json) at a step up to ``last``, the last one evaluated."""
    paths = [os.path.join(model_dir, f) for f in ("summary.json", "config.json")]
    try:
        summary_ns, config_ns = (os.stat(p).st_mtime_ns for p in paths)
    except FileNotFoundError:
        return False
    steps = read_json(paths[0]).get("steps") if summary_ns >= config_ns else None
    return steps is not None and steps <= last


def missed_steps(last: int, new: list, every: int) -> list:
    """The steps after ``last`` at which a checkpoint was due (every ``every``) but is not
    among ``new`` (sorted): deleted before a watcher slower than the trainer saw them."""
    expected = range((max(last, 0) // every + 1) * every, new[-1], every)
    return [s for s in expected if s not in new]


def train_images_per_sec(model_dir: str, step: int) -> float | None:
    """What summary.csv puts beside an evaluation at ``step``: the train images/s of the
    trainer's last logged window at or before it (metrics.jsonl), as the loop's evaluation."""
    ips = None
    try:
        with open(os.path.join(model_dir, "metrics.jsonl"), encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a line the trainer is appending
                if row.get("split") == "train" and row.get("step", step + 1) <= step:
                    ips = row.get("images_per_sec")
    except FileNotFoundError:
        pass
    return ips
