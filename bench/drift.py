"""How far "the same weights" reaches: one run, its batch summed two ways, compared update by
update; and the same run stopped and resumed, which must not move at all.

    python bench/drift.py [--cases=tiny_cnn,lars] [--steps=600] [--lars_steps=60] [--noresume]

Under --deterministic every example and augmentation is the same whatever the strategy, so
two runs that differ only in how a global batch's gradient is summed (one process; 2
multi_worker_mirrored workers; 2 micro-batches) are the same mathematics, and differ only by
float32 rounding, which training then carries along. A run stopped (SIGTERM: a checkpoint,
exit 75) and resumed with the same strategy and worker count sums in the same order, and
ends identical to the bit.

Cases: tiny_cnn on the built-in demo (the digits recipe: adam, cosine, 16 px, batch 32) for
--steps updates, also stopped a third of the way and resumed (1 process and 2 workers), and
with 2 micro-batches; resnet20 with --sync_batchnorm and LARS (batch 16 at 16 px) for
--lars_steps, 1 process and 2 workers.
Each run checkpoints every 6 updates (all kept); each pair's model weights are compared at
those points: the largest absolute difference over all weights, and the largest relative to
its variable's largest weight. Runs use Eigen's CPU kernels (TF_ENABLE_ONEDNN_OPTS=0), as the
tests do: with oneDNN the sum order of a convolution depends on the batch's shape.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from calibration import calibration  # noqa: E402

EVERY = 6  # updates between checkpoints: the points compared


def case_flags(case: str, steps: int) -> list[str]:
    """The tfgpu flags of a case (every run of it adds only how it is spread)."""
    common = ["--deterministic", "--seed=0", f"--train_steps={steps}", "--noexport"]
    common += [f"--checkpoint_every_steps={EVERY}", f"--keep_checkpoints={steps // EVERY + 1}"]
    common += ["--input_probe_s=0", f"--log_every_steps={EVERY}", "--steps_per_loop=6"]
    if case == "tiny_cnn":  # no --data_dir: the built-in demo and its recipe
        return common
    return common + [
        "--model=resnet20",
        "--image_size=16",
        "--global_batch_size=16",
        "--sync_batchnorm",
        "--optimizer=lars",
        "--learning_rate=1.0",
        "--lr_schedule=poly",
        "--warmup_steps=2",
        "--weight_decay=1e-4",
        f"--eval_every_steps={steps}",
    ]


SPREADS = {
    "1 process": ["--strategy=default"],
    "2 workers": ["--strategy=multi_worker_mirrored"],
    "1 process, 2 micro-batches": ["--strategy=default", "--grad_accum_steps=2"],
}


def train(flags: list, spread: str, model_dir: str, stop_at: int = 0) -> float:
    """Trains one run into ``model_dir``; with ``stop_at``, SIGTERMs it once it has logged
    that update and starts it again (same command) to the end. Returns wall seconds."""
    launcher = [sys.executable, "-m", "tfgpu.main"]
    if spread.startswith("2 workers"):
        launcher = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--"]
    cmd = [*launcher, *flags, *SPREADS[spread.removesuffix(", resumed")]]
    cmd.append(f"--model_dir={model_dir}")
    started = time.time()
    if stop_at:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if _logged(line) >= stop_at:
                proc.send_signal(signal.SIGTERM)
                break
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 75, ("".join(seen) + out)[-3000:]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return time.time() - started


def _logged(line: str) -> int:
    """The update a progress line names (``... step 12/600 ...``), else 0."""
    words = line.replace("[worker 0]", "").split()
    if len(words) > 1 and words[0] == "step" and "/" in words[1]:
        return int(words[1].split("/")[0])
    return 0


# Where a checkpoint holds the model's weights: the trainable ones under the optimizer (the
# object graph saves each variable once, at its first path), the rest (BatchNorm's moving
# statistics) under the model.
WEIGHTS = ("optimizer/_trainable_variables/", "model/")


def model_weights(model_dir: str, step: int) -> dict:
    """name -> array of the model's variables in checkpoint ``ckpt-step``."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints", f"ckpt-{step}"))
    names = [n for n in reader.get_variable_to_shape_map() if n.startswith(WEIGHTS)]
    weights = {n: reader.get_tensor(n) for n in names if n.endswith("VARIABLE_VALUE")}
    assert weights, f"no weights found in {model_dir}'s ckpt-{step}"
    return weights


def difference(a: dict, b: dict) -> tuple[float, float]:
    """(largest |a - b| over every weight, largest of it relative to its variable's max |a|)."""
    absolute = relative = 0.0
    for name, x in a.items():
        d = float(np.max(np.abs(x.astype(np.float64) - b[name]))) if x.size else 0.0
        absolute = max(absolute, d)
        relative = max(relative, d / max(float(np.max(np.abs(x))) if x.size else 1.0, 1e-30))
    return absolute, relative


def measure(case: str, steps: int, points: list, root: str, resume: bool = True) -> list:
    """Trains the case every way, compares each pair at ``points``; returns the table's rows."""
    flags = case_flags(case, steps)
    stop = steps // 3  # SIGTERMed once that update is logged; it stops at the next boundary
    runs = {"1 process": 0, "2 workers": 0}
    exact = [("1 process, resumed", "1 process"), ("2 workers, resumed", "2 workers")]
    if case == "tiny_cnn" and resume:  # the pairs that must not move at all
        runs.update({"1 process, resumed": stop, "2 workers, resumed": stop})
    if case == "tiny_cnn":  # and another way of summing in one process
        runs["1 process, 2 micro-batches"] = 0
    seconds = {}
    for spread, stop_at in runs.items():
        seconds[spread] = train(flags, spread, os.path.join(root, case, spread), stop_at)
        print(f"  {case}: {spread} trained in {seconds[spread]:.0f} s", flush=True)
    pairs = [p for p in exact if p[0] in runs] + [("2 workers", "1 process")]
    if case == "tiny_cnn":
        pairs.append(("1 process, 2 micro-batches", "1 process"))
    rows = []
    for a, b in pairs:
        found = [
            difference(*(model_weights(os.path.join(root, case, r), p) for r in (a, b)))
            for p in points
        ]
        rows.append((case, f"{a} vs {b}", found))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="tiny_cnn,lars")
    parser.add_argument("--steps", type=int, default=600, help="tiny_cnn's updates")
    parser.add_argument("--lars_steps", type=int, default=60, help="resnet20 + LARS's updates")
    parser.add_argument(
        "--noresume", action="store_true", help="leave out the stopped-and-resumed runs"
    )
    args = parser.parse_args()
    print(calibration(), flush=True)
    root = tempfile.mkdtemp(prefix="tfgpu-drift-")
    try:
        for case in args.cases.split(","):
            steps = args.steps if case == "tiny_cnn" else args.lars_steps
            points = [p for p in (6, 12, 30, 60, 120, 300, 600, 1200) if p <= steps]
            points += [steps] if steps not in points else []
            rows = measure(case, steps, points, root, resume=not args.noresume)
            print(
                f"\n{case}: largest |difference| of any weight (relative to its variable's "
                "largest), after N updates"
            )
            print("| pair | " + " | ".join(f"{p}" for p in points) + " |")
            print("|---|" + "---:|" * len(points))
            for _, pair, found in rows:
                cells = [f"{a:.1e} ({r:.0e})" if a else "0.0" for a, r in found]
                print(f"| {pair} | " + " | ".join(cells) + " |", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
