"""What the outer loop does between its compiled calls: each periodic action is one small
object, and ``train.fit`` only trains until the next step some action is due, then asks each.

An action has ``every`` (updates between calls; 0: none by step, e.g. preemption, which is
asked after every loop call) and ``__call__(state)``, which returns nothing or raises to end
the run. ``due(state)`` decides (default: at multiples of ``every``), and ``next_stop(step)``
says where the loop must stop for it next (default: the next multiple of ``every``; a one-off
window such as the profiler's names its own steps). A new built-in action is one more class
here and one more line in ``default_actions``; a run's own actions need neither:
``train.run(config, actions=[MyAction()])``, asked after the built-in ones (before the
preemption checkpoint), as Keras' ``fit(callbacks=...)``.

At a step where several are due they run in the order of ``default_actions``, and it matters:

0. **profile** (--profile_steps=A:B) first: at B it stops the trace before anything else the
   step owes, so the trace holds updates A..B and no log, evaluation or checkpoint; it starts
   at the boundary after update A-1, where it also runs first (an action due at A-1 as well is
   then traced too: pick A-1 off the --log/eval/checkpoint multiples for a clean trace);
1. **log** closes the logging window first, so that its images/s and input wait cover training
   only, not the evaluation or checkpoint that follow;
2. **evaluate** next, so that whatever is written after it (a best checkpoint, an early stop,
   a checkpoint) can see this step's result, which it leaves in ``LoopState.evaluation``;
3. **best** (--keep_best, --early_stop_patience, --export_best) takes that result: the best
   value so far (a variable in the checkpoint) and a best checkpoint when it is among the K;
4. **early stop** after N evaluations without a better one: it ends the loop (not the run:
   ``train.run`` then saves, evaluates and exports as at the end). An action with
   ``at_start`` is also asked before the first update, so that a resumed run which had
   stopped early stops again instead of training on. With --sidecar_eval the count is the
   side-car evaluator's, read from the file it writes (``SidecarStop``);
5. **checkpoint** after those: a checkpoint of step S holds everything step S knew;
6. **unfreeze** (--unfreeze_after_steps) after those: it changes what the next updates
   train, nothing this step owed;
7. **preemption** last: when a signal came, the checkpoint it needs is written after
   everything else this step owed, and the run stops with all of it on disk.

Actions at the last step are left to ``train.run`` (final checkpoint, evaluation, export),
except the log, which closes the last window.
"""

import json
import os
import time
from dataclasses import dataclass, field

from tfgpu.checkpoint.best import SIDECAR_FILE, read_sidecar
from tfgpu.distribute import consensus, heartbeats
from tfgpu.errors import Preempted
from tfgpu.optim import finetune
from tfgpu.results.writer import INPUT_BOUND, RunWriter, Window, input_bound_warning, timed
from tfgpu.train import signals
from tfgpu.train.config import profile_window


@dataclass
class LoopState:
    """What the loop has done so far, shared by the actions."""

    writer: RunWriter
    step: int
    plan: object  # build.Plan: the run's numbers (its last update, its batch split)
    window: Window = field(default_factory=Window)
    skipped_records: int = 0  # broken images (weight 0) in the updates so far
    input_ips: float | None = None  # images/s of the input alone (readers.probe)
    waited: float = 0.0  # seconds in all-reduces until the last closed window
    evaluation: tuple | None = None  # (step, result) of the newest evaluation
    stopped: str = ""  # why the loop ended before the plan's last step ("early_stop")
    images_per_sec: float | None = None  # train images/s of the last window logged

    @property
    def last(self) -> bool:
        return self.step >= self.plan.total_steps


