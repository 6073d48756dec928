"""The first minutes on a GPU machine: is tfgpu as fast as it should be here, and is the step
where it should be? One command, one table, meant to take at most ~8 minutes on one GPU:

    python bench/gpu_check.py [--reference=a100|v100|t4] [--time_budget_s=480]
    python bench/gpu_check.py --dry_run      # every path on a CPU, tiny sizes (no figures)

Rows:
  <model> <setting>: images/s of tfgpu's train loop (``loops.make_train_loop`` over
      ``train.loop.assemble``'s step) on synthetic ImageNet-shaped batches, float32, mixed_float16
      and mixed_float16 + XLA, at the largest batch that fits (doubling from --start_batch up to
      --max_batch; halving instead when the first one runs out of memory; mixed_float16 from twice
      float32's batch, XLA at mixed_float16's), next to NVIDIA's published single-GPU training
      throughput for that model and precision, and the ratio.
      resnet50 always; then efficientnet_b0 and densenet121 while --time_budget_s lasts.
  input pipeline: images/s of tfgpu's reader on a small generated TFRecord set with the
      resize on the device (what --resize_on=auto does with a GPU): the reader alone, and the
      reader plus the step's resize and preparation on the device.
  ops with a GPU kernel: every op of the train step (``compat.ops_without_gpu_kernel``, the
      check of tests/step/test_gpu_kernels.py) has a GPU kernel for its dtypes.
  ops placed on the CPU: what TensorFlow's placer logged for the step's ops on this machine
      (``tf.debugging.set_log_device_placement``), function inputs and outputs aside.
  micro-batch auto: --micro_batch_size=auto's search (``train/micro_batch.search``: real
      updates at each divisor, largest first, TensorFlow's out-of-memory error caught, 10% kept
      beyond the allocator's peak) over a replica batch of twice --max_batch, then the chosen
      size measured as a batch of its own; OK when one fits and trains. The dry run injects an
      out-of-memory error above a quarter of that batch (the test hook TFGPU_TEST_OOM_ABOVE).
  all-reduces per update: the backend's count of gradient all-reduces against the updates
      run (what tests/step/test_step.py asserts), and on 2+ GPUs the collective ops in the loop's
      graph: one NcclAllReduce per replica is one batched NCCL all-reduce per update.

Without a GPU it prints one line and exits 2, unless --dry_run (tiny_cnn at 32x32, batches of
2-4, 1-2 updates: every path runs, nothing is a measurement; GPU-only cells say "skipped: no
GPU") or --allow_cpu (the real sizes on the CPU: slow). Exit 1 when a check fails or raises
(its row says FAIL and the error; the table still comes out).
"""

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from calibration import calibration  # noqa: E402
from gpu_probes import (  # noqa: E402
    Measured,
    largest_batch,
    log_placement_to_file,
    measure,
    probe_step,
    replicated_loop,
    run_config,
)

MODELS = ("resnet50", "efficientnet_b0", "densenet121")
SETTINGS = (  # (row name, dtype policy, XLA)
    ("float32", "float32", False),
    ("mixed_float16", "mixed_float16", False),
    ("mixed_float16 + XLA", "mixed_float16", True),
)
GO_ON = "--dry_run or --allow_cpu to go on without one"


@dataclasses.dataclass(frozen=True)
class Reference:
    images_per_sec: float
    what: str  # the published configuration, for the table


