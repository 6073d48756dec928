"""Where a run's time went, added up from what it logged.

Each train row of metrics.jsonl is a logging window: its wall time (``seconds``; older runs
logged only images/s, from which it is estimated), the time the loop's actions took inside it
(``evaluation_seconds``, ``checkpoint_seconds``), and the share of the rest, the training,
spent waiting for input (``input_wait_fraction``). The first window also holds the trace of the
train step (and XLA's compile): its excess over the later windows' pace. An evaluation row's
``seconds`` is that evaluation's; the final one runs after the last window. The rest of
summary.json's ``wall_time_s`` is start-up, the final save and the export.
"""

import statistics

from tfgpu.report.runs import Run, number

PARTS = (
    ("compute", "training (compute)"),
    ("input_wait", "waiting for input"),
    ("tracing", "tracing and warm-up (first window)"),
    ("evaluation", "evaluation"),
    ("checkpoint", "checkpoints"),
    ("other", "start-up, final save, export"),
)


def window_seconds(run: Run) -> tuple[list[float], bool]:
    """(each train row's wall seconds, whether all were logged rather than estimated from
    images/s x updates). A resumed run's first window counts from its restored step, which
    the rows do not say: from the step before it."""
    batch = number(run.config.get("global_batch_size")) or 0
    out, logged, previous = [], True, 0
    for row in run.train:
        seconds = number(row.get("seconds"))
        if seconds is None:
            logged = False
            ips = number(row.get("images_per_sec"))
            seconds = (row["step"] - previous) * batch / ips if ips and batch else 0.0
        out.append(seconds)
        previous = row["step"]
    return out, logged


def time_spent(run: Run) -> dict:
    """{"parts": {part: seconds} (PARTS' keys; absent: not known), "total": seconds (the wall
    time, or the windows' and evaluations' sum while the run goes on), "notes": [what is
    estimated or unknown]}."""
    seconds, logged = window_seconds(run)
    notes = [] if logged or not seconds else ["window times estimated from images/s"]
    trained = [s - _paused(r) for s, r in zip(seconds, run.train)]  # the wait's share is of it
    parts = {
        "input_wait": sum(
            s * (number(r.get("input_wait_fraction")) or 0.0) for s, r in zip(trained, run.train)
        ),
        "tracing": _tracing(run, seconds),
    }
    in_windows = {
        k: sum(number(r.get(f"{k}_seconds")) or 0.0 for r in run.train)
        for k in ("evaluation", "checkpoint")
    }
    if any("seconds" in r for r in run.train):
        parts["checkpoint"] = in_windows["checkpoint"]
        evaluations = sum(number(r.get("seconds")) or 0.0 for r in run.evals)
        after = evaluations - in_windows["evaluation"]  # the final evaluation, after the loop
        parts["evaluation"] = evaluations
    else:
        notes.append("evaluation and checkpoint times not logged (an older tfgpu): in training")
        after = 0.0
    windows = sum(seconds)
    parts["compute"] = max(
        windows - parts["input_wait"] - parts["tracing"] - sum(in_windows.values()), 0.0
    )
    wall = number(run.summary.get("wall_time_s"))
    if wall is not None:
        parts["other"] = max(wall - windows - after, 0.0)
        total = wall
    else:
        total = windows + after
        notes.append("no wall time yet (no summary.json): the logged windows only")
    return {"parts": parts, "total": total, "notes": notes}


def _tracing(run: Run, seconds: list) -> float:
    """The first window's seconds beyond the later windows' median pace per update (tracing,
    compiling, warming up); 0 with fewer than two windows."""
    if len(seconds) < 2:
        return 0.0
    steps = [r["step"] for r in run.train]
    paces = []
    for i in range(1, len(seconds)):
        busy = seconds[i] - _paused(run.train[i])
        if steps[i] > steps[i - 1]:
            paces.append(busy / (steps[i] - steps[i - 1]))
    first = seconds[0] - _paused(run.train[0])
    return max(first - steps[0] * statistics.median(paces), 0.0) if paces else 0.0


def _paused(row: dict) -> float:
    """What a window's actions took inside it (evaluation, checkpoints)."""
    return sum(number(row.get(f"{k}_seconds")) or 0.0 for k in ("evaluation", "checkpoint"))
