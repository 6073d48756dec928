"""Time per update: 1 process vs 2-worker multi_worker_mirrored vs 2-rank Horovod (fp32 and fp16
gradient compression), at the same global batch, plus the bytes all-reduced per update.

    python bench/scaling.py [--model=tiny_cnn] [--steps=40] [--rounds=2]

Each configuration runs ``--rounds`` times, alternating with the others (so a slow minute on a
shared machine hits all of them), on synthetic data (no input pipeline in the timing). Time per
update comes from each run's ``summary.json`` (``train_images_per_sec``, which leaves out the
first logged window: tracing and warm-up); the best round is kept.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

WORKERS = 2
CONFIGS = {
    "1 process (default)": ("single", []),
    f"{WORKERS}-worker multi_worker_mirrored": ("launch", []),
    f"{WORKERS}-rank horovod": ("horovodrun", []),
    f"{WORKERS}-rank horovod, fp16 compression": ("horovodrun", ["--hvd_compression=fp16"]),
}


def run_flags(args, model_dir: str) -> list[str]:
    """The tfgpu flags every configuration shares: only how training is spread differs."""
    window = max(args.steps // 4, 1)
    return [
        f"--model={args.model}",
        "--synthetic_data",
        "--num_classes=10",
        f"--image_size={args.image_size}",
        "--small_input",
        f"--global_batch_size={args.global_batch_size}",
        f"--train_steps={args.steps}",
        f"--steps_per_loop={window}",
        f"--log_every_steps={window}",
        f"--checkpoint_every_steps={args.steps * 10}",
        "--optimizer=sgd",
        "--learning_rate=0.01",
        "--deterministic",
        "--seed=1",
        "--noexport",
        f"--model_dir={model_dir}",
    ]


def command(kind: str, flags: list[str]) -> list[str]:
    if kind == "single":
        return [sys.executable, "-m", "tfgpu.main", "--strategy=default", *flags]
    if kind == "launch":
        launch = [sys.executable, "-m", "tfgpu.launch", f"--num_workers={WORKERS}", "--"]
        return [*launch, "--strategy=multi_worker_mirrored", *flags]
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    hosts = ["--gloo", "-np", str(WORKERS), "-H", f"localhost:{WORKERS}"]
    return [horovodrun, *hosts, sys.executable, "-m", "tfgpu.main", "--strategy=horovod", *flags]


def time_one(args, kind: str, extra: list[str]) -> dict:
    """Runs one configuration; returns seconds per update and the last logged train loss."""
    with tempfile.TemporaryDirectory(prefix="tfgpu-scaling-") as model_dir:
        cmd = command(kind, run_flags(args, model_dir) + extra)
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
        if out.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
        with open(os.path.join(model_dir, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        with open(os.path.join(model_dir, "metrics.jsonl"), encoding="utf-8") as f:
            train = [r for r in map(json.loads, f) if r.get("split") == "train"]
    return {
        "s_per_update": args.global_batch_size / summary["train_images_per_sec"],
        "loss": train[-1]["loss"],
        "all_reduces": summary["gradient_all_reduces"],
    }


def trainable_parameters(model: str, image_size: int) -> int:
    from tfgpu import models

    built = models.build_model(model, 10, image_size, small_input=True)
    return sum(int(w.shape.num_elements()) for w in built.trainable_weights)


def bytes_table(params: int) -> list[str]:
    """Bytes of one gradient all-reduce, and what each worker sends in a ring all-reduce."""
    ring = 2 * (WORKERS - 1) / WORKERS
    rows = ["| gradients | bytes per all-reduce | sent per worker (ring, N=2) |", "|---|---:|---:|"]
    for name, width in (("float32 (default)", 4), ("float16 compression (horovod)", 2)):
        size = params * width
        rows.append(f"| {name} | {size / 1e6:.2f} MB | {size * ring / 1e6:.2f} MB |")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny_cnn")
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--global_batch_size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    results = {name: [] for name in CONFIGS}
    for round_ in range(args.rounds):
        for name, (kind, extra) in CONFIGS.items():
            results[name].append(time_one(args, kind, extra))
            print(f"round {round_ + 1}: {name}: {results[name][-1]}", file=sys.stderr, flush=True)

    base = min(r["s_per_update"] for r in results["1 process (default)"])
    print(
        f"\n{args.model}, {args.image_size}px, global batch {args.global_batch_size}, "
        f"{args.steps} updates, best of {args.rounds} alternating rounds\n"
    )
    print("| configuration | ms per update | vs 1 process | final loss | all-reduces |")
    print("|---|---:|---:|---:|---:|")
    for name, runs in results.items():
        best = min(r["s_per_update"] for r in runs)
        loss = statistics.mean(r["loss"] for r in runs)
        print(
            f"| {name} | {best * 1e3:.1f} | {base / best:.2f}x | {loss:.4f} "
            f"| {runs[0]['all_reduces']} |"
        )
    params = trainable_parameters(args.model, args.image_size)
    print(f"\n{params:,} trainable parameters\n")
    print("\n".join(bytes_table(params)))


if __name__ == "__main__":
    main()