# NVIDIA's published training throughput on ONE GPU (images/s, ImageNet 224x224 from
# TFRecords, XLA on in every figure they publish), from NVIDIA/DeepLearningExamples at master
# (commit 729963dd, 2024), the newest version of each README:
# - resnet50: TensorFlow/Classification/ConvNets/resnet50v1.5/README.md, "Training performance
#   results" (TF1 20.06 container: their TensorFlow2 ConvNets hold no ResNet-50; this is the
#   same ResNet-50 v1.5). A100 = DGX A100 40GB, TF32 for float32; V100 = DGX-1 V100 16GB.
# - efficientnet_b0: TensorFlow2/Classification/ConvNets/efficientnet_v1/README.md, "Training
#   performance results for EfficientNet v1-B0" (21.09-tf2 container, AutoAugment on the
#   host). A100 = DGX A100 80GB, TF32 for float32; V100 = DGX-1 V100 32GB.
# - densenet121: in none of their TensorFlow tables. T4: they publish T4 inference only.
# Both tables publish float16 with XLA only: the mixed_float16 row without XLA is held
# against that same figure, and says so.
REFERENCES = {
    "a100": {
        ("resnet50", "float32"): Reference(909, "TF32+XLA b256, A100 40GB"),
        ("resnet50", "mixed_float16"): Reference(2375, "AMP+XLA b256, A100 40GB"),
        ("efficientnet_b0", "float32"): Reference(1209, "TF32+XLA b512, A100 80GB"),
        ("efficientnet_b0", "mixed_float16"): Reference(3454, "AMP+XLA b1024, A100 80GB"),
    },
    "v100": {
        ("resnet50", "float32"): Reference(412, "FP32+XLA b128, V100 16GB"),
        ("resnet50", "mixed_float16"): Reference(1270, "AMP+XLA b256, V100 16GB"),
        ("efficientnet_b0", "float32"): Reference(752, "FP32+XLA b256, V100 32GB"),
        # NVIDIA's known issue: B0 gains little from AMP, its AutoAugment on the CPU binds.
        ("efficientnet_b0", "mixed_float16"): Reference(868, "AMP+XLA b512, V100 32GB"),
    },
    "t4": {},
}


@dataclasses.dataclass
class Row:
    check: str
    measured: str
    reference: str = "-"
    ratio: str = "-"
    notes: str = ""
    ok: bool | None = None  # None: not a pass/fail check (or skipped)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference", default="a100", choices=sorted(REFERENCES))
    p.add_argument("--time_budget_s", type=float, default=480.0, help="for the other models")
    p.add_argument("--models", default=",".join(MODELS), help="the first always runs")
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--start_batch", type=int, default=128)
    p.add_argument("--max_batch", type=int, default=512)
    p.add_argument("--warmup_steps", type=int, default=5, help="untimed: trace, compile, tune")
    p.add_argument("--steps", type=int, default=20, help="timed updates per measurement")
    p.add_argument("--input_batch", type=int, default=64, help="also the step checks' batch")
    p.add_argument("--input_images", type=int, default=512, help="generated JPEGs")
    p.add_argument("--input_seconds", type=float, default=5.0)
    p.add_argument("--cache_dir", default=os.path.expanduser("~/.cache/tfgpu/gpu_check"))
    p.add_argument("--dry_run", action="store_true", help="every path on a CPU, tiny sizes")
    p.add_argument("--allow_cpu", action="store_true", help="run the real sizes without GPU")
    args = p.parse_args(argv)
    from tfgpu import models  # its registry's names need no TensorFlow

    unknown = sorted(set(args.models.split(",")) - set(models.MODELS))
    if unknown:
        p.error(f"--models: {', '.join(unknown)} not in tfgpu's registry")
    if args.dry_run:  # tiny everything; the data goes to a temporary folder, not the cache
        # The search starts at its cap: one measurement a setting (its doubling and backing
        # off: the batch-search test of tests/e2e/test_gpu_check.py, ~1 CPU-s less here).
        tiny = dict(image_size=32, start_batch=4, max_batch=4, warmup_steps=1, steps=1)
        tiny.update(input_batch=4, input_images=16, input_seconds=0.3, cache_dir="")
        args = argparse.Namespace(**{**vars(args), **tiny})
    return args


def first_model(args) -> str:
    """The model of the step checks and of the 2+ GPU run: the first of --models."""
    return args.models.split(",")[0]


# --- the rows ---------------------------------------------------------------------------


