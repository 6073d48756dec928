"""Time to 90%, 92%, 93% and 94% test top-1 on Fashion-MNIST: tfgpu against Keras
``model.fit``, PyTorch's textbook loop (both with tfgpu's recipe) and PyTorch running airbench
(its own published method), one after another in one run.

    python bench/time_to_accuracy.py --data_dir=/tmp/w/fm-tfr \\
        [--flagfile=flags/fashion_mnist_fast.flags] [--torch_python=/work/torchenv/bin/python] \\
        [--contenders=tfgpu,keras,torch,airbench] [--airbench_preset=93|94] \\
        [--airbench_flags='--dtype=float32 ...'] [--output=time_to_accuracy.json]
    python bench/time_to_accuracy.py ... --epochs=1 --train_limit=2000   # a quick check only

--data_dir: Fashion-MNIST converted by tools/to_tfrecord.py (60,000 train; ``validation`` is the
official 10,000-image test set). The recipe is tfgpu's flagfile, read through tfgpu's own flag
definitions (its defaults fill what the file leaves out), so the three share its network
(a CIFAR ResNet: resnet20 ..., or for tfgpu and Keras an airbench network: then torch is
skipped, saying so, and airbench is PyTorch's), epochs, batch, optimizer, schedule, weight
decay, label smoothing and augmentation (reflect pad by --crop_padding, random crop, flip). A
flag the mirroring peers (keras, torch) do not mirror stops the run (--allow_unmirrored runs
anyway and says so). airbench mirrors nothing: it is the peer at its own best, whatever
tfgpu's recipe.

Contenders, each a fresh process, one after another, never at once; each clock starts before
its process does (TensorFlow's or PyTorch's import, data loading, tracing, every evaluation
and tfgpu's checkpoints and export all count), and each evaluates on the 10,000 test images
after every epoch:
  tfgpu  ``python -m tfgpu.main --flagfile=F --data_dir=D --model_dir=TMP --eval_every_epochs=1``.
         metrics.jsonl rows carry no wall time: an evaluation's time is when its ``eval step
         N`` line arrives on stdout; its top-1 is read from metrics.jsonl.
  keras  ``bench/time_to_accuracy_keras.py``: the same Keras model (``tfgpu.models.build_model``)
         by ``model.fit`` over tf.data and Keras' augmentation layers (its docstring says more).
  torch  ``bench/time_to_accuracy_torch.py`` under --torch_python (a virtualenv with torch and
         numpy; skipped, saying why, without one): the same network in PyTorch, SGD, LambdaLR
         and a DataLoader of --torch_workers processes: 1, since its per-image pad, crop and
         flip cost ~6 ms a batch there against 20-70 ms in the training process (2 OpenMP
         threads on tiny ops), and a second worker would only take cores from the step. This
         process decodes the images for it beforehand, off its clock (the seconds are printed):
         PyTorch has no TFRecord reader.
  airbench ``bench/time_to_accuracy_airbench.py --preset=P`` under --torch_python, on the same
         decoded arrays: Keller Jordan's airbench94 method (whitening, Dirac init, BatchNorm
         bias rate x64, lookahead, alternating flips, 6-view TTA, triangular schedule), its
         widths/epochs/batch tuned for 28 x 28 gray images on this CPU, bfloat16 autocast and
         channels_last (its docstring says more); its own network's FLOPs and batch are used
         for its figures.
Marks and evaluations are stamped by this process as their lines arrive, the same way for all.

What is compared, per contender: the wall time at which test top-1 first reached 90%, 92%, 93%,
94% (or "not reached" and the best), the final top-1, steady training images/s (between progress
lines --log_every_steps updates apart, leaving out the first window (tracing) and any window
holding an evaluation), total wall time, and the model FLOP/s achieved over the calibration's
sgemm GFLOP/s (a training image = 3 x the forward FLOPs, 2 FLOPs a multiply-add, the MACs
counted from the Keras model's Conv2D and Dense layers: output H x W x k x k x Cin x Cout);
then tfgpu's time to each threshold over each peer's (goal: <= 0.8 at 93% and at 94%).

Each contender runs once and the machine is shared: repeat a run, with its calibration line
and each contender's load average and CPU seconds (printed), before trusting a ratio.
PyTorch's OpenMP threads slow down far more than TensorFlow's thread pool when another job
takes a core (a tiny check beside a test run trained at a tenth of its quiet speed).
--epochs and --train_limit (the first N training images) make quick checks, not results.
"""

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

