"""The outer loop: train, evaluate, checkpoint, log and export.

Read from the bottom: ``run(config)`` sets up a backend (``distribute``), agrees with the other
workers on the data, builds the ``Training`` (``build.py``: plan, model, train step, counters,
checkpoints), then ``fit`` trains until the next step an action is due and hands it to the
actions (``actions.py``: log, evaluate, checkpoint, preemption). What it calls compiled is in
``loops.py``: ``make_train_loop`` and ``make_eval_step``.
"""

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from tfgpu import compat
from tfgpu.checkpoint import average
from tfgpu.checkpoint.store import refresh_derived_state, variables_of
from tfgpu.results import runlock
from tfgpu.train import micro_batch
from tfgpu.train.actions import Action, LoopState, default_actions, eval_context, phase, timed
from tfgpu.train.build import Training, build, train_batches, train_maker
from tfgpu.train.config import check_average_plan
from tfgpu.config import Config, ConfigError, resolve, rundir
from tfgpu.data import broken, readers, run_input
from tfgpu.data.spec import DataError
from tfgpu.distribute import backends, consensus, devices, heartbeats
from tfgpu.train.signals import PreemptionGuard
from tfgpu.train.progressive import Staged
from tfgpu.step.loops import make_train_loop
from tfgpu.inference import evaluate as evaluation
from tfgpu.inference.evaluate import Evaluator
from tfgpu.inference.export.serving import export_model
from tfgpu.results.writer import RunWriter, final_eval_of
from tfgpu.errors import NonFiniteLoss


def _next_stop(actions, step: int, total_steps: int, steps_per_loop: int, staged=None) -> int:
    """The next step at which some action is due by its step count, the loop call ends, or
    (``staged``: a ``progressive.Staged``) the stage ends."""
    stops = [total_steps, step + steps_per_loop] + ([staged.end(step)] if staged else [])
    stops += [s for s in (a.next_stop(step) for a in actions) if s is not None]
    return min(stops)


def fit(
    training: Training, batches, actions, writer: RunWriter, input_ips=None, staged=None
) -> dict:
    """Trains from the restored step to the plan's last, handing each loop boundary to the
    ``actions`` that are due (``actions.default_actions``: log, evaluate, checkpoint,
    preemption, and the run's own). Returns {"images_per_sec", "skipped_records",
    "input_wait_fraction", "stopped", "last_images_per_sec"}. ``input_ips``: images/s of the
    input alone (``readers.probe``), logged with each window. ``staged``: the run's
    ``progressive.Staged`` (None: one stage), whose batches replace ``batches`` stage by stage.
    """
    max_skipped = training.config.optim.max_skipped_updates
    loop = make_train_loop(
        training.step, training.global_step, training.skipped_updates, max_skipped
    )
    step, waited = int(training.global_step.numpy()), float(training.backend.wait_seconds.numpy())
    state = LoopState(training, writer, step, input_ips=input_ips, waited=waited)
    _ask(actions, state, at_start=True)
    if not state.last:
        # Tracing (and XLA compiling) the step takes from seconds to minutes for the big
        # nets; say so, or the run looks stuck.
        writer.info(f"step {state.step}: tracing the train step, the first window takes longer")
    while not state.last and not state.stopped:
        if staged and staged.begins(state.step):
            batches = staged.enter(state.step)
        _train_until_due(training, loop, batches, actions, state, staged)
        _ask(actions, state)
    return {
        "images_per_sec": state.window.images_per_sec(),
        "skipped_records": state.skipped_records,
        "input_wait_fraction": state.window.input_wait_fraction(),
        "stopped": state.stopped,
        "last_images_per_sec": state.images_per_sec,
    }


def _ask(actions, state: LoopState, at_start: bool = False) -> None:
    """Runs the ``actions`` due at ``state``'s step, in order (before the first update:
    only those that ask to be, ``at_start``)."""
    for action in actions:
        if (action.at_start or not at_start) and action.due(state):
            action(state)