def throughput_row(args, model: str, setting: tuple, measured, skipped: str = "") -> Row:
    """One model x setting row: images/s at the batch found (``skipped``: why not measured),
    NVIDIA's figure for --reference, the ratio."""
    name, dtype, _ = setting
    ref = REFERENCES[args.reference].get((model, dtype))
    row = Row(f"{model} {name}", skipped or "out of memory at batch 1")
    if measured is not None:
        row.measured = f"{measured.images_per_sec:,.0f} img/s (batch {measured.batch})"
    if ref is None:
        row.reference = "n/a (not published)"
    else:
        row.reference = f"{ref.images_per_sec:,.0f} ({ref.what})"
    if ref is not None and measured is not None and not args.dry_run:
        row.ratio = f"{measured.images_per_sec / ref.images_per_sec:.2f}"
    if args.dry_run and not skipped:
        row.notes = f"dry run: tiny_cnn {args.image_size}x{args.image_size} on the CPU"
    return row


def search(args, model: str, setting: tuple, start: int, cap: int):
    """``largest_batch`` of ``model`` under ``setting`` (name, dtype, XLA) from ``start``."""
    _, dtype, jit = setting
    return largest_batch(lambda b: measure(args, model, dtype, jit, b), start, cap)


def measure_model(args, model: str, start: int, deadline=None, estimates=None):
    """The three settings of ``model``, each search from what the one before found: float32
    from ``start``, mixed_float16 from twice float32's batch (float16 activations take half
    the memory), XLA at mixed_float16's (capped there: those two rows share a batch). With
    ``deadline``, a setting whose ``estimates`` [s] would pass it is skipped. Returns (rows,
    {setting: Measured or None}, {setting: seconds taken})."""
    rows, found, seconds = [], {}, {}
    cap = args.max_batch
    for setting in SETTINGS:
        name = setting[0]
        if deadline is not None and time.monotonic() + estimates.get(name, math.inf) > deadline:
            rows.append(throughput_row(args, model, setting, None, "skipped: --time_budget_s"))
            continue
        began = time.monotonic()
        best = search(args, model, setting, start, cap)
        seconds[name] = time.monotonic() - began
        found[name] = best[1] if best else None
        rows.append(throughput_row(args, model, setting, found[name]))
        print(f"  {rows[-1].check}: {rows[-1].measured} ({seconds[name]:.0f} s)", flush=True)
        if best:
            start, cap = (2 * best[0], cap) if name == "float32" else (best[0], best[0])
    return rows, found, seconds


def all_reduce_row(measured: Measured) -> Row:
    """One gradient all-reduce per update, as the backend counted them in a measured run."""
    ok = measured.all_reduces == measured.updates > 0
    text = f"{measured.all_reduces / max(measured.updates, 1):g} per update "
    text += f"({measured.all_reduces} in {measured.updates} updates, one device)"
    return Row("gradient all-reduces per update", text if ok else "FAIL: " + text, ok=ok)


def nccl_row(args, num_gpus: int) -> Row:
    """On 2+ GPUs: the collectives of a mirrored loop (one NcclAllReduce per replica is one
    batched NCCL all-reduce per update) and its all-reduce count."""
    name = "NCCL all-reduce, 2+ GPUs"
    if num_gpus == 1 or (num_gpus == 0 and not args.dry_run):
        return Row(name, f"skipped: {num_gpus} GPU (needs 2+)" if num_gpus else "skipped: no GPU")
    if num_gpus == 0:  # dry run: NCCL traced (it cannot run on CPUs), the count from auto
        ops, _, _ = replicated_loop(args, first_model(args), 2, "nccl", 0)
        _, updates, reduces = replicated_loop(args, first_model(args), 2, "auto", 2)
        note = "dry run, 2 logical CPU devices: traced with --all_reduce_alg=nccl: "
        note += f"{dict(ops)}; run with auto: {reduces} all-reduces in {updates} updates"
        return Row(name, "skipped: no GPU", notes=note)
    n = num_gpus
    ops, updates, reduces = replicated_loop(args, first_model(args), n, "auto", 2)
    ok = ops.get("NcclAllReduce", 0) == n and reduces == updates
    text = f"{ops.get('NcclAllReduce', 0)} NcclAllReduce ops for {n} replicas; "
    text += f"{reduces} all-reduces in {updates} updates"
    return Row(name, text if ok else "FAIL: " + text, notes=f"collectives: {dict(ops)}", ok=ok)


