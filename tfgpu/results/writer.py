"""What a run leaves in --model_dir, and what it prints. Only the chief writes.

config.json, metrics.jsonl (one JSON object per logged step or evaluation), summary.csv (one
row per evaluation, as timm's), tensorboard/ (train/ and eval/ scalars; at its top the run's
settings as hparams and its final metrics; evaluate/: what ``tfgpu.evaluate`` writes later,
the confusion matrix as an image), summary.json and final.weights.h5 (export/ is
``inference.export.serving``'s), and what other packages keep there (``write_files``: data/'s
data.json).
"""

import csv
import datetime
import io
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

from tfgpu.errors import warn
from tfgpu.files import append_text, open_append, read_lines, replacing, write_json
from tfgpu.results import tracking


class Window:
    """Sums of one logging window's train metrics (``metrics.StepMetrics`` and "steps" of the
    applied updates, "skipped_updates" of the others), and the run's throughput over every
    window but the first (which includes tracing and warm-up). A window whose updates were all
    skipped has no loss or accuracy (None: null in metrics.jsonl), never a made-up 0. Its
    record also says where its wall time went (``seconds``, and the ``*_seconds`` of what the
    loop's actions did inside it: ``pause``), so that a report can add the run's time up; its
    images/s and input wait are of the rest, the training."""

    def __init__(self):
        self._reset()
        self._timed_images, self._timed_seconds, self._windows = 0, 0.0, 0
        self._timed_wait = 0.0

    def _reset(self) -> None:
        self._sums: dict = {}
        self._paused: dict = {}  # {what: seconds} the actions took inside this window
        self._updates, self._start = 0, time.time()

    def pause(self, what: str, seconds: float) -> None:
        """Counts ``seconds`` of this window as spent on ``what`` ("evaluation",
        "checkpoint"): its record's ``<what>_seconds``."""
        self._paused[what] = self._paused.get(what, 0.0) + seconds

    LAST = ("weight_norm", "loss_scale")  # values at the window's end, not sums

    def add(self, totals: dict, updates: int) -> None:
        for key, value in totals.items():
            last = key in self.LAST
            self._sums[key] = value if last else self._sums.get(key, 0.0) + value
        self._updates += updates

    def close(self, step: int, learning_rate: float, global_batch: int) -> dict:
        """The window's metrics.jsonl record; starts the next window."""
        wall = time.time() - self._start
        # Training time only: what the actions did inside the window (an evaluation, a
        # checkpoint after the previous line) is no update's, as its *_seconds say.
        seconds = max(wall - sum(self._paused.values()), 1e-9)
        self.last_seconds, self.last_updates = seconds, self._updates
        images = self._updates * global_batch
        if self._windows:
            self._timed_images += images
            self._timed_seconds += seconds
        self._windows += 1
        s = self._sums
        applied = s.get("steps", 0.0)
        record = {
            "step": step,
            "split": "train",
            "loss": s.get("loss", 0.0) / applied if applied else None,
            "accuracy": s.get("correct", 0.0) / s["count"] if s.get("count") else None,
            "learning_rate": learning_rate,
            "images_per_sec": images / max(seconds, 1e-9),
            "skipped_updates": int(s.get("skipped_updates", 0.0)),
            "grad_norm": s.get("grad_norm", 0.0) / applied if applied else None,
            "clipped_updates": int(s.get("clipped", 0.0)),
            "skipped_records": int(s.get("skipped", 0.0)),
            "input_wait_fraction": min(s.get("input_wait_s", 0.0) / max(seconds, 1e-9), 1.0),
            "seconds": wall,
        }
        record.update({f"{what}_seconds": t for what, t in self._paused.items()})
        record.update({k: s[k] for k in self.LAST if k in s})
        if self._windows > 1:  # the first window includes tracing: not a fair share
            self._timed_wait += s.get("input_wait_s", 0.0)
        self._reset()
        return record

    def age(self) -> float:
        """Seconds since this window opened."""
        return time.time() - self._start

    @property
    def timed(self) -> bool:
        """True once a window past the first (tracing, warm-up) has closed."""
        return self._windows > 1

    def images_per_sec(self) -> float | None:
        """Images per second over the timed windows (None before the second window)."""
        return self._timed_images / self._timed_seconds if self._timed_seconds else None

    def input_wait_fraction(self) -> float | None:
        """The share of the timed windows' time the loop waited for batches."""
        return self._timed_wait / self._timed_seconds if self._timed_seconds else None