def _train_until_due(training: Training, loop, batches, actions, state: LoopState, staged) -> None:
    """One call of the compiled ``loop``: the updates up to the next step an action is due
    (or --steps_per_loop); ``state`` takes the step, the window's sums and skipped records.
    Raises NonFiniteLoss for a non-finite update (unless skipped) or a diverged run."""
    t = training.config.train
    stop = _next_stop(actions, state.step, training.plan.total_steps, t.steps_per_loop, staged)
    phase("train", state.step)
    totals, first_bad, diverged = loop(
        batches, tf.constant(stop - state.step), training.step.variant
    )
    if int(first_bad) >= 0 and not training.step.skips_non_finite:
        raise NonFiniteLoss(f"non-finite loss or gradients at step {int(first_bad)}")
    if int(diverged) >= 0:
        raise NonFiniteLoss(_diverged(training, int(diverged)))
    n, state.step = stop - state.step, int(training.global_step.numpy())
    state.window.add({k: float(v) for k, v in totals.items()}, n)
    state.skipped_records += int(float(totals["skipped"]))  # broken images, weight 0


def _diverged(training: Training, step: int) -> str:
    """The line of a run stopped by --max_skipped_updates skipped updates in a row."""
    m, total = training.config.optim.max_skipped_updates, int(training.skipped_updates.numpy())
    if training.step.loss_scale is not None:
        scale = float(training.step.loss_scale.scale.numpy())
        why = f"with the float16 loss scale at its floor ({scale:g})"
    else:
        why = "with non-finite loss or gradients (--skip_non_finite)"
    return (
        f"training diverged at step {step}: {m} updates in a row skipped {why}, {total} of "
        f"{step} updates skipped in all (--max_skipped_updates={m})"
    )


