"""The training run's settings (``config.train``): how big an update is, how long training
runs, when to log, evaluate, save and keep the best, and what is written at the end; with the
checks that need no TensorFlow and the numbers the loop derives from them (``split_batch``,
``micro_batch``, ``profile_window``). ``config/`` composes this section with the others'.

Light on purpose: ``config/`` reads it before TensorFlow starts (``--help``, a bad flag), and
importing it runs ``tfgpu/train/__init__.py``, which loads the loop only when it is asked for.
"""

import math
import urllib.parse
from dataclasses import dataclass

from tfgpu.errors import ConfigError
from tfgpu.metrics import BEST_METRICS
from tfgpu.settings import positive, setting

TTA_MODES = ("none", "flip", "flip_translate")  # --eval_tta: the views (step/loops.py)


@dataclass(frozen=True)
class TrainConfig:
    """How big an update is, how long training runs, and when to log, evaluate and save."""

    global_batch_size: int = setting(
        256, "Examples per optimizer update, over all replicas and micro-batches."
    )
    grad_accum_steps: int = setting(
        1,
        "Micro-batches per update; per-replica micro-batch = global / (replicas x "
        "grad_accum_steps).",
    )
    micro_batch_size: str = setting(
        "0",
        "Per-replica micro-batch that fits in memory (0: off); --grad_accum_steps then follows "
        "from the global batch and the number of replicas, so one command runs on any number "
        "of workers. auto: before the first update each worker tries the divisors of its "
        "per-replica batch, largest first, and all take the smallest that fits "
        "(docs/memory.md); an out-of-memory error later backs off to the next smaller one.",
    )
    memory_budget_gb: str = setting(
        "auto",
        "With --micro_batch_size=auto: the memory (GB) one train step may take at its peak, "
        "10% kept free of it. auto: on a GPU, what TensorFlow's allocator can give; on a CPU, "
        "the machine's available memory (/proc/meminfo MemAvailable) at the start.",
        per_node=True,
    )
    train_steps: int = setting(0, "Length of training in optimizer updates (0: use --epochs).")
    epochs: float = setting(
        0.0, "Length of training in passes over the train split (0: use --train_steps)."
    )
    steps_per_loop: int = setting(10, "Updates per tf.function call (fewer Python round trips).")
    eval_batch_size: int = setting(0, "Global evaluation batch (0: the training global batch).")
    eval_tta: str = setting(
        "none",
        "Test-time augmentation of every evaluation (the loop's, tfgpu.evaluate's, the "
        "side-car's): none; flip: each image and its left-right mirror, the model's softmax "
        "probabilities averaged (probabilities, not logits: timm and FFCV do either); loss, "
        "top1 and top5 from that average (twice evaluation's compute); or flip_translate "
        "(airbench's): those two views at weight 1/4 each, and the image shifted one pixel "
        "up-left and down-right (edges reflected) with their mirrors at 1/8 each (6x). Rows "
        "say their tta.",
        choices=TTA_MODES,
    )
    log_every_steps: int = setting(100, "Print and log train metrics every N updates.")
    log_every_s: float = setting(
        30.0,
        "... and after this many seconds without a line, at the next loop boundary (one "
        "process only: several log together, at the same step).",
    )
    eval_every_steps: int = setting(0, "Evaluate every N updates (0: only at the end).")
    eval_every_epochs: float = setting(
        0.0, "Evaluate every N passes over the train split (0: only at the end)."
    )
    checkpoint_every_steps: int = setting(
        1000, "Write a checkpoint every N updates (and always at the end)."
    )
    keep_checkpoints: int = setting(3, "Checkpoints kept (the newest).")
    average_checkpoints: int = setting(
        0,
        "At the end, the final model (final_eval, final.weights.h5, export) is the element-wise "
        "mean of the last K checkpoints' weights, as timm's avg_checkpoints (with --ema_decay "
        "their EMA weights; BatchNorm statistics too; no optimizer state); the final checkpoint "
        "keeps the last trained state. Needs --keep_checkpoints >= K and K checkpoints written "
        "(--checkpoint_every_steps). 0: off. A finished run: tfgpu-average.",
    )
    keep_best: int = setting(
        0,
        "Keep the K best evaluated checkpoints in model_dir/best/ (best/best.json lists them, "
        "best first); needs --eval_every_steps or --eval_every_epochs (0: off).",
    )
    best_metric: str = setting(
        "",
        "What 'best' means for --keep_best, --early_stop_patience and --export_best: top1 "
        "(the default), top5 (both higher is better) or loss (lower is better).",
    )
    early_stop_patience: int = setting(
        0,
        "Stop after N evaluations in a row without improving --best_metric (then final "
        "checkpoint, evaluation and export as usual; summary.json says so). 0: off.",
    )
    sidecar_eval: bool = setting(
        False,
        "A side-car evaluates (tfgpu.evaluate --watch; docs/evaluator.md), not the loop, not "
        "even at the end; --keep_best is the side-car's, --early_stop_patience reads its count.",
    )
    export_best: bool = setting(
        False,
        "At the end, export the best evaluated model (by --best_metric) instead of the last "
        "(the best evaluation so far is in the checkpoint: a resumed run keeps it).",
    )
    profile_steps: str = setting(
        "",
        "A:B: write a TensorBoard profiler trace of updates A..B (A >= 2: update 1 traces and "
        "compiles the step) into --model_dir's tensorboard/ folder, on the chief (empty: off).",
    )
    profile_all_workers: bool = setting(
        False, "With --profile_steps: trace every worker (worker i under tensorboard/worker<i>)."
    )
    export: bool = setting(
        True,
        "At the end, export the model as .keras and as a SavedModel (signatures for uint8 "
        "images, encoded image bytes and tf.Examples; tfgpu-export: docs/deploying.md).",
    )
    # Only the chief logs to MLflow, and a restart may point elsewhere: per node.
    mlflow_tracking_uri: str = setting(
        "",
        "Log the run to MLflow: a tracking server (http://host:5000; a local store such as "
        "sqlite:///FILE needs the full mlflow package); empty: the MLFLOW_TRACKING_URI "
        "environment variable, else off. The chief logs the settings as params, every train "
        "and evaluation row as metrics at its step, the summary, and at the end the run's "
        "files and export as artifacts; a resumed run continues its MLflow run. Needs the "
        "[mlflow] extra (docs/reports.md).",
        per_node=True,
    )
    mlflow_experiment: str = setting(
        "",
        "The MLflow experiment of --mlflow_tracking_uri (made if new); empty: the "
        "MLFLOW_EXPERIMENT_NAME environment variable, else MLflow's Default experiment.",
        per_node=True,
    )

    @property
    def best_by(self) -> str:
        """The metric that decides "best": --best_metric, top1 when not set."""
        return self.best_metric or "top1"

    @property
    def tracks_best(self) -> bool:
        """True when the run keeps its best evaluation (in its checkpoints)."""
        return bool(
            self.keep_best or self.early_stop_patience or self.export_best or self.best_metric
        )

    @property
    def tracks_best_in_loop(self) -> bool:
        """True when the trainer itself keeps its best evaluation (in its checkpoints): not
        when a side-car evaluates (--sidecar_eval), which keeps it (``inference.sidecar``)."""
        return self.tracks_best and not self.sidecar_eval

    def updates(self, num_train: int) -> int:
        """The run's length in optimizer updates, over a train split of ``num_train``
        examples: --train_steps, else --epochs (1 when neither) of --global_batch_size."""
        if self.train_steps:
            return self.train_steps
        return max(1, int((self.epochs or 1.0) * num_train // self.global_batch_size))


def check_best(t) -> None:
    """Raises a ConfigError for a best-checkpoint setting of ``t`` (the run's ``config.train``)
    that cannot work: an unknown metric, a negative count, no evaluations to compare, a side-car
    beside evaluations in the loop."""
    if t.best_metric and t.best_metric not in BEST_METRICS:
        raise ConfigError(
            f"--best_metric={t.best_metric!r} is unknown; choose from {', '.join(BEST_METRICS)}"
        )
    if t.keep_best < 0 or t.early_stop_patience < 0:
        raise ConfigError("--keep_best and --early_stop_patience must not be negative")
    in_loop = t.eval_every_steps or t.eval_every_epochs
    if t.sidecar_eval and in_loop:
        raise ConfigError(
            "--sidecar_eval: evaluation is the side-car's, so --eval_every_steps and "
            "--eval_every_epochs must be 0"
        )
    if t.sidecar_eval and t.export_best:
        # The side-car evaluates the last checkpoint after the trainer has ended.
        raise ConfigError(
            "--export_best needs evaluations in the loop; with --sidecar_eval the best is in "
            "best/ once the side-car has ended (--checkpoint=best of tfgpu-evaluate, tfgpu-predict)"
        )
    if t.tracks_best and not (in_loop or t.sidecar_eval):
        given = [
            f"--{name}"
            for name in ("keep_best", "best_metric", "early_stop_patience", "export_best")
            if getattr(t, name)
        ]
        raise ConfigError(
            f"{', '.join(given)} need(s) evaluations during training: set --eval_every_steps "
            "or --eval_every_epochs (or --sidecar_eval, with a side-car evaluator)"
        )


def check_train(t: TrainConfig) -> None:
    positive(t, "global_batch_size", "grad_accum_steps", "steps_per_loop")
    positive(t, "log_every_steps", "checkpoint_every_steps", "keep_checkpoints")
    if t.global_batch_size % t.grad_accum_steps:
        raise ConfigError(
            f"--global_batch_size={t.global_batch_size} does not divide by "
            f"--grad_accum_steps={t.grad_accum_steps}"
        )
    micro = micro_batch(t)  # raises for what is neither a count nor auto
    if micro != 0 and t.grad_accum_steps != 1:
        raise ConfigError("set --grad_accum_steps or --micro_batch_size, not both")
    budget = memory_budget_bytes(t)
    if budget is not None and micro != AUTO:
        raise ConfigError("--memory_budget_gb is for --micro_batch_size=auto")
    if t.train_steps < 0 or t.epochs < 0:
        raise ConfigError("--train_steps and --epochs must not be negative")
    if t.eval_every_steps and t.eval_every_epochs:
        raise ConfigError("set --eval_every_steps or --eval_every_epochs, not both")
    if t.train_steps and t.epochs:
        raise ConfigError("set --train_steps or --epochs, not both")
    check_best(t)
    check_average(t)
    check_tracking(t)
    profile_window(t)
    if t.profile_all_workers and not t.profile_steps:
        raise ConfigError("--profile_all_workers needs --profile_steps=A:B")


def check_tracking(t: TrainConfig) -> None:
    """Raises a ConfigError for an --mlflow_tracking_uri that is no URI, or that holds a
    password, which config.json and the logs would show (MLflow reads its credentials from
    MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN)."""
    try:
        password = urllib.parse.urlsplit(t.mlflow_tracking_uri).password
    except ValueError as err:
        raise ConfigError(f"--mlflow_tracking_uri={t.mlflow_tracking_uri!r}: {err}") from None
    if password is not None:
        raise ConfigError(
            "--mlflow_tracking_uri holds a password, which config.json and the logs would "
            "show: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD instead"
        )


def check_average(t: TrainConfig) -> None:
    """Raises a ConfigError for an --average_checkpoints of ``t`` (the run's ``config.train``)
    that cannot work: negative, more than the checkpoints kept, or beside --export_best
    (the export is either the average or the best checkpoint)."""
    k = t.average_checkpoints
    if k < 0:
        raise ConfigError(f"--average_checkpoints={k} must not be negative (0: off)")
    if k > t.keep_checkpoints:
        raise ConfigError(
            f"--average_checkpoints={k} averages the last {k} checkpoints, but only "
            f"--keep_checkpoints={t.keep_checkpoints} are kept: set --keep_checkpoints={k} or more"
        )
    if k and t.export_best:
        raise ConfigError(
            "--average_checkpoints and --export_best do not go together: the export is the "
            "average of the last checkpoints or the best one"
        )


def check_average_plan(t: TrainConfig, total_steps: int) -> None:
    """Raises a ConfigError when a run of ``total_steps`` updates under ``t`` writes fewer
    checkpoints (one every --checkpoint_every_steps, and the last step's) than
    --average_checkpoints averages. Known once the data is: --epochs count in its examples."""
    k, every = t.average_checkpoints, t.checkpoint_every_steps
    written = total_steps // every + (1 if total_steps % every else 0)
    if k > written:
        fix = (
            f"set --checkpoint_every_steps={total_steps // k} or less"
            if total_steps >= k
            else f"train {k} updates or more"
        )
        raise ConfigError(
            f"--average_checkpoints={k}: {total_steps} updates with --checkpoint_every_steps="
            f"{every} write {written} checkpoint(s); {fix}"
        )


def profile_window(train: TrainConfig) -> tuple[int, int] | None:
    """(A, B) of --profile_steps=A:B, None when off; a ConfigError names a bad value."""
    text = train.profile_steps.strip()
    if not text:
        return None
    first, sep, last = text.partition(":")
    if sep and first.strip().isdigit() and last.strip().isdigit():
        a, b = int(first), int(last)
        if 2 <= a <= b:
            return a, b
    raise ConfigError(
        f"--profile_steps={text!r} must be A:B with 2 <= A <= B (updates; update 1 traces "
        "and compiles the step)"
    )


def split_batch(train: TrainConfig, num_replicas: int) -> tuple[int, int]:
    """(examples per replica per update, micro-batches per update) of ``num_replicas``:
    --grad_accum_steps, or with --micro_batch_size=M as many as make M per micro-batch, so
    that one command keeps its global batch on any number of workers (``auto``: one
    micro-batch, until a run chooses its size). A batch that does not split is a ConfigError
    naming the numbers."""
    g, m = train.global_batch_size, micro_batch(train)
    m = 0 if m == AUTO else m  # one micro-batch until a run chooses (train/micro_batch.py)
    if g % num_replicas:
        raise ConfigError(f"--global_batch_size={g} does not divide by {num_replicas} replicas")
    replica_batch = g // num_replicas
    if m:
        if replica_batch % m:
            raise ConfigError(
                f"--global_batch_size={g} over {num_replicas} replicas is {replica_batch} per "
                f"replica, which does not divide into micro-batches of --micro_batch_size={m}"
            )
        return replica_batch, replica_batch // m
    k = train.grad_accum_steps
    if g % (num_replicas * k):
        raise ConfigError(
            f"--global_batch_size={g} does not divide by "
            f"{num_replicas} replicas x --grad_accum_steps={k} = {num_replicas * k}"
        )
    return replica_batch, k


AUTO = "auto"  # --micro_batch_size=auto, --memory_budget_gb=auto


def micro_batch(train: TrainConfig) -> int | str:
    """--micro_batch_size of ``train``: a count (0: off) or AUTO; a ConfigError names
    anything else in one line (a count given as a number, as the Python API may, is read so)."""
    text = str(train.micro_batch_size).strip().lower()
    if text == AUTO:
        return AUTO
    if text.isascii() and text.isdigit():
        return int(text)
    raise ConfigError(
        f"--micro_batch_size={train.micro_batch_size!r} must be a count of examples (0: off) "
        "or auto"
    )


def memory_budget_bytes(train: TrainConfig) -> int | None:
    """--memory_budget_gb of ``train`` in bytes, None for auto; a ConfigError names a value
    that is not a positive, finite number of GB (or one under a megabyte)."""
    text = str(train.memory_budget_gb).strip().lower()
    if text == AUTO:
        return None
    try:
        gb = float(text)
    except ValueError:
        gb = math.nan
    if not (math.isfinite(gb) and gb * 1e9 >= 1e6):
        raise ConfigError(
            f"--memory_budget_gb={train.memory_budget_gb!r} must be a positive number of GB "
            "(at least 0.001) or auto"
        )
    return int(gb * 1e9)