from calibration import calibration  # noqa: E402

THRESHOLDS = (0.90, 0.92, 0.93, 0.94)
GOALS = ("0.93", "0.94")  # the thresholds of the goal
GOAL = 0.8  # tfgpu's time to each goal threshold over each peer's, at most
CONTENDERS = ("tfgpu", "keras", "torch", "airbench")
MIRRORING = ("keras", "torch")  # the peers that train tfgpu's recipe (airbench trains its own)
TORCH_CONTENDERS = ("torch", "airbench")
CIFAR_RESNETS = ("resnet20", "resnet32", "resnet44", "resnet56", "resnet110")
# Flags the peers do the same as (read into their recipe) ...
MIRRORED = {
    "model", "image_size", "global_batch_size", "epochs", "optimizer", "momentum",
    "learning_rate", "lr_scaling", "scale_lr_with_batch", "base_batch_size", "lr_schedule",
    "warmup_steps", "weight_decay", "label_smoothing", "random_flip", "crop_padding",
    "eval_crop_fraction", "eval_every_epochs", "eval_every_steps", "eval_batch_size", "seed",
    "num_classes", "label_offset", "log_every_steps", "eval_tta", "dtype", "alternating_flips",
    "dirac_init", "whitening",
}  # fmt: skip
# ... the flags Keras ``fit`` cannot express (one learning rate per optimizer; its EMA
# overwrite is not lookahead's schedule): the Keras peer runs without them, and says so.
KERAS_CANNOT = {
    "batchnorm_lr_multiplier": "Keras optimizers have one learning rate for all variables",
    "lookahead_steps": "Keras has no lookahead (its EMA overwrite has no ramped pull)",
    "lookahead_decay": "Keras has no lookahead",
}
# Models the mirroring peers build: the CIFAR ResNets (Keras and PyTorch) and airbench's (Keras
# through tfgpu's registry; in PyTorch airbench's method is the airbench contender's own).
AIRBENCH_MODELS = (
    "airbench94",
    "airbench93",
    "airbench94_gray",
    "airbench93_gray",
    "airbench_s_gray",
)
# ... and tfgpu's own ways of running the same recipe (speed, logging, files), which do not
# change what is trained. small_input: the CIFAR ResNets ignore it.
TFGPU_ONLY = {
    "data_dir", "model_dir", "steps_per_loop", "jit_compile", "log_every_s",
    "checkpoint_every_steps", "keep_checkpoints", "export", "input_probe_s", "data_threads",
    "ram_budget_mb", "cache_eval", "in_memory", "in_memory_mb", "shuffle_buffer", "cycle_length",
    "block_length", "strategy", "deterministic", "preprocess_on", "resize_on",
    "dct_scaled_decode", "small_input", "skip_non_finite", "max_skipped_updates",
    "eval_snapshot_dir", "skip_truncated_shards",
}  # fmt: skip


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data_dir", required=True, help="Fashion-MNIST as the converter writes it")
    p.add_argument("--flagfile", default=os.path.join(REPO, "flags/fashion_mnist_fast.flags"))
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="comma list, in order")
    p.add_argument("--torch_python", default="", help="a python with torch and numpy")
    p.add_argument(
        "--torch_workers", type=int, default=1, help="DataLoader processes (1 for 2 cores)"
    )
    p.add_argument(
        "--airbench_preset",
        default="93",
        help="time_to_accuracy_airbench.py's --preset: 93 (fastest to 93%%) or 94",
    )
    p.add_argument(
        "--airbench_flags", default="", help="more flags for time_to_accuracy_airbench.py"
    )
    p.add_argument("--epochs", type=int, default=0, help="instead of the flagfile's (a check)")
    p.add_argument("--train_limit", type=int, default=0, help="the first N train images only")
    p.add_argument("--output", default="time_to_accuracy.json", help="the results, as JSON")
    p.add_argument("--work_dir", default="", help="kept if given (logs, runs); else a temp dir")
    p.add_argument("--allow_unmirrored", action="store_true", help="run with flags not mirrored")
    args = p.parse_args()
    unknown = set(args.contenders.split(",")) - set(CONTENDERS)
    if unknown:
        p.error(f"--contenders: {', '.join(sorted(unknown))} not one of {', '.join(CONTENDERS)}")
    return args


