"""The end of a run, after its last update (``loop.run``'s last phase): the final evaluation,
the final checkpoint, final.weights.h5 and the export (``finish``), the summary every worker
agrees on (``summary``), and the summary written and each worker's fingerprint said
(``end``).
"""

import contextlib
import hashlib
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

from tfgpu import compat
from tfgpu.checkpoint import average
from tfgpu.checkpoint.store import variables_of
from tfgpu.models.layers import refresh_derived_state
from tfgpu.data import run_input
from tfgpu.inference.export.serving import export_model
from tfgpu.results.writer import RunWriter, final_eval_of
from tfgpu.train.actions import phase, timed


def finish(state, backend, t, evaluated, writer: RunWriter, inputs, throughput: dict) -> dict:
    """After the last update of ``state`` (the run's ``build.TrainState``) on ``backend``,
    as ``t`` (its train section) says: evaluates and logs it (``evaluated``: the run's
    evaluation, what its rows are logged with; ``throughput``:
    ``fit``'s, for the log's images/s; with --average_checkpoints its "averaged_steps" are
    set), saves the final checkpoint, and on the chief final.weights.h5 and the export (of
    the data of ``inputs``, its ``run_input.RunInput``). Returns the final evaluation."""
    last_step = int(state.global_step.numpy())
    phase("final evaluation, save and export", last_step)
    ips = throughput["images_per_sec"] or throughput["last_images_per_sec"]
    evaluate, context = evaluated
    averaging = bool(t.average_checkpoints)
    if averaging:  # saved first: the last trained state, the newest of those averaged
        state.checkpoints.save(final=True)
    with _final_model(state, backend, t, writer, throughput):
        # With --sidecar_eval the side-car evaluates the final checkpoint (summary.json: its
        # final_eval). An average holds its own evaluation weights: no EMA swap then.
        started = time.time()
        final_eval = {} if t.sidecar_eval else evaluate(ema=not averaging)
        final_row = timed(final_eval, time.time() - started)
        writer.log_eval(last_step, final_row, context(last_step, ips), again=True)
        if not averaging:  # the best (in the final checkpoint) takes it into account
            if state.best is not None and final_eval:
                state.best.observe(last_step, final_eval)
            state.checkpoints.save(final=True)
        _save_final(state, backend, t, writer, inputs, ema=not averaging)
    return final_eval


@contextlib.contextmanager
def _final_model(state, backend, t, writer: RunWriter, throughput: dict):
    """The run's final model for the duration: with --average_checkpoints (``t``) the mean of
    its newest checkpoints (said, and their steps put in ``throughput``: "averaged_steps"),
    which is no checkpoint (the best does not take its evaluation into account); else the
    model as trained."""
    if not t.average_checkpoints:
        yield
        return
    parts = (state.model, state.optimizer, backend)
    directory, k = state.checkpoints.directory, t.average_checkpoints
    with average.averaged(*parts, directory, k) as steps:
        writer.info(f"final model: the mean of the checkpoints of steps {steps}")
        throughput["averaged_steps"] = steps
        yield


def _save_final(state, backend, t, writer: RunWriter, inputs, ema: bool = True) -> None:
    """On the chief: final.weights.h5 (the model's weights as they are) and, when ``t`` says
    so, the export (``ema=False``: without the EMA swap, the model holds an average of
    checkpoints)."""
    if backend.is_chief:
        state.model.save_weights(os.path.join(writer.model_dir, "final.weights.h5"))
        if t.export:
            _export(state, t, writer, inputs, ema)


def _export(state, t, writer: RunWriter, inputs, ema: bool = True) -> None:
    """export/: the last model, or with --export_best the best kept checkpoint's (its model
    and optimizer are read into the run's, then the last values are put back: the summary's
    fingerprint is of the last model, on every worker); with the EMA weights where the run
    keeps them (--ema_decay) and ``ema``, as evaluation and tfgpu-export use. The serving
    signatures read images as the data of ``inputs`` says."""
    directory = os.path.join(writer.model_dir, "export")
    size = inputs.data.image_size
    served = dict(inputs.serving, tta=t.eval_tta)  # its evaluation's views
    best = state.best
    if not (t.export_best and best is not None and best.kept):
        with compat.ema_weights(state.optimizer) if ema else contextlib.nullcontext():
            note = export_model(state.model, directory, size, **served)
        if note:
            writer.info(note)
        return
    kept = best.kept[0]
    held = variables_of([state.model, state.optimizer])
    last = [v.numpy() for v in held]
    tf.train.Checkpoint(model=state.model, optimizer=state.optimizer).read(
        kept["checkpoint"]
    ).expect_partial()
    refresh_derived_state(state.model)
    writer.info(f"export: the best model by {best.metric}, step {kept['step']}")
    with compat.ema_weights(state.optimizer):
        note = export_model(state.model, directory, size, **served)
    if note:
        writer.info(note)
    for variable, value in zip(held, last):
        variable.assign(value)
    refresh_derived_state(state.model)


def weights_fingerprint(model: keras.Model) -> str:
    """SHA-256 of every weight's bytes, in order: equal on workers that ended identical."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()[:16]


def broken_records(backend) -> list:
    """Every worker's broken records (``run_input.broken_found``), each once (a collective)."""
    mine = json.dumps(run_input.broken_found()).encode()
    found = [entry for blob in backend.all_gather_bytes(mine) for entry in json.loads(blob)]
    unique = {(e["file"], e["index"]): e for e in found}
    return list(unique.values())


def summary(state, backend, plan, global_batch: int, final_eval, throughput, wall_s) -> dict:
    """summary.json: what the run did, in the contract's names (``plan``: the run's
    ``build.Plan``; ``throughput``: ``fit``'s, with every worker's broken records)."""
    out = {
        "strategy": backend.name,
        "num_replicas": backend.num_replicas,
        "global_batch_size": global_batch,
        "grad_accum_steps": plan.grad_accum_steps,
        "steps": int(state.global_step.numpy()),
        "final_eval": final_eval_of(final_eval),
        "train_images_per_sec": throughput["images_per_sec"],
        "input_wait_fraction": throughput["input_wait_fraction"],
        "input_images_per_sec": throughput["input_images_per_sec"],
        "skipped_records": throughput["skipped_records"],
        "broken_records": len(throughput["broken"]),
        "broken_record_list": throughput["broken"][:100],
        "skipped_updates": int(state.skipped_updates.numpy()),
        "gradient_all_reduces": int(backend.all_reduce_calls.numpy()),
        "weights_sha256": weights_fingerprint(state.model),
        "wall_time_s": wall_s,
    }
    if throughput["stopped"]:
        out.update(stopped=throughput["stopped"], stopped_at_step=out["steps"])
    if "averaged_steps" in throughput:  # final_eval, final.weights.h5, export: their mean
        out["averaged_checkpoints"] = throughput["averaged_steps"]
    if state.best is not None:
        out["best"] = state.best.summary()
    return out


def end(backend, watch, writer: RunWriter, summary: dict) -> dict:
    """``summary`` written and returned, once the heartbeats (``watch``) are stopped; each
    worker prints its weights' fingerprint."""
    heard = watch.finish()
    if heard:  # what the side channel heard: a flood or a deaf board shows here
        print(f"worker {backend.worker_index}: heartbeats: {heard}", flush=True)
    writer.write_summary(summary)
    # Every worker says what it ended with: replicas that disagree are a bug, and visible.
    worker = f"{backend.worker_index}/{backend.num_workers}"
    print(f"worker {worker} weights_sha256 {summary['weights_sha256']}", flush=True)
    return summary
