"""A run's folder read for a report, as it is: finished, still running or cut short.

Plain files, no TensorFlow: config.json (the resolved settings), metrics.jsonl (train and
evaluation rows), summary.json (written at the end: its absence means the run is still going,
or stopped). Whatever is missing or damaged is said in ``Run.notes``, never raised: a report of
a run must render whatever state the run is in. Only a folder that is no run at all (neither
config.json nor metrics.jsonl) is an error.
"""

import json
import math
import os
from dataclasses import dataclass, field

from tfgpu.errors import UsageError
from tfgpu.files import read_json, shown

MAX_NOTED_LINES = 5  # bad lines of metrics.jsonl named one by one, then counted


@dataclass
class Run:
    """One run folder as read: ``train`` and ``evals`` hold metrics.jsonl's rows by step (a
    resumed run that logged a step again: its last row), ``summary`` is {} until the run ends,
    ``notes`` what could not be read."""

    path: str
    name: str
    config: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    train: list = field(default_factory=list)
    evals: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return bool(self.summary)

    @property
    def last_step(self) -> int | None:
        steps = [r["step"] for r in self.train + self.evals]
        return max(steps) if steps else None

    def final_eval(self) -> dict:
        """The final evaluation (summary.json's), else the newest evaluation row; {} if none."""
        final = self.summary.get("final_eval") or {}
        if isinstance(final, dict) and final.get("top1") is not None:
            return dict(final, step=self.summary.get("steps"))
        return dict(self.evals[-1]) if self.evals else {}

    def best_eval(self) -> dict:
        """The evaluation row of the highest top-1 (the first of equals); {} if none."""
        scored = [r for r in self.evals if number(r.get("top1")) is not None]
        return max(scored, key=lambda r: r["top1"]) if scored else {}


def read_runs(paths) -> list[Run]:
    """The runs at ``paths`` (folders), named by their shortest distinct path ending; a path
    that is not a run folder is a UsageError naming it."""
    runs = [read_run(p) for p in paths]
    for run, name in zip(runs, distinct_names([r.path for r in runs])):
        run.name = name
    return runs


def read_run(path: str) -> Run:
    """The run folder ``path`` as ``Run``; a UsageError when it is no folder or holds neither
    config.json nor metrics.jsonl."""
    full = os.path.expanduser(path)
    if not os.path.isdir(full):
        raise UsageError(f"{shown(path)}: no such run folder")
    metrics = os.path.join(full, "metrics.jsonl")
    config_file = os.path.join(full, "config.json")
    if not os.path.exists(metrics) and not os.path.exists(config_file):
        raise UsageError(f"{shown(path)}: not a tfgpu run (no config.json, no metrics.jsonl)")
    run = Run(path=full, name=os.path.basename(os.path.normpath(full)))
    run.config = _read_object(config_file, run.notes)
    run.summary = _read_object(os.path.join(full, "summary.json"), run.notes, optional=True)
    if not run.summary:
        run.notes.append("no summary.json: the run is still going, or stopped before its end")
    if os.path.exists(metrics):
        rows = read_metrics(metrics, run.notes)
        run.train = _by_step([r for r in rows if r.get("split") == "train"])
        run.evals = _by_step([r for r in rows if r.get("split") not in (None, "train")])
    else:
        run.notes.append("no metrics.jsonl yet: nothing logged")
    return run


def _read_object(path: str, notes: list, optional: bool = False) -> dict:
    """The JSON object in ``path``; {} (and a note, unless ``optional`` and absent) when it
    is missing or not readable."""
    try:
        value = read_json(path)
    except ValueError as err:
        notes.append(str(err))
        return {}
    if not value and not optional:
        notes.append(f"no {os.path.basename(path)}")
    return value


def read_metrics(path: str, notes: list) -> list[dict]:
    """metrics.jsonl's rows: JSON objects with an integer ``step``, in file order. A last line
    cut short (a run writing it now, or killed while writing) and any other line that is no
    such row are left out and said in ``notes``."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    cut = lines.pop() if lines else b""  # what follows the last newline: a line not ended
    rows, bad = [], []
    for number, line in enumerate(lines, 1):
        row = _row(line)
        if row is None and line.strip():
            bad.append(number)
        elif row is not None:
            rows.append(row)
    if cut.strip():
        row = _row(cut)
        if row is None:
            notes.append(
                f"metrics.jsonl: its last line (line {len(lines) + 1}) is cut short, left out "
                "(being written, or the run stopped while writing it)"
            )
        else:
            rows.append(row)
    if bad:
        named = ", ".join(map(str, bad[:MAX_NOTED_LINES]))
        more = f" and {len(bad) - MAX_NOTED_LINES} more" if len(bad) > MAX_NOTED_LINES else ""
        notes.append(f"metrics.jsonl: line(s) {named}{more} are not rows (left out)")
    return rows


def _row(line: bytes) -> dict | None:
    """The row a metrics.jsonl line holds, or None."""
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    step = value.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    return value


def _by_step(rows: list) -> list:
    """``rows`` in step order, one per step (the last logged: a resumed run's)."""
    return [row for _, row in sorted({r["step"]: r for r in rows}.items())]


def distinct_names(paths) -> list[str]:
    """For each path, its shortest ending (last folder, then more) that no other path shares."""
    parts = [os.path.normpath(p).split(os.sep) for p in paths]
    names = []
    for mine in parts:
        for k in range(1, len(mine) + 1):
            name = os.sep.join(mine[-k:])
            if sum(1 for other in parts if os.sep.join(other[-k:]) == name) == 1:
                break
        names.append(name)
    return names


def number(value) -> float | None:
    """``value`` as a finite float, else None (null, NaN, a string in a hand-edited file)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