# --- the recipe -----------------------------------------------------------------------------


def tfgpu_overrides(args) -> list[str]:
    """Flags given to tfgpu after its flagfile: an evaluation every epoch, and --epochs."""
    extra = ["--eval_every_epochs=1", "--eval_every_steps=0"]
    return extra + ([f"--epochs={args.epochs}"] if args.epochs else [])


def resolve_recipe(args):
    """(the Config tfgpu will run, the names of the flags the flagfile and the overrides set),
    parsed by tfgpu's own flag definitions and checked by its validation."""
    from absl import flags

    from tfgpu.config import config_from, validate
    from tfgpu.cli.flags import define_flags, given_flags

    if not os.path.exists(args.flagfile):
        raise SystemExit(f"--flagfile={args.flagfile} does not exist (pass a copy of the recipe)")
    values = flags.FlagValues()
    define_flags(values)
    values(["time_to_accuracy", f"--flagfile={args.flagfile}", *tfgpu_overrides(args)])
    given, present = given_flags(values)
    config = validate(config_from(**given))
    return config, present


def check_recipe(config, present, allow: bool, names) -> list[str]:
    """The flags set that the mirroring peers among ``names`` (keras, torch) do not mirror (an
    error unless ``allow``); raises for a setting of a mirrored flag they cannot follow.
    tfgpu and airbench alone mirror nothing: any recipe goes."""
    mirroring = [n for n in names if n in MIRRORING]
    if not mirroring:
        return []
    s = config.flat()
    problems = []
    if s["model"] not in CIFAR_RESNETS + AIRBENCH_MODELS:
        have = ", ".join(CIFAR_RESNETS + AIRBENCH_MODELS)
        problems.append(f"--model={s['model']}: the peers have {have}")
    if s["optimizer"] not in ("sgd", "nesterov") or s["lr_schedule"] not in ("cosine", "linear"):
        problems.append("the peers do --optimizer=sgd|nesterov, --lr_schedule=cosine|linear")
    if s["eval_crop_fraction"] != 1.0:
        problems.append("the peers evaluate whole images: --eval_crop_fraction must be 1.0")
    if s["train_steps"] or s["epochs"] != int(s["epochs"]) or s["epochs"] < 1:
        problems.append("the peers train whole epochs: --epochs=N, no --train_steps")
    if s["in_memory"] == "off":
        problems.append("--in_memory=off trains on random-resized crops, not padded crops")
    if problems:
        raise SystemExit(
            f"the recipe cannot be mirrored by {', '.join(mirroring)}: " + "; ".join(problems)
        )
    unmirrored = sorted(set(present) - MIRRORED - TFGPU_ONLY - set(KERAS_CANNOT))
    if unmirrored and not allow:
        raise SystemExit(
            f"{', '.join('--' + f for f in unmirrored)}: set in the recipe, not done by "
            f"{', '.join(mirroring)} (teach bench/time_to_accuracy_*.py, or --allow_unmirrored)"
        )
    return unmirrored