def weights_fingerprint(model: keras.Model) -> str:
    """SHA-256 of every weight's bytes, in order: equal on workers that ended identical."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()[:16]


def _start_line(training: Training) -> str:
    config, plan, backend = training.config, training.plan, training.backend
    micro = plan.replica_batch // plan.grad_accum_steps
    return (
        f"{backend.name}: {backend.num_replicas} replica(s), {plan.total_steps} updates "
        f"of {config.train.global_batch_size} ({plan.grad_accum_steps} micro-batch(es) of "
        f"{micro} per replica), model {config.model.name}, " + training.inputs.words
    )


def run(config: Config, actions: Sequence[Action] = ()) -> dict:
    """Trains, evaluates and exports as ``config`` says; returns the summary (also written).
    ``actions``: the run's own periodic actions (``actions.Action`` subclasses, as Keras'
    ``fit(callbacks=...)``), asked after the default ones at each loop boundary, before a
    preempted run's last checkpoint.
    The chief holds --model_dir's lock (``runlock``) from before it writes anything there to
    the end: a second run into the same directory stops, on every one of its workers. A
    --model_dir that holds something other than a tfgpu run is refused first (``rundir``)."""
    compat.trace_tfgpu_as_written()  # as the commands do (cli/quiet.import_tensorflow)
    rundir.read_run(config.model_dir)
    backend = backends.setup(config.dist)
    with runlock.held(config.model_dir, backend.is_chief) as in_use:
        if in_use and backend.num_workers == 1:
            raise ConfigError(in_use)
        sizing = micro_batch.Sizing(config)
        start = lambda: _run(config, backend, in_use, actions, sizing)  # noqa: E731
        return sizing.backing_off(start, backend.num_workers)


def _train_input(training: Training, start_step: int, writer: RunWriter):
    """(the run's ``progressive.Staged`` or None for one stage, the train batches from
    ``start_step``, the input's own images/s or None); the input alone is probed first
    (--input_probe_s) and said."""
    probe_s = training.config.data.input_probe_s
    staged = Staged.of(training, writer.info)
    make = staged.maker(start_step) if staged else train_maker(training, start_step)
    shard, batch = training.backend.input_shard, training.plan.replica_batch
    input_ips = readers.probe(make, shard, training.config.data, batch, probe_s)
    if input_ips:
        writer.info(
            f"input alone: {input_ips:,.0f} img/s on this worker (read for "
            f"--input_probe_s={probe_s:g} s)"
        )
    if staged:
        return staged, staged.enter(start_step, make), input_ips
    return staged, train_batches(training, start_step, make), input_ips


def _run(config: Config, backend, in_use: str, actions: Sequence[Action] = (), sizing=None) -> dict:
    """``run`` once the backend is set up (``in_use``: the chief's lock error, which every
    worker stops with at the start-up agreement; ``sizing``: the run's
    ``micro_batch.Sizing``, which decides --micro_batch_size=auto)."""
    config, dtype_line = _start(config)
    started = time.time()
    watch = heartbeats.Watch.open(backend)
    training, writer = _set_up(config, backend, watch, in_use, sizing, dtype_line)
    evaluate = evaluation.of(training)
    start_step = _restore(training, writer)
    staged, batches, input_ips = _train_input(training, start_step, writer)
    with PreemptionGuard() as guard:
        loop_actions = default_actions(training, evaluate, guard, extra=actions)
        throughput = fit(training, batches, loop_actions, writer, input_ips, staged)
    throughput["input_images_per_sec"] = input_ips
    final_eval = _finish(training, evaluate, writer, throughput)
    return _end(training, watch, writer, final_eval, throughput, time.time() - started)


def _start(config: Config) -> tuple[Config, str]:
    """(``config`` resolved for this machine, the start-up line of --dtype=auto's choice or
    ""); the process seeded and made as deterministic as it says, the broken records an
    earlier run in this process found forgotten."""
    auto = config.model.dtype == "auto"
    stored = rundir.read_run(config.model_dir) if auto else None
    bfloat16 = devices.fast_bfloat16() if auto else ""
    has_gpu = bool(tf.config.list_logical_devices("GPU"))
    config = resolve(config, has_gpu, bfloat16, stored)
    keras.utils.set_random_seed(config.seed)
    broken.forget()
    compat.set_op_determinism(config.deterministic)
    return config, _auto_dtype_line(config.model.dtype, bfloat16, stored) if auto else ""


def _auto_dtype_line(dtype: str, bfloat16: str, stored) -> str:
    """What --dtype=auto chose, and why."""
    if stored and stored.get("dtype", "auto") != "auto":
        return f"--dtype=auto: {dtype}, the run's own choice (config.json)"
    why = f"this {bfloat16} computes bfloat16 fast" if bfloat16 else "no fast bfloat16 here"
    return f"--dtype=auto: {dtype} ({why})"


def _set_up(config: Config, backend, watch, in_use: str, sizing, dtype_line: str = "") -> tuple:
    """(the run's Training, its RunWriter): the data agreed on with every worker and what
    the run takes from it (``run_input``), config.json written, the micro-batch sized, the
    run built, its start lines (``dtype_line``: --dtype=auto's choice) said and the
    heartbeats (``watch``) started."""
    spec, class_weights, fingerprints = _agreed_spec(config, backend, watch.announced, in_use)
    inputs = run_input.prepare(config.data, config.optim.class_weights, spec, class_weights)
    if backend.is_chief:
        run_input.record(config.model_dir, spec)
    writer = RunWriter(config.model_dir, backend.is_chief)
    writer.write_config(config, backend)
    config = (sizing or micro_batch.Sizing(config)).choose(
        config, backend, spec, class_weights, writer
    )
    training = build(config, backend, inputs)
    check_average_plan(config.train, training.plan.total_steps)
    writer.info(_start_line(training))
    timeout = config.dist.stall_timeout_s
    listening = watch.start(fingerprints, backend, training.global_step, timeout)
    for line in (dtype_line, listening, training.init_line):
        if line:
            writer.info(line)
    return training, writer


def _restore(training: Training, writer: RunWriter) -> int:
    """The step the run goes on from: its newest checkpoint's (0 for none), which the
    metrics and the best-so-far are cut back to."""
    start_step = training.checkpoints.restore(writer.info)
    writer.resume(start_step)
    if training.best is not None:
        training.best.resume(start_step)
    return start_step


def _end(training: Training, watch, writer: RunWriter, final_eval, throughput, wall_s) -> dict:
    """The summary, written and returned, once every worker's broken records are gathered
    (the last collective) and the heartbeats stopped; each worker prints its weights'
    fingerprint."""
    backend = training.backend
    throughput["broken"] = _broken_records(backend)
    heard = watch.finish()
    if heard:  # what the side channel heard: a flood or a deaf board shows here
        print(f"worker {backend.worker_index}: heartbeats: {heard}", flush=True)
    summary = _summary(training, final_eval, throughput, wall_s)
    writer.write_summary(summary)
    # Every worker says what it ended with: replicas that disagree are a bug, and visible.
    worker = f"{backend.worker_index}/{backend.num_workers}"
    print(f"worker {worker} weights_sha256 {summary['weights_sha256']}", flush=True)
    return summary


def _finish(training: Training, evaluate: Evaluator, writer: RunWriter, throughput: dict) -> dict:
    """After the last update: evaluates and logs it (``throughput``: ``fit``'s, for the
    log's images/s; with --average_checkpoints its "averaged_steps" are set), saves the final
    checkpoint, and on the chief final.weights.h5 and the export. Returns the final
    evaluation."""
    config, last_step = training.config, int(training.global_step.numpy())
    phase("final evaluation, save and export", last_step)
    ips = throughput["images_per_sec"] or throughput["last_images_per_sec"]
    if config.train.average_checkpoints:
        # Saved first: the last trained state, the newest of the checkpoints averaged. The
        # average is no checkpoint: the best does not take its evaluation into account.
        training.checkpoints.save(final=True)
        parts = (training.model, training.optimizer, training.backend)
        directory, k = training.checkpoints.directory, config.train.average_checkpoints
        with average.averaged(*parts, directory, k) as steps:
            writer.info(f"final model: the mean of the checkpoints of steps {steps}")
            throughput["averaged_steps"] = steps
            started = time.time()
            final_eval = {} if config.train.sidecar_eval else evaluate(ema=False)
            final_row = timed(final_eval, time.time() - started)
            context = eval_context(training, last_step, ips)
            writer.log_eval(last_step, final_row, context, again=True)
            _save_final(training, writer, ema=False)
        return final_eval
    # Evaluated first: the best (in the final checkpoint) takes it into account. With
    # --sidecar_eval the side-car evaluates the final checkpoint (summary.json: its final_eval).
    started = time.time()
    final_eval = {} if config.train.sidecar_eval else evaluate()
    final_row = timed(final_eval, time.time() - started)
    writer.log_eval(last_step, final_row, eval_context(training, last_step, ips), again=True)
    if training.best is not None and final_eval:
        training.best.observe(last_step, final_eval)
    training.checkpoints.save(final=True)
    _save_final(training, writer)
    return final_eval


def _save_final(training: Training, writer: RunWriter, ema: bool = True) -> None:
    """On the chief: final.weights.h5 (the model's weights as they are) and the export
    (``ema=False``: without the EMA swap, the model holds an average of checkpoints)."""
    if training.backend.is_chief:
        training.model.save_weights(os.path.join(training.config.model_dir, "final.weights.h5"))
        if training.config.train.export:
            _export(training, writer, ema)


def _export(training: Training, writer: RunWriter, ema: bool = True) -> None:
    """export/: the last model, or with --export_best the best kept checkpoint's (its model
    and optimizer are read into the run's, then the last values are put back: the summary's
    fingerprint is of the last model, on every worker); with the EMA weights where the run
    keeps them (--ema_decay) and ``ema``, as evaluation and tfgpu-export use."""
    config = training.config
    directory = os.path.join(config.model_dir, "export")
    served = dict(training.inputs.serving, tta=config.train.eval_tta)  # its evaluation's views
    if not (config.train.export_best and training.best is not None and training.best.kept):
        with compat.ema_weights(training.optimizer) if ema else contextlib.nullcontext():
            note = export_model(training.model, directory, config.data.image_size, **served)
        if note:
            writer.info(note)
        return
    best = training.best.kept[0]
    held = variables_of([training.model, training.optimizer])
    last = [v.numpy() for v in held]
    tf.train.Checkpoint(model=training.model, optimizer=training.optimizer).read(
        best["checkpoint"]
    ).expect_partial()
    refresh_derived_state(training.model)
    writer.info(f"export: the best model by {training.best.metric}, step {best['step']}")
    with compat.ema_weights(training.optimizer):
        note = export_model(training.model, directory, config.data.image_size, **served)
    if note:
        writer.info(note)
    for variable, value in zip(held, last):
        variable.assign(value)
    refresh_derived_state(training.model)


def _agreed_spec(config: Config, backend, announced: dict, in_use: str = "") -> tuple:
    """(this worker's data spec, its class weights: float64 [K] or None, every worker's
    fingerprint), once every worker has a spec and all agree on it, on the settings, on the
    tfgpu version and on the class weights each read (``consensus.agree``), the data being
    the data the run's checkpoints were made on (``run_input.load``): the run trains
    with these weights, --class_weights is not read again. A worker that cannot read its
    data or its class weights still takes part, so that every worker stops with the same
    line, naming it. ``announced``: what this worker's fingerprint says of its heartbeats
    (``heartbeats.Watch``); ``in_use``: the chief found --model_dir held by another run."""
    spec, weights, error = None, None, in_use
    try:
        spec, weights = run_input.load(
            config.data, config.optim.class_weights, resumed_in=config.model_dir
        )
    except (DataError, ConfigError) as err:
        if backend.num_workers == 1:
            raise
        error = error or str(err)
    summary = spec.summary() if spec else None
    listed = None if weights is None else weights.tolist()
    mine = consensus.fingerprint(config.shared(), summary, error, listed)
    return spec, weights, consensus.agree(backend, dict(mine, **announced))


def _broken_records(backend) -> list:
    """Every worker's broken records (``broken.found``), each once (a collective)."""
    mine = json.dumps(broken.found()).encode()
    found = [entry for blob in backend.all_gather_bytes(mine) for entry in json.loads(blob)]
    unique = {(e["file"], e["index"]): e for e in found}
    return list(unique.values())


def _summary(training: Training, final_eval: dict, throughput: dict, wall_time_s: float) -> dict:
    """summary.json: what the run did, in the contract's names."""
    summary = {
        "strategy": training.backend.name,
        "num_replicas": training.backend.num_replicas,
        "global_batch_size": training.config.train.global_batch_size,
        "grad_accum_steps": training.plan.grad_accum_steps,
        "steps": int(training.global_step.numpy()),
        "final_eval": final_eval_of(final_eval),
        "train_images_per_sec": throughput["images_per_sec"],
        "input_wait_fraction": throughput["input_wait_fraction"],
        "input_images_per_sec": throughput["input_images_per_sec"],
        "skipped_records": throughput["skipped_records"],
        "broken_records": len(throughput["broken"]),
        "broken_record_list": throughput["broken"][:100],
        "skipped_updates": int(training.skipped_updates.numpy()),
        "gradient_all_reduces": int(training.backend.all_reduce_calls.numpy()),
        "weights_sha256": weights_fingerprint(training.model),
        "wall_time_s": wall_time_s,
    }
    if throughput["stopped"]:
        summary.update(stopped=throughput["stopped"], stopped_at_step=summary["steps"])
    if "averaged_steps" in throughput:  # final_eval, final.weights.h5, export: their mean
        summary["averaged_checkpoints"] = throughput["averaged_steps"]
    if training.best is not None:
        summary["best"] = training.best.summary()
    return summary