class RunWriter:
    """Writes the run's files and progress lines, and with --mlflow_tracking_uri hands the
    same to MLflow (``tracking``); a no-op on non-chief workers."""

    def __init__(self, model_dir: str, is_chief: bool):
        self.model_dir, self.is_chief = model_dir, is_chief
        self.tracker: tracking.Tracker | None = None
        if is_chief:
            os.makedirs(model_dir, exist_ok=True)
            tb = os.path.join(model_dir, "tensorboard")
            self._tb = {
                s: tf.summary.create_file_writer(os.path.join(tb, s)) for s in ("train", "eval")
            }
            self._tb["run"] = tf.summary.create_file_writer(tb)  # hparams and final metrics

    def info(self, line: str) -> None:
        if self.is_chief:
            print(line, flush=True)

    def write_config(self, settings: dict, backend, t) -> None:
        """config.json: every resolved setting (``settings``: {flag name: value}, the run's
        ``Config.flat()``) and the strategy as resolved on ``backend``; TensorBoard's hparams;
        with --mlflow_tracking_uri (``t``: the run's train section), the MLflow run."""
        if self.is_chief:
            resolved = dict(settings, strategy=backend.name, num_replicas=backend.num_replicas)
            write_json(os.path.join(self.model_dir, "config.json"), resolved)
            self._write_hparams(resolved)
            self._start_tracking(t, resolved)

    def write_files(self, files: dict) -> None:
        """The files other packages keep with the run (``files``: {name in --model_dir: JSON
        value}, as data/'s ``RunInput.recorded``: data.json)."""
        if self.is_chief:
            for name, value in files.items():
                write_json(os.path.join(self.model_dir, name), value)

    def _start_tracking(self, t, resolved: dict) -> None:
        if t.mlflow_tracking_uri:
            tracking.check_client()
            params = tracking.params_of(resolved)
            self.tracker = tracking.Tracker(
                t.mlflow_tracking_uri, t.mlflow_experiment, self.model_dir, params, t.export
            )

    def _write_hparams(self, resolved: dict) -> None:
        """The resolved settings as TensorBoard hparams, so that runs compare side by side in
        its HParams tab (``tensorboard --logdir`` over several model_dirs)."""
        from tensorboard.plugins.hparams import api as hp  # noqa: PLC0415 (with tensorboard)

        plain = (bool, int, float, str)
        values = {k: v if isinstance(v, plain) else str(v) for k, v in resolved.items()}
        with self._tb["run"].as_default():
            hp.hparams(values, trial_id=os.path.basename(os.path.abspath(self.model_dir)))
        self._tb["run"].flush()

    def _append(self, record: dict, split: str) -> None:
        with open_append(os.path.join(self.model_dir, METRICS), warn) as f:
            append_text(f, json.dumps(record) + "\n", METRICS)
        with self._tb[split].as_default(step=record["step"]):
            for key, value in record.items():
                if key not in ("step", "split") and isinstance(value, (int, float)):
                    tf.summary.scalar(key, value)
        self._tb[split].flush()
        if self.tracker:
            self.tracker.log_row(record)

    def log_train(self, record: dict, total_steps: int, global_batch: int) -> None:
        if self.is_chief:
            self._append(record, "train")
            print(format_progress(record, total_steps, global_batch), flush=True)

    def log_eval(
        self, step: int, result: dict, context: dict | None = None, again: bool = False
    ) -> None:
        """One evaluation: metrics.jsonl, TensorBoard, summary.csv and a line. ``context``:
        {"epoch", "learning_rate", "images_per_sec"} at that step, for summary.csv. ``again``:
        the files may hold an evaluation of ``step`` already (the final one of a run started
        again once finished, or stopped early there), which this one replaces."""
        if self.is_chief and result:
            if again:
                self._keep_rows(lambda at, evaluation: not (evaluation and at == step))
            self._append(dict(result, step=step, split="validation"), "eval")
            self._append_csv(dict(context or {}, **result, step=step))
            loss, bad = result["loss"], result.get("non_finite", 0)
            tta = result.get("tta", "none")
            print(
                f"eval  step {step}: top1 {result['top1']:.4f}  top5 {result['top5']:.4f}  "
                f"loss {'-' if loss is None else f'{loss:.4f}'}  ({result['num_examples']} "
                f"examples{f', {bad} with non-finite logits: counted wrong' if bad else ''}"
                f"{'' if tta == 'none' else f', TTA {tta}'})",
                flush=True,
            )

    def _append_csv(self, row: dict) -> None:
        """summary.csv: one row per evaluation, header once; a resumed run appends."""
        with open_append(os.path.join(self.model_dir, SUMMARY), warn) as f:
            text = io.StringIO()
            out = csv.DictWriter(text, SUMMARY_CSV, extrasaction="ignore")
            if os.fstat(f.fileno()).st_size == 0:
                out.writeheader()
            out.writerow({k: "" if row.get(k) is None else row[k] for k in SUMMARY_CSV})
            append_text(f, text.getvalue(), SUMMARY)

    def resume(self, step: int) -> None:
        """Once the checkpoint of ``step`` (0: none) is restored, metrics.jsonl and summary.csv
        keep only the rows up to it: later ones were written by a run that stopped before its
        next checkpoint, and the resumed run trains and writes them again, once."""
        self._keep_rows(lambda at, evaluation: at <= step)

    def _keep_rows(self, keep) -> None:
        """Rewrites metrics.jsonl and summary.csv with the rows ``keep(step, is_evaluation)``
        is true of, and the lines that are no rows (the header), without a torn last line (a
        kill in the middle of a write). A file is rewritten whole (a new file, then a rename),
        only when a line goes."""
        if not self.is_chief:
            return
        for name, row_of in ((METRICS, _jsonl_row), (SUMMARY, _csv_row)):
            path = os.path.join(self.model_dir, name)
            lines = read_lines(path) or []
            kept = [
                line
                for line in lines
                if line.endswith("\n") and (row_of(line) is None or keep(*row_of(line)))
            ]
            if kept != lines:
                with replacing(path) as f:
                    f.write("".join(kept).encode("utf-8", "surrogateescape"))

    def write_summary(self, summary: dict) -> None:
        if self.is_chief:
            write_json(os.path.join(self.model_dir, "summary.json"), summary)
            final = dict(summary.get("final_eval") or {})
            final["train_images_per_sec"] = summary.get("train_images_per_sec")
            with self._tb["run"].as_default(step=summary.get("steps", 0)):
                for key, value in final.items():
                    if isinstance(value, (int, float)):
                        tf.summary.scalar(f"final/{key}", value)
            self._tb["run"].flush()
            print("summary: " + json.dumps(summary), file=sys.stdout, flush=True)
            if self.tracker:
                self.tracker.finish(summary)