def auto_micro_batch_row(args) -> Row:
    """--micro_batch_size=auto on this device (the module docstring's row)."""
    from tfgpu.distribute.backends import build_backend
    from tfgpu.step import memory
    from tfgpu.train import loop, micro_batch

    name, batch, model = "micro-batch auto", 2 * args.max_batch, first_model(args)
    config = run_config(args, model, "float32", False, batch, micro_batch_size="auto")
    hook = {memory.TEST_HOOK: str(batch // 4)} if args.dry_run else {}
    saved = {k: os.environ.get(k) for k in hook}
    os.environ.update(hook)
    try:
        device = memory.this_device(None)
        inputs = loop.input_of(config, build_backend("default"))
        one_update = loop.scratch_update(config, inputs)
        tried = micro_batch.search(one_update, batch, device)
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    text = "; ".join(m.describe() for m in tried)
    if not (tried and tried[-1].fits):
        return Row(name, f"FAIL: no micro-batch of {batch} fits: {text}", ok=False)
    chosen = tried[-1].size
    trained = measure(args, model, "float32", False, chosen)
    if trained is None:
        return Row(name, f"FAIL: {chosen} chosen, then out of memory: {text}", ok=False)
    note = f"float32 {model}, replica batch {batch}, {device.describe()}"
    note += "; out of memory injected above " + hook[memory.TEST_HOOK] if hook else ""
    measured = f"{chosen} of {batch} ({text}); {trained.images_per_sec:,.0f} img/s at {chosen}"
    return Row(name, measured, notes=note, ok=True)


def step_rows(args, log_fd: int, num_gpus: int) -> list[Row]:
    """The rows of ``probe_step``: GPU kernels, placement, input rate."""
    probe = probe_step(args, first_model(args), log_fd)
    rows = [kernel_row(probe.missing), placement_row(probe.placed, num_gpus)]
    text = f"{probe.images_per_sec:,.0f} img/s (reader alone {probe.reader_images_per_sec:,.0f})"
    note = f"{args.input_images} generated JPEGs 350-500 px, batch {args.input_batch}, "
    note += f"{len(os.sched_getaffinity(0))} host cores"
    rows.append(Row("input pipeline, resize on device", text, "n/a (not published)", notes=note))
    return rows


def kernel_row(missing: set) -> Row:
    if missing:
        text = "FAIL: none for " + ", ".join(sorted(missing))
        return Row("train step ops with a GPU kernel", text, ok=False)
    return Row("train step ops with a GPU kernel", "all", notes="kernel registry", ok=True)


def placement_row(placed: list, num_gpus: int) -> Row:
    name = "train step ops placed on the CPU"
    on_cpu = sorted({op for op, device in placed if ":CPU:" in device})
    if not placed:
        return Row(name, "n/a: TensorFlow logged no placement")
    count = sum(":CPU:" in device for _, device in placed)
    if not num_gpus:
        note = f"placement log read: {count} of {len(placed)} ops on a CPU, as there is no GPU"
        return Row(name, "skipped: no GPU", notes=note)
    if on_cpu:
        return Row(name, f"FAIL: {count} of {len(placed)}: {', '.join(on_cpu)}", ok=False)
    return Row(name, f"0 of {len(placed)}", notes="function inputs/outputs aside", ok=True)


# --- the run ----------------------------------------------------------------------------


def device_names() -> str:
    """ "GPU:0 <name> (compute X.Y), ..." or the CPU devices when there is no GPU."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "no GPU; " + ", ".join(d.name for d in tf.config.list_logical_devices("CPU"))
    names = []
    for gpu in gpus:
        details = tf.config.experimental.get_device_details(gpu)
        cc = ".".join(str(v) for v in details.get("compute_capability", ()))
        names.append(f"{gpu.name.split(':', 1)[1]} {details.get('device_name', '?')} ({cc})")
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    return ", ".join(names) + f"; TF32 {'on' if tf32 else 'off'} (float32 on Ampere and later)"


def print_table(rows: list[Row], reference: str) -> None:
    print(
        "\nNVIDIA: DeepLearningExamples' published training images/s on one GPU, ImageNet from "
        "TFRecords, XLA on (REFERENCES in bench/gpu_check.py names the tables)"
    )
    print(f"| check | measured | NVIDIA, 1x {reference.upper()} | measured / NVIDIA | notes |")
    print("|---|---|---|---:|---|")
    for r in rows:
        print(f"| {r.check} | {r.measured} | {r.reference} | {r.ratio} | {r.notes} |")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:  # XLA only has to run there: compile without LLVM's optimizations
        os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
    from tfgpu.cli import quiet

    if not (args.dry_run or args.allow_cpu or quiet.has_nvidia_driver()):
        print(f"gpu_check: no GPU is visible (no NVIDIA driver); {GO_ON}")
        return 2
    log_fd = log_placement_to_file()
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # retracing notes: each measurement builds a new loop
    from tfgpu.distribute import devices

    devices.configure_devices(2 if args.dry_run else 1)  # dry run: 2 replicas for mirrored
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    if not num_gpus and not (args.dry_run or args.allow_cpu):
        print(f"gpu_check: no GPU is visible to TensorFlow (is its CUDA installed?); {GO_ON}")
        return 2
    started = time.monotonic()
    # A dry run measures nothing: one matmul names the machine (best of 5: ~2 CPU-s).
    print(f"calibration: {calibration(1 if args.dry_run else 5)}")
    print(f"devices: {device_names()}; TF {tf.__version__}" + (" (DRY RUN)" * args.dry_run))
    with tempfile.TemporaryDirectory() as work_dir:
        args.work_dir = work_dir
        rows = run_checks(args, log_fd, num_gpus, started)
    print_table(rows, args.reference)
    print(f"\n{time.monotonic() - started:.0f} s in all")
    return 1 if any(r.ok is False for r in rows) else 0


def run_checks(args, log_fd: int, num_gpus: int, started: float) -> list[Row]:
    """Every row: the step and input checks first (cheap), the first model (it also gives the
    all-reduce count), 2+ GPUs, then the other models while --time_budget_s lasts."""
    first, *others = args.models.split(",")
    print("train step and input pipeline ...", flush=True)
    checks = guarded("train step checks", step_rows, args, log_fd, num_gpus)
    print(f"{first} ({time.monotonic() - started:.0f} s) ...", flush=True)
    try:
        rows, found, seconds = measure_model(args, first, args.start_batch)
    except Exception as error:  # the checks still get their table; the others no estimate
        rows, found, seconds = [error_row(f"{first} (all settings)", error)], {}, {}
    runs = [m for m in found.values() if m is not None]
    if runs:  # the all-reduce count of one device comes with the first measured run
        checks.append(all_reduce_row(runs[0]))
    print(f"micro-batch auto ({time.monotonic() - started:.0f} s) ...", flush=True)
    checks += guarded("micro-batch auto", lambda: [auto_micro_batch_row(args)])
    print(f"all-reduces on 2+ devices ({time.monotonic() - started:.0f} s) ...", flush=True)
    checks += guarded("NCCL all-reduce, 2+ GPUs", lambda: [nccl_row(args, num_gpus)])
    start = found["float32"].batch if found.get("float32") else args.start_batch
    deadline = started + args.time_budget_s
    for model in others:
        print(f"{model} ({time.monotonic() - started:.0f} s) ...", flush=True)
        rows += guarded(
            f"{model} (all settings)", other_model_rows, args, model, start, deadline, seconds
        )
    return rows + checks


def other_model_rows(args, model: str, start: int, deadline: float, estimates: dict) -> list:
    """The rows of ``measure_model`` for a model after the first, within the budget."""
    return measure_model(args, model, start, deadline, estimates)[0]


def guarded(name: str, rows, *args) -> list[Row]:
    """``rows(*args)``, or when it raises, one row that names the error (its traceback goes
    to stderr) so that the table still comes out."""
    try:
        return rows(*args)
    except Exception as error:  # any failure is a finding of the check: say it, go on
        return [error_row(name, error)]


def error_row(name: str, error: Exception) -> Row:
    """A failed row naming ``error`` (its traceback goes to stderr)."""
    traceback.print_exception(error)
    first_line = (str(error).strip().splitlines() or [""])[0][:200]
    return Row(name, f"FAIL: {type(error).__name__}: {first_line}", ok=False)


if __name__ == "__main__":
    sys.exit(main())
