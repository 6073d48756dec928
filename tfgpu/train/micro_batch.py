"""--micro_batch_size=auto: the largest micro-batch whose train step fits, found before the
first update, and a back-off to a smaller one when the device runs out of memory later.

Each worker tries the divisors of its per-replica batch, largest first, each by one real
update of a scratch copy of the run (the same model, optimizer, precision and step, on
synthetic batches of the run's shape, on this process' first device, with no collective
across workers), measured by ``step.memory``; then all workers take the smallest size any
found (``consensus.smallest``). Accumulation makes up the rest: the global batch, the
schedule and the update stay those of the run's settings. The scratch copy draws random
numbers; the run's seed is set again after it, so the run's model starts as it would have.

The choice and its measurements are one line of the log and an entry of the run folder's
micro_batch.json; a resumed run chooses again (its config.json keeps ``auto``). An
out-of-memory error during the run is one line saying what to set, or with ``auto`` in one
process, a back-off: the run starts again from its last checkpoint at the next smaller size.
"""

import functools
import gc
import os
import tempfile
import time

import keras
import tensorflow as tf

from tfgpu.distribute import consensus
from tfgpu.errors import ConfigError, OutOfMemory, first_line
from tfgpu.files import read_json, write_json
from tfgpu.step import memory
from tfgpu.step.loops import make_train_loop
from tfgpu.train.config import AUTO, memory_budget_bytes, micro_batch, split_batch

RECORD = "micro_batch.json"


def candidates(replica_batch: int, below: int | None = None) -> list[int]:
    """The divisors of ``replica_batch`` (smaller than ``below``, when given), largest first."""
    limit = replica_batch if below is None else below - 1
    return [m for m in range(min(limit, replica_batch), 0, -1) if replica_batch % m == 0]


class Sizing:
    """The micro-batch of one run across its starts in this process: ``choose`` before each
    build, ``backing_off`` around them (``train.run``)."""

    def __init__(self, t):
        """``t``: the run's train section (its --micro_batch_size, --memory_budget_gb)."""
        self.auto = micro_batch(t) == AUTO
        self.budget_bytes = memory_budget_bytes(t)  # None: the device's own
        self.below = None  # after an out-of-memory error: only smaller sizes
        self.used = None  # the micro-batch of the start that is running
        self.reason = "start"

    def choose(self, t, backend, writer, one_update, seed: int) -> int | None:
        """The micro-batch of a run under ``t`` (its train section) on ``backend``: None
        without auto (the settings' own); with auto, the size every worker agreed on, said in
        one line and recorded in micro_batch.json (``writer``: the run's). ``one_update``: one
        update of a scratch copy of the run (``search``); the process is seeded with ``seed`` again
        after them. Raises a ConfigError, on every worker, when some worker fits not even a
        micro-batch of 1."""
        replica_batch, accum = split_batch(t, backend.num_replicas)
        if not self.auto:
            self.used = replica_batch // accum
            return None
        device = memory.this_device(self.budget_bytes)
        tried = search(one_update, replica_batch, device, self.below)
        keras.utils.set_random_seed(seed)  # the scratch runs drew from it
        found = tried[-1].size if tried and tried[-1].fits else 0
        mine = dict(where=consensus.this_worker(), device=device.describe(), size=found)
        mine.update(budget_bytes=device.budget_bytes, tried=[vars(m) for m in tried])
        size, workers = consensus.smallest(backend, mine, "size")
        if size == 0:
            raise ConfigError(_none_fits(workers, self.below))
        self.used = size
        writer.info(_line(size, replica_batch, workers, self.reason))
        if writer.is_chief:
            _record(writer.model_dir, size, replica_batch, workers, self.reason)
        return size

    def backing_off(self, start, num_workers: int):
        """``start()`` (one start of the run: choose, build, train), again from the last
        checkpoint at the next smaller size after each out-of-memory error while it can back
        off; returns what it returns. Raises OutOfMemory with the line of what to set when
        it cannot: no auto, nothing smaller, or several processes (their collectives cannot
        start again in-process: a restart of all of them chooses again)."""
        while True:
            try:
                return start()
            except tf.errors.OpError as err:
                if not memory.is_out_of_memory(err):
                    raise
                smaller = candidates(self.used, self.used) if self.used else []
                if not (self.auto and smaller and num_workers == 1):
                    raise OutOfMemory(self._advice(err, smaller, num_workers)) from None
                print(
                    f"out of memory with micro-batches of {self.used} per replica: backing off "
                    "to a smaller one, from the last checkpoint (--micro_batch_size=auto)",
                    flush=True,
                )
                self.below, self.reason = self.used, f"out of memory at {self.used}"
                gc.collect()

    def _advice(self, err, smaller: list, num_workers: int) -> str:
        """The one line of an out-of-memory error the run does not back off from."""
        said = first_line(err, 160)
        where = f"out of memory with micro-batches of {self.used} per replica ({said})"
        if self.used is None:  # before the run had its micro-batch
            return f"out of memory before training ({said}) (docs/memory.md)"
        if not smaller:
            return (
                f"{where}: even a micro-batch of 1 does not fit; a smaller --eval_batch_size "
                "if it was evaluating, else --dtype=mixed_bfloat16/mixed_float16, --remat or a "
                "smaller model (docs/memory.md)"
            )
        if self.auto:
            return (
                f"{where}: {num_workers} processes cannot back off in-process; run the same "
                "command again (it resumes and chooses again) or set "
                f"--micro_batch_size={smaller[0]} (docs/memory.md)"
            )
        return (
            f"{where}: set --micro_batch_size={smaller[0]} (accumulation keeps the global batch "
            "and the update) or --micro_batch_size=auto; if it was evaluating, a smaller "
            "--eval_batch_size (docs/memory.md)"
        )