class Action:
    """Base: due at multiples of ``every``, never at the last step (``train.run`` owns it)."""

    every = 0
    at_start = False  # also asked once before the first update

    def due(self, state: LoopState) -> bool:
        return bool(self.every) and state.step % self.every == 0 and not state.last

    def next_stop(self, step: int) -> int | None:
        """The next step after ``step`` where the loop must stop for this action (None:
        none by step count)."""
        return (step // self.every + 1) * self.every if self.every else None

    def __call__(self, state: LoopState) -> None:
        raise NotImplementedError


def phase(name: str, step: int) -> None:
    """Where the run is, for the signal watcher and the heartbeat board."""
    signals.set_phase(name, step)
    heartbeats.set_phase(name)


class Profile(Action):
    """--profile_steps=A:B: a TensorBoard profiler trace (``tf.profiler.experimental``) of
    updates A..B, from the loop boundary after update A-1 to the one after update B (or the
    last), into ``logdir``. A run resumed past A-1 does not trace."""

    def __init__(self, first: int, last: int, logdir: str):
        self.first, self.last, self.logdir = first, last, logdir
        self._tracing = self._done = False

    def next_stop(self, step: int) -> int | None:
        return next((s for s in (self.first - 1, self.last) if s > step), None)

    def due(self, state: LoopState) -> bool:
        if self._tracing:
            return state.step >= self.last or state.last
        return not self._done and state.step == self.first - 1

    def __call__(self, state: LoopState) -> None:
        import tensorflow as tf  # noqa: PLC0415 (the profiler, only when asked)

        if not self._tracing:
            tf.profiler.experimental.start(self.logdir)
            self._tracing = True
            return
        tf.profiler.experimental.stop()
        self._tracing, self._done = False, True
        state.writer.info(
            f"profile of updates {self.first}..{state.step} written under {self.logdir}: "
            f"tensorboard --logdir {self.logdir}, Profile tab"
        )


class LogWindow(Action):
    """Closes the logging window: metrics.jsonl, TensorBoard and the progress line, every
    --log_every_steps, at the last step, and (one process) after --log_every_s without a line;
    warns once when the step waited for input more than INPUT_BOUND of the time."""

    def __init__(self, t, backend, optimizer, clips: bool, deterministic: bool):
        """``t``: the train section (--log_every_*, the global batch); ``optimizer``: whose
        learning rate each line gives; ``clips``: --clip_norm is set (the line counts the
        clipped updates); ``deterministic``: the run is (no skew across workers measured)."""
        self.every, self.every_s, self._warned = t.log_every_steps, t.log_every_s, False
        self._batch, self._backend, self._optimizer = t.global_batch_size, backend, optimizer
        self._clips, self._skews = clips, backend.num_workers > 1 and not deterministic

    def due(self, state: LoopState) -> bool:
        by_time = self._backend.num_workers == 1 and state.window.age() >= self.every_s
        return state.step % self.every == 0 or state.last or by_time

    def __call__(self, state: LoopState) -> None:
        lr = float(self._optimizer.learning_rate)  # the schedule at the current update
        record = state.window.close(state.step, lr, self._batch)
        if not self._clips:
            record.pop("clipped_updates", None)
        if state.input_ips:
            record["input_images_per_sec"] = state.input_ips
        if self._skews:
            record.update(self._skew(state))
        state.writer.log_train(record, state.plan.total_steps, self._batch)
        state.images_per_sec = record["images_per_sec"]
        wait = record["input_wait_fraction"]
        if not self._warned and wait > INPUT_BOUND and state.window.timed:
            self._warned = True
            ips = record["images_per_sec"]
            state.writer.info(input_bound_warning(wait, ips, state.input_ips))

    def _skew(self, state: LoopState) -> dict:
        """The slowest worker's compute seconds per update in the window just closed, and
        the median's (``consensus.step_time_skew``)."""
        backend, window = self._backend, state.window
        waited = float(backend.wait_seconds.numpy())
        compute = (window.last_seconds - (waited - state.waited)) / max(window.last_updates, 1)
        state.waited = waited
        return consensus.step_time_skew(backend, compute)


class Evaluate(Action):
    """Evaluates on the validation split every ``every`` updates (--eval_every_*)."""

    def __init__(self, every: int, evaluate, context):
        """``evaluate()``: the run's evaluation; ``context(step, images_per_sec)``: what
        summary.csv puts next to it (``results.writer.eval_context``)."""
        self.every, self._evaluate, self._context = every, evaluate, context

    def __call__(self, state: LoopState) -> None:
        phase("evaluation", state.step)
        started = time.time()
        result = self._evaluate()
        seconds = time.time() - started
        state.window.pause("evaluation", seconds)
        context = self._context(state.step, state.images_per_sec)
        state.writer.log_eval(state.step, timed(result, seconds), context)
        state.evaluation = (state.step, result) if result else None


def _evaluated_now(state: LoopState) -> bool:
    return state.evaluation is not None and state.evaluation[0] == state.step


class KeepBest(Action):
    """Gives this step's evaluation to ``best.Best``: the best value so far, the evaluations
    since it improved, and (--keep_best) the K best checkpoints in model_dir/best/."""

    def __init__(self, best):
        self._best = best

    def due(self, state: LoopState) -> bool:
        return _evaluated_now(state) and not state.last

    def __call__(self, state: LoopState) -> None:
        phase("best checkpoint", state.step)
        started = time.time()
        better = self._best.observe(*state.evaluation)
        state.window.pause("checkpoint", time.time() - started)
        if better:
            state.writer.info(f"best {self._best.metric} so far at step {state.step}")


class EarlyStop(Action):
    """Ends the loop after --early_stop_patience evaluations without a better one."""

    at_start = True

    def __init__(self, patience: int, best):
        self._patience, self._best = patience, best

    def due(self, state: LoopState) -> bool:
        return not state.last and int(self._best.stale.numpy()) >= self._patience

    def __call__(self, state: LoopState) -> None:
        state.stopped = "early_stop"
        state.writer.info(
            f"early stop at step {state.step}: {self._patience} evaluation(s) without a better "
            f"{self._best.metric} than step {int(self._best.step.numpy())}'s"
        )


class SidecarStop(Action):
    """--sidecar_eval with --early_stop_patience: ends the loop once the side-car evaluator
    (``inference.sidecar``) has counted N evaluations without a better one (``best.SIDECAR_FILE``).
    Only the chief reads the file, at every loop boundary; every worker takes the chief's
    reading (``all_gather_bytes``, as a resumed run's kept list), so all stop at the same
    step. Asked at the start too: a run stopped so and started again stops again at once."""

    at_start = True

    def __init__(self, patience: int, model_dir: str, backend):
        self._patience, self._model_dir, self._backend = patience, model_dir, backend
        self._verdict: dict = {}

    def due(self, state: LoopState) -> bool:
        if state.last:
            return False
        backend = self._backend
        blob = json.dumps(read_sidecar(self._model_dir) if backend.is_chief else {})
        self._verdict = v = json.loads(backend.all_gather_bytes(blob.encode())[0])
        # Not a verdict on checkpoints beyond this step (the run went back to an older one).
        return v.get("step", 0) <= state.step and v.get("evals_since_best", 0) >= self._patience

    def __call__(self, state: LoopState) -> None:
        state.stopped = "early_stop"
        v = self._verdict
        state.writer.info(
            f"early stop at step {state.step}: the side-car counts {v['evals_since_best']} "
            f"evaluation(s) without a better {v.get('metric')} than step {v.get('best_step')}'s "
            f"(its evaluation of step {v.get('step')}, {SIDECAR_FILE})"
        )


class SaveCheckpoint(Action):
    """Writes a checkpoint every --checkpoint_every_steps."""

    def __init__(self, every: int, checkpoints):
        self.every, self._checkpoints = every, checkpoints

    def __call__(self, state: LoopState) -> None:
        phase("checkpoint save", state.step)
        started = time.time()
        self._checkpoints.save()
        state.window.pause("checkpoint", time.time() - started)


class Unfreeze(Action):
    """--unfreeze_after_steps=N: at the boundary after update N the backbone becomes trainable
    (``finetune.unfreeze``); asked at the start too, so that a run resumed past N trains it
    from its first update (which layers train is not in the checkpoint: it follows the step)."""

    at_start = True

    def __init__(self, after: int, model, m, step):
        """``model``: the run's, built for ``m`` (its models.config.ModelConfig); ``step``:
        its TrainStep, which follows."""
        self.after, self._model, self._m, self._step = after, model, m, step
        self._done = False

    def next_stop(self, step: int) -> int | None:
        return self.after if step < self.after else None

    def due(self, state: LoopState) -> bool:
        return not self._done and state.step >= self.after and not state.last

    def __call__(self, state: LoopState) -> None:
        finetune.unfreeze(self._model, self._m, self._step)
        self._done = True
        state.writer.info(
            f"step {state.step}: backbone unfrozen (its BatchNorm back in training mode); "
            "every layer trains from the next update on"
        )


class StopOnPreemption(Action):
    """After every loop call: when SIGTERM/SIGINT came (on any worker), saves a checkpoint
    and raises Preempted."""

    def __init__(self, guard, checkpoints, backend):
        self._guard, self._checkpoints, self._backend = guard, checkpoints, backend

    def due(self, state: LoopState) -> bool:
        return self._guard.should_stop(self._backend)  # a collective: every worker asks

    def __call__(self, state: LoopState) -> None:
        signals.acknowledge()
        self._checkpoints.save()
        name = self._guard.signal_name
        raise Preempted(f"stopped by {name} at step {state.step}; checkpoint written")


def default_actions(
    t,
    state,
    backend,
    evaluate,
    context,
    *,
    eval_every: int,
    model_dir: str,
    model_settings=None,
    clips: bool = False,
    deterministic: bool = False,
    guard=None,
    extra=(),
) -> list[Action]:
    """The loop's actions, in the order they run at one step (see the module docstring), for
    a run under ``t`` (its train section) acting on ``state`` (its ``build.TrainState``) on
    ``backend``: ``evaluate()`` every ``eval_every`` updates, beside ``context(step,
    images_per_sec)`` (``results.writer.eval_context``); the backbone unfrozen after
    ``model_settings.unfreeze_after_steps`` updates (the run's models.config.ModelConfig; None
    or 0: never); the log's lines count clipped updates when it ``clips``, and the
    workers' skew unless ``deterministic``. ``extra``, the run's own (``train.run(config,
    actions=...)``), after unfreeze and before preemption, whose checkpoint then holds what
    they did."""
    actions = []
    window = profile_window(t)
    if window and (backend.is_chief or t.profile_all_workers):
        logdir = os.path.join(model_dir, "tensorboard")
        if not backend.is_chief:
            logdir = os.path.join(logdir, f"worker{backend.worker_index}")
        actions.append(Profile(*window, logdir))
    actions += [
        LogWindow(t, backend, state.optimizer, clips, deterministic),
        Evaluate(eval_every, evaluate, context),
    ]
    if state.best is not None:
        actions.append(KeepBest(state.best))
        if t.early_stop_patience:
            actions.append(EarlyStop(t.early_stop_patience, state.best))
    elif t.sidecar_eval and t.early_stop_patience:
        actions.append(SidecarStop(t.early_stop_patience, model_dir, backend))
    actions += [
        SaveCheckpoint(t.checkpoint_every_steps, state.checkpoints),
    ]
    m = model_settings
    if m is not None and m.unfreeze_after_steps:
        actions.append(Unfreeze(m.unfreeze_after_steps, state.model, m, state.step))
    actions += list(extra)
    if guard is not None:
        actions.append(StopOnPreemption(guard, state.checkpoints, backend))
    return actions