def final_eval_of(result: dict) -> dict:
    """summary.json's ``final_eval`` of an evaluation's ``result`` (``evaluator.Evaluator``)."""
    return {k: result.get(k) for k in ("top1", "top5", "loss", "non_finite", "tta")}


METRICS, SUMMARY = "metrics.jsonl", "summary.csv"


def timed(result: dict, seconds: float) -> dict:
    """An evaluation's ``result`` with the ``seconds`` it took (its metrics.jsonl row's);
    no result (the side-car evaluates) stays none."""
    return dict(result, seconds=seconds) if result else result


def eval_context(global_batch: int, num_train: int, optimizer):
    """``context(step, images_per_sec)``: what summary.csv puts next to an evaluation at
    ``step`` of a run of ``global_batch`` updates over ``num_train`` examples: the epoch,
    ``optimizer``'s learning rate then and the train images/s (of the last window logged).
    The loop's evaluations, the final one and the side-car's are logged with it."""

    def context(step: int, images_per_sec: float | None) -> dict:
        return {
            "epoch": round(step * global_batch / max(num_train, 1), 4),
            "learning_rate": float(optimizer.learning_rate),
            "images_per_sec": images_per_sec,
        }

    return context


def _jsonl_row(line: str):
    """(step, is an evaluation) of a metrics.jsonl line, None if it is not one of its rows."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        return None
    return record["step"], record.get("split") != "train"


def _csv_row(line: str):
    """(step, True) of a summary.csv row (every row is an evaluation), None for the header."""
    first = line.split(",", 1)[0]
    return (int(first), True) if first.isdigit() else None


SUMMARY_CSV = ("step", "epoch", "top1", "top5", "loss", "learning_rate", "images_per_sec")

# tensorboard/<this>: tfgpu.evaluate's own TensorBoard run, beside the run's train/ and eval/
# (never into eval/, which a run still training may be writing).
EVALUATE_TB = "evaluate"


def confusion_image(matrix, max_side: int = 512) -> np.ndarray:
    """A confusion matrix (counts; rows: true class, columns: predicted) as a heat map, uint8
    [C*s, C*s, 3]: each cell an s x s square (s = max_side // C, at least 1), its value the
    share of the row's examples (0 for a class without any), in black-red-yellow-white
    (brightness, R+G+B, grows with the share; a class always right has a white diagonal
    cell). Cells of 8 pixels or more are outlined in dark grey, so that equal ones stay apart."""
    counts = np.asarray(matrix, np.float64)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    # The "hot" colour map: red rises over the first third, then green, then blue.
    rgb = np.round(255 * np.clip(3 * shares[..., None] - np.arange(3), 0, 1)).astype(np.uint8)
    side = max(1, max_side // max(len(counts), 1))
    pixels = np.repeat(np.repeat(rgb, side, axis=0), side, axis=1)
    if side >= 8:
        pixels[::side], pixels[:, ::side] = 64, 64
    return pixels


def write_confusion_image(logdir: str, matrix, class_names, split: str, step: int) -> None:
    """``confusion_image(matrix)`` as TensorBoard image ``confusion_matrix/<split>`` at
    ``step`` (the checkpoint's update) in ``logdir``; its description names the classes in
    order, as TensorBoard shows it beside the image."""
    listed = ", ".join(f"{i}: {n}" for i, n in enumerate(class_names[:100]))
    more = f", ... ({len(class_names)} classes)" if len(class_names) > 100 else ""
    description = (
        "Rows: true class, columns: predicted; each row is the share of that class's examples "
        f"(black 0, red, yellow, white 1). Classes in order: {listed}{more}"
    )
    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default():
        image = confusion_image(matrix)[None]
        tf.summary.image(f"confusion_matrix/{split}", image, step=step, description=description)
    writer.close()


def format_progress(record: dict, total_steps: int, global_batch: int) -> str:
    """``step   200/600  loss 0.4123  acc 0.871  lr 1.8e-03  2,345 img/s  ETA 0:01:20``."""
    ips = record["images_per_sec"]
    remaining = (total_steps - record["step"]) * global_batch / max(ips, 1e-9)
    width = len(str(total_steps))
    loss, acc = record["loss"], record["accuracy"]
    line = (
        f"step {record['step']:>{width}}/{total_steps}  "
        f"loss {'-' if loss is None else f'{loss:.4f}'}  "
        f"acc {'-' if acc is None else f'{acc:.3f}'}  lr {record['learning_rate']:.2e}  "
        f"{ips:,.0f} img/s  ETA {datetime.timedelta(seconds=int(remaining))}"
    )
    if record.get("skipped_updates"):
        line += f"  skipped {record['skipped_updates']} update(s)"
    if record.get("grad_norm") is not None:
        line += f"  |g| {record['grad_norm']:.3g}"
    if "weight_norm" in record:
        line += f"  |w| {record['weight_norm']:.3g}"
    if record.get("clipped_updates"):
        line += f"  clipped {record['clipped_updates']}"
    if "loss_scale" in record:
        line += f"  scale {record['loss_scale']:g}"
    if record.get("input_wait_fraction", 0.0) >= 0.01:
        line += f"  input wait {record['input_wait_fraction']:.0%}"
        if record.get("input_images_per_sec"):
            line += f" (input alone {record['input_images_per_sec']:,.0f} img/s)"
    if "slowest_worker" in record:
        line += (
            f"  slowest {_slowest(record)}: {record['slowest_compute_s']:.3f} s"
            f"/update (median {record['median_compute_s']:.3f})"
        )
    return line


def _slowest(record: dict) -> str:
    """The slowest worker as the launcher names it (``consensus.named``); a row logged before
    the name was kept gives its index."""
    return record.get("slowest_worker_name") or f"worker {record['slowest_worker']}"


INPUT_BOUND = 0.10  # the share of step time waiting for input that is worth a warning


def input_bound_warning(fraction: float, train_ips: float, input_ips: float | None) -> str:
    """The one warning of a run that waits for its input, with the levers, in order."""
    alone = f"; the input pipeline alone reads {input_ips:,.0f} img/s" if input_ips else ""
    return (
        f"tfgpu: WARNING: the step waited for input {fraction:.0%} of the time (training at "
        f"{train_ips:,.0f} img/s{alone}). In order: --data_threads (a private tf.data pool), "
        "--cycle_length (files read at once), --cache_eval, --data_service (decode on other "
        "machines), --dct_scaled_decode=auto (large photos), smaller images at conversion "
        "(tools/to_tfrecord.py --max_side)"
    )
