"""The best evaluations of a run and their checkpoints (--keep_best, --early_stop_patience,
--export_best): ``Best`` keeps them, for the loop's actions (``train.actions.KeepBest``,
``EarlyStop``) and for the side-car evaluator (``inference.sidecar``); ``best_checkpoint``
reads best/best.json for ``--checkpoint=best``; ``read_sidecar`` the side-car's own file.

The best value so far, its step and the evaluations since it improved are tf.Variables saved
in every checkpoint (``tracked()``), so a resumed run compares against what it had found
before it stopped (what keras#17012 loses: a restarted ``ModelCheckpoint`` forgets its best).
The K best checkpoints themselves are ``model_dir/best/ckpt-S`` (the run's whole checkpoint,
written with ``tf.train.Checkpoint.write``) listed in ``best/best.json``, best first:

    {"metric": "loss", "mode": "min", "kept": [{"step": S, "checkpoint": PATH, "loss": ...,
     "top1": ..., "top5": ...}, ...]}

Every worker takes part in writing one (reading sync-on-read variables is collective; the
others write to scratch, ``Backend.checkpoint_dir``); only the chief writes best.json. Every
worker decides alike: the evaluation is all-reduced, and the kept list is the chief's.

The settings are checked before TensorFlow starts (``train.config.check_best``, called by
``config.validate``): TensorFlow is imported only when a run builds its ``Best``.
"""

import glob
import json
import math
import os

from tfgpu.files import pause_for_tests, read_json, write_json
from tfgpu.metrics import BEST_METRICS

BEST_DIR = "best"
BEST_FILE = "best.json"
# What a side-car evaluator (inference.sidecar) has done, for itself and for the trainers to read:
# {"step": its last evaluated checkpoint, "result": that evaluation, and when it keeps the best:
#  "metric", "best_step", "best_value", "evals_since_best"}.
SIDECAR_FILE = "sidecar.json"


# The fields of SIDECAR_FILE that are read back, and what each must be (None: not yet known).
_SIDECAR_NUMBERS = {"step": int, "evals_since_best": int, "best_step": int, "best_value": float}


def read_sidecar(model_dir: str) -> dict:
    """The side-car's ``SIDECAR_FILE`` in ``model_dir``; {} when there is none, it does not
    read (it is written atomically: never half of one) or a field read back is not a number
    of its kind (a file from elsewhere must not stop the trainers nor the watcher)."""
    try:
        state = read_json(os.path.join(model_dir, SIDECAR_FILE))
    except ValueError:
        return {}
    for key, kind in _SIDECAR_NUMBERS.items():
        value = state.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, kind))):
            return {}
    return state


class Best:
    """The run's best evaluation and its kept checkpoints."""

    def __init__(self, train, backend, model_dir: str):
        """``train``: the run's ``config.train``."""
        import tensorflow as tf  # noqa: PLC0415 (the settings' checks above import without it)

        self.metric = train.best_by
        self.mode = BEST_METRICS[self.metric]
        self.keep = train.keep_best or (1 if train.export_best else 0)  # the best, to export
        self.directory = os.path.join(model_dir, BEST_DIR)
        self._backend = backend
        worst = math.inf if self.mode == "min" else -math.inf
        self.value = tf.Variable(worst, dtype=tf.float64, trainable=False)
        self.step = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self.stale = tf.Variable(0, dtype=tf.int64, trainable=False)  # evaluations since best
        self.kept: list[dict] = []
        self.checkpoint = None  # the run's tf.train.Checkpoint, set by build()
        self._scratch: dict = {}  # step -> the copy a non-chief wrote (in its scratch dir)

    def tracked(self) -> dict:
        """What the run's checkpoints save of it."""
        return {"best_value": self.value, "best_step": self.step, "evals_since_best": self.stale}

    def better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def resume(self, step: int) -> None:
        """After the checkpoint of ``step`` is restored: the kept list of the chief's
        best.json, without checkpoints written after ``step`` (a run that died after them)."""
        blob = b"[]"
        if self._backend.is_chief:
            try:
                blob = json.dumps(
                    read_json(os.path.join(self.directory, BEST_FILE)).get("kept", [])
                )
                blob = blob.encode()
            except ValueError:
                pass  # unreadable: start the list again (the best value is in the checkpoint)
        kept = json.loads(self._backend.all_gather_bytes(blob)[0])
        self.kept = [e for e in kept if e["step"] <= step]

    def observe(self, step: int, result: dict) -> bool:
        """Takes the evaluation of ``step``; True when it is the best so far. Writes its
        checkpoint when it is among the --keep_best best."""
        value = float(result[self.metric])
        improved = self.better(value, float(self.value.numpy()))
        if improved:
            self.value.assign(value)
            self.step.assign(step)
            self.stale.assign(0)
        else:
            self.stale.assign_add(1)
        if self.keep and not any(e["step"] == step for e in self.kept):
            self._keep(step, value, result)
        return improved

    def _keep(self, step: int, value: float, result: dict) -> None:
        entry = {"step": step, **{k: float(result[k]) for k in ("loss", "top1", "top5")}}
        ranked = sorted(
            [*self.kept, entry], key=lambda e: e[self.metric], reverse=self.mode == "max"
        )
        if entry not in ranked[: self.keep]:
            return
        prefix = os.path.join(self._backend.checkpoint_dir(self.directory), f"ckpt-{step}")
        entry["checkpoint"] = self.checkpoint.write(prefix)
        pause_for_tests("best")
        if not self._backend.is_chief:
            self._scratch[step] = entry["checkpoint"]
        for dropped in ranked[self.keep :]:
            self._remove(dropped)
        self.kept = ranked[: self.keep]
        if self._backend.is_chief:
            os.makedirs(self.directory, exist_ok=True)
            doc = {"metric": self.metric, "mode": self.mode, "kept": self.kept}
            write_json(os.path.join(self.directory, BEST_FILE), doc)

    def _remove(self, entry: dict) -> None:
        """Deletes a dropped checkpoint's files: the chief its own, in best/ (by name: the
        path in a resumed list may be relative to where an earlier run started), another
        worker only the scratch copy it wrote (a resumed list is the chief's, whose files on
        a shared disk are the chief's to delete: were both to delete them, one would fail)."""
        if self._backend.is_chief:
            prefix = os.path.join(self.directory, os.path.basename(entry["checkpoint"]))
        else:
            prefix = self._scratch.pop(entry["step"], "")
        for path in glob.glob(glob.escape(prefix) + ".*") if prefix else ():
            os.remove(path)

    def summary(self) -> dict:
        """summary.json's "best": the metric, its best value and the step that reached it."""
        step = int(self.step.numpy())
        return {
            "metric": self.metric,
            "step": step if step >= 0 else None,
            "value": float(self.value.numpy()) if step >= 0 else None,
        }


def best_checkpoint(model_dir: str) -> str:
    """The path of the best kept checkpoint of ``model_dir`` (best/best.json), or "". It is
    looked for in ``model_dir/best/`` by its name: the path in best.json is the one the run
    wrote, relative to where it started when its --model_dir was, stale once the folder moved."""
    try:
        kept = read_json(os.path.join(model_dir, BEST_DIR, BEST_FILE)).get("kept", [])
    except ValueError:
        return ""
    return (
        os.path.join(model_dir, BEST_DIR, os.path.basename(kept[0]["checkpoint"])) if kept else ""
    )