def peer_recipe(config, info: dict, args) -> dict:
    """The recipe in the peers' words (time_to_accuracy_keras.py, time_to_accuracy_torch.py)."""
    from tfgpu.config import Config
    from tfgpu.optim import run_learning_rate
    from tfgpu.imagenet import IMAGENET_MEAN, IMAGENET_STD

    s, batch, defaults = config.flat(), config.train.global_batch_size, Config().flat()
    s["dtype"] = resolved_dtype(s["dtype"])  # what tfgpu's --dtype=auto picks here
    offset = s["label_offset"] if s["label_offset"] >= 0 else info.get("label_offset", 0)
    resnet = s["model"] in CIFAR_RESNETS
    return dict(
        model=s["model"],
        depth=int(s["model"][len("resnet") :]) if resnet else 0,
        dtype=s["dtype"],
        lr_schedule=s["lr_schedule"],
        alternating_flips=s["alternating_flips"],
        dirac_init=s["dirac_init"],
        whitening=s["whitening"],
        keras_without={k: why for k, why in KERAS_CANNOT.items() if s[k] != defaults[k]},
        image_size=s["image_size"],
        num_classes=s["num_classes"] or info["num_classes"],
        label_offset=offset,
        num_train=info["splits"]["train"]["num_examples"],
        num_test=info["splits"]["validation"]["num_examples"],
        batch_size=batch,
        eval_batch_size=s["eval_batch_size"] or batch,
        epochs=int(s["epochs"]),
        learning_rate=run_learning_rate(config.optim, batch),
        momentum=s["momentum"],
        nesterov=s["optimizer"] == "nesterov",
        warmup_steps=s["warmup_steps"],
        weight_decay=s["weight_decay"],
        label_smoothing=s["label_smoothing"],
        crop_padding=s["crop_padding"],
        flip=s["random_flip"],
        eval_tta=s["eval_tta"],
        seed=s["seed"],
        mark_every=s["log_every_steps"],
        mean=list(IMAGENET_MEAN),
        std=list(IMAGENET_STD),
        torch_workers=args.torch_workers,
        tfgpu_settings={k: s[k] for k in sorted(MIRRORED)},  # checked against its config.json
    )


def resolved_dtype(dtype: str) -> str:
    """``dtype`` as tfgpu resolves it on this machine (--dtype=auto: ``config.resolve``)."""
    if dtype != "auto":
        return dtype
    from tfgpu.config import config_from, resolve
    from tfgpu.distribute import devices

    return resolve(config_from(dtype="auto"), False, devices.fast_bfloat16()).model.dtype


def torch_script(name: str) -> str:
    """A PyTorch contender's script: ``torch``'s mirror of the recipe (the CIFAR ResNets) or
    ``airbench``'s own method."""
    return os.path.join(BENCH, f"time_to_accuracy_{name}.py")


# --- data and FLOPs (this process, before any clock) ----------------------------------------


def read_info(data_dir: str) -> dict:
    with open(os.path.join(data_dir, "dataset_info.json"), encoding="utf-8") as f:
        return json.load(f)