def search(one_update, replica_batch: int, device, below=None) -> list:
    """The ``memory.Measurement`` of each size tried, largest first, up to the first that
    fits ``device`` (the last, when one does). ``one_update(replica_batch, size, scratch)``:
    one update of a scratch copy of the run (one replica's batch of ``replica_batch``) at
    micro-batch ``size``, its files in folder ``scratch``, removed after."""
    tried = []
    for size in candidates(replica_batch, below):
        with tempfile.TemporaryDirectory(prefix="tfgpu-micro-batch-") as scratch:
            run_once = functools.partial(one_update, replica_batch, size, scratch)
            tried.append(memory.measure(run_once, size, device))
        gc.collect()  # the scratch model and step go before the next size is measured
        if tried[-1].fits:
            break
    return tried


def scratch_settings(m, replica_batch: int, size: int, scratch: str) -> dict:
    """The settings (by flag name) that make a scratch copy of a run of one replica at
    micro-batch ``size`` (``m``: the run's model settings): its global batch is one
    replica's, with nothing read or kept (its files in folder ``scratch``). Its input is
    data/'s own scratch copy (``run_input.scratch_copy``: synthetic batches of the run's
    shape)."""
    return dict(
        global_batch_size=replica_batch,
        grad_accum_steps=1,
        micro_batch_size=str(size),
        init_weights="",
        # A backbone that unfreezes later trains whole then: measure that.
        freeze="none" if m.unfreeze_after_steps else m.freeze,
        model_dir=scratch,
    )


def update_once(state, batches) -> None:
    """One update of ``state`` (a scratch run's ``build.TrainState``) on ``batches``,
    compiled as the run's, waited for."""
    loop = make_train_loop(state.step, state.global_step, state.skipped_updates)
    totals, _, _ = loop(batches, tf.constant(1), state.step.variant)
    float(totals["loss"])  # waits for the update


def _line(size: int, replica_batch: int, workers: list, reason: str) -> str:
    """The log's line of the choice and its measurements."""
    tried = "; ".join(
        f"{consensus.named(i, w['where'])} on {w['device']}: "
        + ", ".join(memory.Measurement(**m).describe() for m in w["tried"])
        for i, w in enumerate(workers)
    )
    why = "" if reason == "start" else f" after {reason}"
    return (
        f"micro-batch: auto chose {size} of {replica_batch} per replica "
        f"({replica_batch // size} micro-batch(es) per update){why}, the smallest of "
        f"{len(workers)} worker(s), {memory.MARGIN:.0%} margin kept; tried {tried}"
    )


def _record(model_dir: str, size: int, replica_batch: int, workers: list, reason: str) -> None:
    """Appends this choice to the run folder's micro_batch.json (one entry per choice)."""
    path = os.path.join(model_dir, RECORD)
    try:
        previous = read_json(path)
    except ValueError:  # damaged: the choices start again
        previous = {}
    entry = dict(
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        reason=reason,
        micro_batch_size=size,
        grad_accum_steps=replica_batch // size,
        replica_batch=replica_batch,
        margin=memory.MARGIN,
        workers=workers,
    )
    write_json(path, {"choices": [*previous.get("choices", []), entry]})


def _none_fits(workers: list, below: int | None) -> str:
    """The line of a run where some worker fits not even a micro-batch of 1."""
    i, w = next((i, w) for i, w in enumerate(workers) if not w["size"])
    tried = ", ".join(memory.Measurement(**m).describe() for m in w["tried"]) or "nothing"
    again = f" below {below}" if below else ""
    worker = consensus.named(i, f"{w['where']}, {w['device']}; tried {tried}")
    return (
        f"--micro_batch_size=auto: no micro-batch{again} fits on {worker}: a larger "
        "--memory_budget_gb, --dtype=mixed_bfloat16/mixed_float16, --remat or a smaller model "
        "(docs/memory.md)"
    )
