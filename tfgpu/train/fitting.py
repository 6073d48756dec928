"""``fit``: the loop between the actions. It calls the compiled train loop
(``step.loops.make_train_loop``) until the next step some action is due, the loop call ends
(--steps_per_loop) or a progressive stage ends, then runs the actions that are due
(``actions``: log, evaluate, best, checkpoint, ...), to the plan's last update. The conductor
(``loop.run``) hands it the run's state, batches and actions; it reads no Config.
"""

import tensorflow as tf

from tfgpu.errors import NonFiniteLoss
from tfgpu.results.writer import RunWriter
from tfgpu.step.loops import make_train_loop
from tfgpu.train.actions import LoopState, phase


def next_stop(actions, step: int, total_steps: int, steps_per_loop: int, staged=None) -> int:
    """The next step at which some action is due by its step count, the loop call ends, or
    (``staged``: a ``progressive.Staged``) the stage ends."""
    stops = [total_steps, step + steps_per_loop] + ([staged.end(step)] if staged else [])
    stops += [s for s in (a.next_stop(step) for a in actions) if s is not None]
    return min(stops)


def fit(
    state,
    backend,
    batches,
    actions,
    writer: RunWriter,
    *,
    plan,
    steps_per_loop: int,
    max_skipped: int = 0,
    input_ips=None,
    staged=None,
) -> dict:
    """Trains ``state`` (the run's ``build.TrainState``) on ``backend`` from its restored step
    to the last update of ``plan`` (its ``build.Plan``, which the actions see too),
    ``steps_per_loop`` updates per compiled call at most, handing each loop boundary to the
    ``actions`` that are due (``actions.default_actions``: log, evaluate, checkpoint,
    preemption, and the run's own). Returns {"images_per_sec", "skipped_records",
    "input_wait_fraction", "stopped", "last_images_per_sec"}. ``max_skipped``:
    --max_skipped_updates; ``input_ips``: images/s of the input alone
    (``run_input.train_batches``), logged with each window. ``staged``: the run's
    ``progressive.Staged`` (None: one stage), whose batches replace ``batches`` stage by stage.
    """
    loop = make_train_loop(state.step, state.global_step, state.skipped_updates, max_skipped)
    step, waited = int(state.global_step.numpy()), float(backend.wait_seconds.numpy())
    progress = LoopState(writer, step, plan, input_ips=input_ips, waited=waited)
    _ask(actions, progress, at_start=True)
    if not progress.last:
        # Tracing (and XLA compiling) the step takes from seconds to minutes for the big
        # nets; say so, or the run looks stuck.
        writer.info(f"step {progress.step}: tracing the train step, the first window takes longer")
    while not progress.last and not progress.stopped:
        if staged and staged.begins(progress.step):
            batches, _ = staged.enter(progress.step)
        stop = next_stop(actions, progress.step, plan.total_steps, steps_per_loop, staged)
        _train_until(stop, state, loop, batches, progress, max_skipped)
        _ask(actions, progress)
    return {
        "images_per_sec": progress.window.images_per_sec(),
        "skipped_records": progress.skipped_records,
        "input_wait_fraction": progress.window.input_wait_fraction(),
        "stopped": progress.stopped,
        "last_images_per_sec": progress.images_per_sec,
    }


def _ask(actions, progress: LoopState, at_start: bool = False) -> None:
    """Runs the ``actions`` due at ``progress``' step, in order (before the first update:
    only those that ask to be, ``at_start``)."""
    for action in actions:
        if (action.at_start or not at_start) and action.due(progress):
            action(progress)


def _train_until(stop: int, state, loop, batches, progress: LoopState, max_skipped: int) -> None:
    """One call of the compiled ``loop`` of ``state``'s step: the updates up to update
    ``stop`` (the next an action is due at, or --steps_per_loop's); ``progress`` takes the
    step, the window's sums and skipped records. Raises NonFiniteLoss for a non-finite
    update (unless skipped) or a diverged run (``max_skipped`` in a row)."""
    phase("train", progress.step)
    totals, first_bad, diverged = loop(
        batches, tf.constant(stop - progress.step), state.step.variant
    )
    if int(first_bad) >= 0 and not state.step.skips_non_finite:
        raise NonFiniteLoss(f"non-finite loss or gradients at step {int(first_bad)}")
    if int(diverged) >= 0:
        raise NonFiniteLoss(_diverged(state, int(diverged), max_skipped))
    n, progress.step = stop - progress.step, int(state.global_step.numpy())
    progress.window.add({k: float(v) for k, v in totals.items()}, n)
    progress.skipped_records += int(float(totals["skipped"]))  # broken images, weight 0


def _diverged(state, step: int, m: int) -> str:
    """The line of a run stopped by --max_skipped_updates=``m`` skipped updates in a row."""
    total = int(state.skipped_updates.numpy())
    if state.step.loss_scale is not None:
        scale = float(state.step.loss_scale.scale.numpy())
        why = f"with the float16 loss scale at its floor ({scale:g})"
    else:
        why = "with non-finite loss or gradients (--skip_non_finite)"
    return (
        f"training diverged at step {step}: {m} updates in a row skipped {why}, {total} of "
        f"{step} updates skipped in all (--max_skipped_updates={m})"
    )