def limited_data_dir(data_dir: str, limit: int, work: str) -> str:
    """A copy of ``data_dir`` whose train split is its first ``limit`` records (one shard;
    the validation shards linked), for quick checks."""
    import tensorflow as tf

    info, out = read_info(data_dir), os.path.join(work, f"data-first-{limit}")
    os.makedirs(out)
    files = [os.path.join(data_dir, s["file"]) for s in info["splits"]["train"]["shards"]]
    name, count = "train-00000-of-00001.tfrecord", 0
    with tf.io.TFRecordWriter(os.path.join(out, name)) as writer:
        for record in tf.data.TFRecordDataset(files).take(limit):
            writer.write(record.numpy())
            count += 1
    for shard in info["splits"]["validation"]["shards"]:
        os.symlink(
            os.path.abspath(os.path.join(data_dir, shard["file"])), os.path.join(out, shard["file"])
        )
    info["splits"]["train"] = {
        "num_examples": count,
        "shards": [{"file": name, "num_examples": count}],
    }
    info["num_examples"]["train"] = count
    with open(os.path.join(out, "dataset_info.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    return out


def write_torch_arrays(data_dir: str, r: dict, path: str) -> float:
    """The train and test images as tfgpu decodes them (uint8 NHWC, 3 channels) and their
    labels, into ``path`` (.npz) for the PyTorch process; returns the seconds it took."""
    import numpy as np
    from time_to_accuracy_keras import read_split

    start, arrays = time.perf_counter(), {}
    for split, key in (("train", "train"), ("validation", "test")):
        ds = read_split(data_dir, split, r["image_size"], r["label_offset"]).batch(4096)
        images, labels = zip(*ds.as_numpy_iterator())
        arrays[f"{key}_images"], arrays[f"{key}_labels"] = map(np.concatenate, (images, labels))
    np.savez(path, **arrays)
    return time.perf_counter() - start


def forward_macs(r: dict) -> int:
    """Multiply-adds of one forward pass of the Keras model: per Conv2D output H x W x k x k x
    Cin x Cout, per Dense Cin x Cout (BatchNorm, adds, pooling left out)."""
    import keras

    from tfgpu import models

    model = models.build_model(r["model"], r["num_classes"], r["image_size"])
    macs = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            _, h, w, cout = layer.output.shape
            kh, kw, cin, _ = layer.kernel.shape
            macs += h * w * kh * kw * cin * cout
        elif isinstance(layer, keras.layers.Dense):
            cin, cout = layer.kernel.shape
            macs += cin * cout
    return int(macs)


# --- running a contender --------------------------------------------------------------------


def children_cpu_s() -> float:
    """CPU seconds of the children waited for so far (with their own waited-for children)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(name: str, cmd: list, work: str) -> dict:
    """Runs ``cmd`` (clock started before it starts), stamping each stdout line as it arrives
    and echoing it; stderr goes to ``work/<name>.stderr``. {lines: [(s, line)], returncode,
    wall_s, cpu_s, load (1-minute load average before, after), stderr}."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    err_path = os.path.join(work, f"{name}.stderr")
    lines, load, cpu = [], [os.getloadavg()[0]], children_cpu_s()
    with open(err_path, "w", encoding="utf-8") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1
        )
        for line in proc.stdout:
            t = time.perf_counter() - start
            lines.append((t, line.rstrip("\n")))
            print(f"[{name} {t:7.1f} s] {line.rstrip()}", flush=True)
        returncode = proc.wait()
        wall = time.perf_counter() - start
    cpu, load = children_cpu_s() - cpu, load + [os.getloadavg()[0]]
    with open(os.path.join(work, f"{name}.stdout"), "w", encoding="utf-8") as f:
        f.writelines(f"{t:.3f}\t{line}\n" for t, line in lines)
    with open(err_path, encoding="utf-8", errors="replace") as f:
        tail = f.read()[-2000:]
    return dict(lines=lines, returncode=returncode, wall_s=wall, cpu_s=cpu, load=load, stderr=tail)


TRAIN_LINE = re.compile(r"^step\s+(\d+)(/\d+\s|: tracing)")
EVAL_LINE = re.compile(r"^eval\s+step (\d+): top1 ([\d.]+)")


def validation_rows(model_dir: str) -> list:
    """The evaluation rows of ``model_dir``'s metrics.jsonl, in order."""
    path = os.path.join(model_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [row for row in map(json.loads, f) if row.get("split") == "validation"]


def config_differences(model_dir: str, r: dict) -> list[str]:
    """The mirrored settings whose value in the run's config.json is not the one the peers
    were given (the flagfile read here and by tfgpu must agree)."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        return ["no config.json: the settings tfgpu ran with are unknown"]
    with open(path, encoding="utf-8") as f:
        ran = json.load(f)
    return [
        f"tfgpu ran --{k}={ran.get(k)!r}, the peers were given {v!r}"
        for k, v in r["tfgpu_settings"].items()
        if ran.get(k) != v
    ]


def tfgpu_events(run: dict, model_dir: str, r: dict) -> dict:
    """tfgpu's marks (its progress lines; step 0 at "tracing") and evaluations (when their
    lines arrived; top-1 from the n-th row of metrics.jsonl, the line's 4 digits without)."""
    rows, marks, evals = validation_rows(model_dir), [], []
    notes = config_differences(model_dir, r)
    for t, line in run["lines"]:
        if m := TRAIN_LINE.match(line):
            marks.append((t, int(m.group(1))))
        elif m := EVAL_LINE.match(line):
            step, n = int(m.group(1)), len(evals)
            row = rows[n] if n < len(rows) and rows[n]["step"] == step else {}
            evals.append(
                dict(
                    time_s=t,
                    updates=step,
                    epoch=step * r["batch_size"] / r["num_train"],
                    top1=row.get("top1", float(m.group(2))),
                    examples=row.get("num_examples"),
                )
            )
    if not any("train split in memory" in line for _, line in run["lines"]):
        notes.append("tfgpu did not take the in-memory path: its augmentation differs")
    summary = [json.loads(line[9:]) for _, line in run["lines"] if line.startswith("summary: ")]
    own = summary[0].get("train_images_per_sec") if summary else None
    return dict(marks=marks, evals=evals, notes=notes, extra={"own_train_images_per_sec": own})


def peer_events(run: dict) -> dict:
    """A peer's marks and evaluations, from its JSON lines (anything else on stdout ignored);
    a "start" line may give its own batch and forward multiply-adds (airbench: its network)."""
    marks, evals, own = [], [], {}
    for t, line in run["lines"]:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("kind") == "start":
            own = {k: event[k] for k in ("batch_size", "forward_macs", "settings") if k in event}
        elif event.get("kind") == "mark":
            marks.append((t, event["updates"]))
        elif event.get("kind") == "eval":
            evals.append(dict(time_s=t, **{k: v for k, v in event.items() if k != "kind"}))
    return dict(marks=marks, evals=evals, notes=[], own=own)


def run_contender(name: str, args, r: dict, data_dir: str, work: str) -> dict:
    """Runs one contender (fresh process, timed from before it starts); its events."""
    recipe_path = os.path.join(work, "recipe.json")
    if name == "tfgpu":
        model_dir = os.path.join(work, "tfgpu-run")
        cmd = [
            sys.executable,
            "-m",
            "tfgpu.main",
            f"--flagfile={os.path.abspath(args.flagfile)}",
            f"--data_dir={data_dir}",
            f"--model_dir={model_dir}",
            *tfgpu_overrides(args),
        ]
    elif name == "keras":
        script = os.path.join(BENCH, "time_to_accuracy_keras.py")
        cmd = [sys.executable, script, f"--recipe={recipe_path}", f"--data_dir={data_dir}"]
    else:
        arrays = os.path.join(work, "arrays.npz")
        script = torch_script(name)
        cmd = [args.torch_python, script, f"--recipe={recipe_path}", f"--arrays={arrays}"]
        if name == "airbench":
            cmd += [f"--preset={args.airbench_preset}", *shlex.split(args.airbench_flags)]
            cmd += [f"--epochs={args.epochs}"] if args.epochs else []
    run = run_timed(name, cmd, work)
    events = tfgpu_events(run, model_dir, r) if name == "tfgpu" else peer_events(run)
    if name == "keras":
        events["notes"] += [f"runs without --{k}: {why}" for k, why in r["keras_without"].items()]
    events.update({k: run[k] for k in ("wall_s", "cpu_s", "load", "returncode")})
    if run["returncode"]:
        events["notes"].append(f"exit code {run['returncode']}; stderr ends: {run['stderr']}")
    return events


def torch_missing(python: str, r: dict, name: str) -> str:
    """Why the PyTorch contender ``name`` (torch, airbench) cannot run ("" when it can)."""
    if name == "torch" and r["model"] in AIRBENCH_MODELS:
        return (
            f"no PyTorch mirror of --model={r['model']}: airbench's method in PyTorch is the "
            "airbench contender (its own recipe)"
        )
    if name == "torch" and r["lr_schedule"] != "cosine":
        return f"the PyTorch mirror does --lr_schedule=cosine only, not {r['lr_schedule']}"
    if not python:
        return "no --torch_python (a virtualenv with torch and numpy)"
    probe = subprocess.run([python, "-c", "import torch, numpy"], capture_output=True, text=True)
    if probe.returncode:
        return f"{python} cannot import torch and numpy: {probe.stderr.strip()[-300:]}"
    return ""


# --- what the runs say ----------------------------------------------------------------------


def steady_images_per_sec(marks: list, evals: list, batch: int):
    """Images/s between consecutive marks, leaving out the first window (from update 0:
    start-up, tracing) and every window an evaluation ended in."""
    images = seconds = 0.0
    ends = [e["time_s"] for e in evals]
    for (t0, u0), (t1, u1) in zip(marks[1:], marks[2:]):
        if u1 > u0 and not any(t0 < e <= t1 for e in ends):
            images, seconds = images + (u1 - u0) * batch, seconds + t1 - t0
    return images / seconds if seconds else None


def summarize(events: dict, r: dict, flops_per_image: float, gflops: float) -> dict:
    """One contender's figures: times to the thresholds, final and best top-1, steady
    images/s and the model FLOP/s it means, total wall time."""
    evals = events["evals"]
    for e in evals:
        e["top1"] = round(e["top1"], 6)  # float32 k/10,000 is not always >= k/10,000
    best = max((e["top1"] for e in evals), default=None)
    reached = {
        f"{t:.2f}": next((e["time_s"] for e in evals if e["top1"] >= t), None) for t in THRESHOLDS
    }
    own = events.get("own", {})
    ips = steady_images_per_sec(events["marks"], evals, own.get("batch_size", r["batch_size"]))
    if "forward_macs" in own:  # its own network: 3 x forward, 2 FLOPs a multiply-add
        flops_per_image = 6 * own["forward_macs"]
    flops = ips * flops_per_image if ips else None
    return dict(
        time_to=reached,
        final_top1=evals[-1]["top1"] if evals else None,
        best_top1=best,
        train_images_per_sec=ips,
        model_gflops=flops / 1e9 if flops else None,
        fraction_of_sgemm=flops / (gflops * 1e9) if flops and gflops else None,
        wall_s=events["wall_s"],
        cpu_s=events["cpu_s"],
        load_before_after=events["load"],
        returncode=events["returncode"],
        evaluations=evals,
        notes=events["notes"],
        train_flops_per_image=flops_per_image,
        own_settings=own.get("settings"),
        **events.get("extra", {}),
    )


def ratios(results: dict) -> dict:
    """tfgpu's time to each threshold over each peer's (None where one did not reach it)."""
    ours = results.get("tfgpu", {}).get("time_to")
    out = {}
    for name, res in results.items():
        if name == "tfgpu" or "skipped" in res or not ours:
            continue
        theirs = res["time_to"]
        out[name] = {t: ours[t] / theirs[t] if ours[t] and theirs[t] else None for t in ours}
    return out


def cell_time(seconds, best) -> str:
    if seconds is not None:
        return f"{seconds:.1f} s"
    return "not reached" + (f" (best {best:.2%})" if best is not None else "")


def print_table(results: dict) -> None:
    """One row per contender (Markdown)."""
    head = [f"{t:.0%}" for t in THRESHOLDS]
    print(
        f"\n| contender | {' | '.join(head)} | final top-1 | steady train img/s "
        "| model GFLOP/s (x sgemm) | wall | CPU |"
    )
    print("|---" * (len(head) + 6) + "|")
    for name, res in results.items():
        if "skipped" in res:
            print(f"| {name} | skipped: {res['skipped']} |")
            continue
        times = [cell_time(res["time_to"][f"{t:.2f}"], res["best_top1"]) for t in THRESHOLDS]
        final = "-" if res["final_top1"] is None else f"{res['final_top1']:.2%}"
        ips, gf = res["train_images_per_sec"], res["model_gflops"]
        speed = f"{gf:.1f} ({res['fraction_of_sgemm']:.2f}x)" if gf else "-"
        print(
            f"| {name} | {' | '.join(times)} | {final} | {f'{ips:,.0f}' if ips else '-'} | {speed} "
            f"| {res['wall_s']:.1f} s | {res['cpu_s']:.0f} s |"
        )


def print_report(results: dict, out: dict) -> None:
    print(f"\ncalibration: {out['calibration']}")
    print(
        f"{out['recipe']['model']}: forward {out['forward_macs'] / 1e6:.2f} M MACs/image; "
        f"training {out['train_flops_per_image'] / 1e6:.1f} MFLOP/image (3 x forward, 2 per MAC)"
    )
    for name, res in results.items():
        if res.get("own_settings"):
            own = res["own_settings"]
            print(
                f"{name}: its own network, widths {own.get('widths')}, "
                f"{res['train_flops_per_image'] / 1e6:.1f} MFLOP/training image; its settings: "
                + json.dumps(own)
            )
    print_table(results)
    for name, res in results.items():
        if "skipped" in res:
            continue
        evals = ", ".join(f"{e['time_s']:.1f} s {e['top1']:.2%}" for e in res["evaluations"])
        before, after = res["load_before_after"]
        print(f"{name}: evaluations at {evals or '-'}; load average {before:.1f} -> {after:.1f}")
        for note in res["notes"]:
            print(f"{name}: NOTE {note}")
    for name, by in out["ratios"].items():
        cells = ", ".join(
            f"{float(t):.0%} {v:.2f}" if v else f"{float(t):.0%} -" for t, v in by.items()
        )
        verdicts = ", ".join(
            f"{float(t):.0%} " + ("-" if by[t] is None else "met" if by[t] <= GOAL else "not met")
            for t in GOALS
        )
        print(f"tfgpu / {name}, time to {cells} (goal <= {GOAL}: {verdicts})")


def prepare(args, work: str):
    """(recipe for the peers, data dir, unmirrored flags set, forward MACs); writes the
    recipe into ``work``."""
    config, present = resolve_recipe(args)
    names = args.contenders.split(",")
    unmirrored = check_recipe(config, present, args.allow_unmirrored, names)
    data_dir = os.path.abspath(args.data_dir)
    if args.train_limit:
        data_dir = limited_data_dir(data_dir, args.train_limit, work)
    r = peer_recipe(config, read_info(data_dir), args)
    with open(os.path.join(work, "recipe.json"), "w", encoding="utf-8") as f:
        json.dump(r, f, indent=1)
    return r, data_dir, unmirrored, forward_macs(r)


def main() -> None:
    args = parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="time_to_accuracy-")
    os.makedirs(work, exist_ok=True)
    line = calibration()
    print("calibration:", line, flush=True)
    r, data_dir, unmirrored, macs = prepare(args, work)
    names, results = args.contenders.split(","), {}
    torch_names = [n for n in names if n in TORCH_CONTENDERS]
    why = {n: torch_missing(args.torch_python, r, n) for n in torch_names}
    decode_s = None
    if any(not why[n] for n in torch_names):  # one of them runs: it reads the arrays
        decode_s = write_torch_arrays(data_dir, r, os.path.join(work, "arrays.npz"))
        print(f"decoded the images for torch in {decode_s:.1f} s (off its clock)", flush=True)
    gflops = float(re.search(r"([\d.]+) GFLOP/s", line).group(1))
    for name in names:
        if why.get(name):
            results[name] = {"skipped": why[name]}
            print(f"{name} skipped: {why[name]}", flush=True)
            continue
        events = run_contender(name, args, r, data_dir, work)
        results[name] = summarize(events, r, 6 * macs, gflops)
    out = dict(
        command=" ".join(sys.argv),
        calibration=line,
        sgemm_gflops=gflops,
        recipe=r,
        flagfile=args.flagfile,
        data_dir=data_dir,
        unmirrored_flags=unmirrored,
        forward_macs=macs,
        train_flops_per_image=6 * macs,
        torch_decode_s=decode_s,
        contenders=results,
        ratios=ratios(results),
        goal=GOAL,
    )
    print_report(results, out)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    print(f"\nwrote {args.output}" + (f"; logs in {work}" if args.work_dir else ""))
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
