"""What the outer loop does between its compiled calls: each periodic action is one small
object, and ``train.fit`` only trains until the next step some action is due, then asks each.

An action has ``every`` (updates between calls; 0: none by step, e.g. preemption, which is
asked after every loop call) and ``__call__(state)``, which returns nothing or raises to end
the run. ``due(state)`` decides (default: at multiples of ``every``). A new action is one more
class here and one more line in ``default_actions``.

At a step where several are due they run in the order of ``default_actions``, and it matters:

1. **log** closes the logging window first, so that its images/s and input wait cover training
   only, not the evaluation or checkpoint that follow;
2. **evaluate** next, so that whatever is written after it (a best checkpoint, an early stop,
   a checkpoint) can see this step's result, which it leaves in ``LoopState.evaluation``;
3. **best** (--keep_best, --early_stop_patience, --export_best) takes that result: the best
   value so far (a variable in the checkpoint) and a best checkpoint when it is among the K;
4. **early stop** after N evaluations without a better one: it ends the loop (not the run:
   ``train.run`` then saves, evaluates and exports as at the end). An action with
   ``at_start`` is also asked before the first update, so that a resumed run which had
   stopped early stops again instead of training on;
5. **checkpoint** after those: a checkpoint of step S holds everything step S knew;
6. **preemption** last: when a signal came, the checkpoint it needs is written after
   everything else this step owed, and the run stops with all of it on disk.

Actions at the last step are left to ``train.run`` (final checkpoint, evaluation, export),
except the log, which closes the last window.
"""

from dataclasses import dataclass, field

from tfgpu import faults
from tfgpu.distribute import consensus, heartbeats
from tfgpu.errors import Preempted
from tfgpu.results import INPUT_BOUND, RunWriter, Window, input_bound_warning


@dataclass
class LoopState:
    """What the loop has done so far, shared by the actions."""

    training: object  # build.Training: what the run is made of
    writer: RunWriter
    step: int
    window: Window = field(default_factory=Window)
    skipped_records: int = 0  # broken images (weight 0) in the updates so far
    input_ips: float | None = None  # images/s of the input alone (build.probe_input)
    waited: float = 0.0  # seconds in all-reduces until the last closed window
    evaluation: tuple | None = None  # (step, result) of the newest evaluation
    stopped: str = ""  # why the loop ended before the plan's last step ("early_stop")

    @property
    def last(self) -> bool:
        return self.step >= self.training.plan.total_steps


class Action:
    """Base: due at multiples of ``every``, never at the last step (``train.run`` owns it)."""

    every = 0
    at_start = False  # also asked once before the first update

    def due(self, state: LoopState) -> bool:
        return bool(self.every) and state.step % self.every == 0 and not state.last

    def __call__(self, state: LoopState) -> None:
        raise NotImplementedError


def phase(name: str, step: int) -> None:
    """Where the run is, for the signal watcher and the heartbeat board."""
    faults.set_phase(name, step)
    heartbeats.set_phase(name)


class LogWindow(Action):
    """Closes the logging window: metrics.jsonl, TensorBoard and the progress line, every
    --log_every_steps, at the last step, and (one process) after --log_every_s without a line;
    warns once when the step waited for input more than INPUT_BOUND of the time."""

    def __init__(self, every: int, every_s: float):
        self.every, self.every_s, self._warned = every, every_s, False

    def due(self, state: LoopState) -> bool:
        by_time = state.training.backend.num_workers == 1 and state.window.age() >= self.every_s
        return state.step % self.every == 0 or state.last or by_time

    def __call__(self, state: LoopState) -> None:
        training, t = state.training, state.training.config.train
        lr = float(training.optimizer.learning_rate)  # the schedule at the current update
        record = state.window.close(state.step, lr, t.global_batch_size)
        if state.input_ips:
            record["input_images_per_sec"] = state.input_ips
        if training.backend.num_workers > 1 and not training.config.deterministic:
            record.update(self._skew(state))
        state.writer.log_train(record, training.plan.total_steps, t.global_batch_size)
        wait = record["input_wait_fraction"]
        if not self._warned and wait > INPUT_BOUND and state.window.timed:
            self._warned = True
            ips = record["images_per_sec"]
            state.writer.info(input_bound_warning(wait, ips, state.input_ips))

    @staticmethod
    def _skew(state: LoopState) -> dict:
        """The slowest worker's compute seconds per update in the window just closed, and
        the median's (``consensus.step_time_skew``)."""
        backend, window = state.training.backend, state.window
        waited = float(backend.wait_seconds.numpy())
        compute = (window.last_seconds - (waited - state.waited)) / max(window.last_updates, 1)
        state.waited = waited
        return consensus.step_time_skew(backend, compute)


class Evaluate(Action):
    """Evaluates on the validation split every ``every`` updates (--eval_every_*)."""

    def __init__(self, every: int, evaluate):
        self.every, self._evaluate = every, evaluate

    def __call__(self, state: LoopState) -> None:
        phase("evaluation", state.step)
        result = self._evaluate()
        state.writer.log_eval(state.step, result)
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
        if self._best.observe(*state.evaluation):
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


class SaveCheckpoint(Action):
    """Writes a checkpoint every --checkpoint_every_steps."""

    def __init__(self, every: int, checkpoints):
        self.every, self._checkpoints = every, checkpoints

    def __call__(self, state: LoopState) -> None:
        phase("checkpoint save", state.step)
        self._checkpoints.save()


class StopOnPreemption(Action):
    """After every loop call: when SIGTERM/SIGINT came (on any worker), saves a checkpoint
    and raises Preempted."""

    def __init__(self, guard, checkpoints):
        self._guard, self._checkpoints = guard, checkpoints

    def due(self, state: LoopState) -> bool:
        return self._guard.should_stop(state.training.backend)  # a collective: every worker asks

    def __call__(self, state: LoopState) -> None:
        faults.acknowledge()
        self._checkpoints.save()
        name = self._guard.signal_name
        raise Preempted(f"stopped by {name} at step {state.step}; checkpoint written")


def default_actions(training, evaluate, guard=None) -> list[Action]:
    """The loop's actions, in the order they run at one step (see the module docstring)."""
    t = training.config.train
    actions = [
        LogWindow(t.log_every_steps, t.log_every_s),
        Evaluate(training.plan.eval_every, evaluate),
    ]
    if training.best is not None:
        actions.append(KeepBest(training.best))
        if t.early_stop_patience:
            actions.append(EarlyStop(t.early_stop_patience, training.best))
    actions += [
        SaveCheckpoint(t.checkpoint_every_steps, training.checkpoints),
    ]
    if guard is not None:
        actions.append(StopOnPreemption(guard, training.checkpoints))
    return actions
