"""What choosing a strategy costs, measured side by side.

    python bench/strategy_overhead.py [--rounds=7] [--steps=20] [--no_processes]

(1) One process, one device: tfgpu's loop (loops.make_train_loop, --steps_per_loop updates a
    call) under default, one_device and mirrored, and Keras ``fit`` under the default
    strategy and under MirroredStrategy, all built in this process, same model (tiny_cnn 32x32,
    batch 64, adam, synthetic uint8 batches), timed in alternating rounds (order reversed every
    other round). Ratios are medians of per-round ratios, by wall time and by this process's
    CPU time (the machine is shared; CPU time is what another job cannot take away).
(2) Several devices and processes: CPU-seconds per image over all processes of a run, of
    ``python -m tfgpu.main`` with the same settings: 1 process (default), mirrored on 2
    logical CPU devices, multi_worker_mirrored with 2 processes (tfgpu.launch). Start-up is
    taken out by running each twice, with N and 2N updates, and dividing the difference.
    Ideal: 1.0x the single process.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from calibration import calibration  # noqa: E402

BATCH, SIZE, CLASSES = 64, 32, 10
SETTINGS = dict(
    model="tiny_cnn",
    image_size=SIZE,
    global_batch_size=BATCH,
    optimizer="adam",
    synthetic_data=True,
    num_classes=CLASSES,
    export=False,
    log_every_steps=10**6,
    checkpoint_every_steps=10**6,
)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tfgpu_contender(strategy: str, steps: int):
    """``run()`` of ``steps`` updates of tfgpu's own loop under ``strategy``."""
    import tensorflow as tf

    from tfgpu.step import loops
    from tfgpu.train import loop as conductor
    from tfgpu.config import config_from
    from tfgpu.data import run_input
    from tfgpu.distribute import backends

    config = config_from(
        **SETTINGS,
        strategy=strategy,
        train_steps=10**6,
        steps_per_loop=steps,
        model_dir=tempfile.mkdtemp(prefix="tfgpu-bench-"),
    )
    backend = backends.build_backend(strategy, config.dist)
    inputs, _, run, _ = conductor.assemble(config, backend)
    loop = loops.make_train_loop(run.step, run.global_step, run.skipped_updates)
    batches, _, _ = run_input.train_batches(inputs, backend, 0)
    return lambda: float(loop(batches, tf.constant(steps))[0]["loss"])


def keras_contender(mirrored: bool, steps: int):
    """``run()`` of ``steps`` updates of Keras ``fit`` (steps_per_execution=steps)."""
    import keras
    import tensorflow as tf

    from tfgpu import models
    from tfgpu.config import config_from
    from tfgpu.data import pipeline

    strategy = (
        tf.distribute.MirroredStrategy(["/cpu:0"]) if mirrored else tf.distribute.get_strategy()
    )
    data = pipeline.make_synthetic_dataset(BATCH, CLASSES, config_from(image_size=SIZE).data)
    data = data.map(lambda b: (tf.cast(b["image"], tf.float32), b["label"]))
    with strategy.scope():
        model = models.build_model("tiny_cnn", CLASSES, SIZE)
        model.compile(
            optimizer=keras.optimizers.Adam(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps,
        )
    return lambda: model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)


def part_one(rounds: int, steps: int) -> None:
    contenders = {
        "tfgpu default": tfgpu_contender("default", steps),
        "tfgpu one_device": tfgpu_contender("one_device", steps),
        "tfgpu mirrored (1 device)": tfgpu_contender("mirrored", steps),
        "Keras fit, default": keras_contender(False, steps),
        "Keras fit, MirroredStrategy (1 device)": keras_contender(True, steps),
    }
    for run in contenders.values():  # trace, compile, warm up
        run()
        run()
    wall = {k: [] for k in contenders}
    cpu = {k: [] for k in contenders}
    for r in range(rounds):
        for name in list(contenders)[:: 1 if r % 2 == 0 else -1]:
            w0, c0 = time.perf_counter(), _cpu()
            contenders[name]()
            wall[name].append(steps * BATCH / (time.perf_counter() - w0))
            cpu[name].append(steps * BATCH / (_cpu() - c0))
    print(f"\n(1) one device, {rounds} alternating rounds of {steps} updates of {BATCH}")
    print("| contender | images/s (wall) | images/s per CPU-second | ratio wall | ratio CPU |")
    print("|---|---:|---:|---:|---:|")
    for name in contenders:
        base = "Keras fit, default" if name.startswith("Keras") else "tfgpu default"
        ratios = [statistics.median(a / b for a, b in zip(d[name], d[base])) for d in (wall, cpu)]
        rates = [statistics.median(d[name]) for d in (wall, cpu)]
        print(f"| {name} | {rates[0]:,.0f} | {rates[1]:,.0f} | {ratios[0]:.3f} | {ratios[1]:.3f} |")
    m, k = "tfgpu mirrored (1 device)", "Keras fit, MirroredStrategy (1 device)"
    ratio = statistics.median(a / b for a, b in zip(wall[m], wall[k]))
    print(f"tfgpu mirrored / Keras fit mirrored, wall: {ratio:.3f}")


def _flags(values: dict) -> list:
    """Settings as tfgpu.main flags."""
    out = []
    for key, value in values.items():
        if isinstance(value, bool):
            out.append(f"--{key}" if value else f"--no{key}")
        else:
            out.append(f"--{key}={value}")
    return out


def _run_cpu_seconds(cmd: list, env: dict) -> float:
    """CPU-seconds (user + system) of ``cmd`` and every process it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def part_two(rounds: int, steps: int) -> None:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    main = [sys.executable, "-m", "tfgpu.main"]
    configs = {
        "1 process (default)": main + ["--strategy=default"],
        "mirrored, 2 logical CPU devices": main
        + ["--strategy=mirrored", "--logical_cpu_devices=2"],
        "multi_worker_mirrored, 2 processes": [
            sys.executable,
            "-m",
            "tfgpu.launch",
            "--num_workers=2",
            "--",
            *main[3:],
            "--strategy=multi_worker_mirrored",
        ],
    }
    per_image = {k: [] for k in configs}
    for r in range(rounds):
        for name, cmd in list(configs.items())[:: 1 if r % 2 == 0 else -1]:
            seconds = []
            for n in (steps, 2 * steps):
                out = tempfile.mkdtemp(prefix="tfgpu-bench-")
                flags = _flags(dict(SETTINGS, train_steps=n, model_dir=out))
                seconds.append(_run_cpu_seconds(cmd + flags, env))
            per_image[name].append((seconds[1] - seconds[0]) / (steps * BATCH))
    print(
        f"\n(2) CPU-seconds per image, all processes ({rounds} rounds, {steps} vs "
        f"{2 * steps} updates)"
    )
    print("| configuration | CPU ms per image | vs 1 process (ideal 1.0) |")
    print("|---|---:|---:|")
    base = per_image["1 process (default)"]
    for name, values in per_image.items():
        ratio = statistics.median(v / b for v, b in zip(values, base))
        print(f"| {name} | {statistics.median(values) * 1e3:.3f} | {ratio:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--process_rounds", type=int, default=2)
    parser.add_argument("--process_steps", type=int, default=100)
    parser.add_argument("--no_processes", action="store_true")
    args = parser.parse_args()
    print("calibration:", calibration())
    part_one(args.rounds, args.steps)
    if not args.no_processes:
        part_two(args.process_rounds, args.process_steps)


if __name__ == "__main__":
    main()
