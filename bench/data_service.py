"""What the tf.data service costs: images/s handed to the step, local pipeline against the same
pipeline run by a service worker on this machine (--data_service=grpc://localhost:P).

    python bench/data_service.py [--rounds=5] [--seconds=5]

Two datasets: 224x224 random-resized crops from ~1,000 ImageNet-like JPEGs (the records of
bench/input_pipeline.py, built once) and 32x32 crops of the demo digits (per example,
--in_memory=off). Contenders, in alternating rounds (order reversed every other round):

  local            pipeline.make_train_dataset, consumed in this process
  local by epochs  service.make_train_dataset without a service: the stream the workers run
                   (an epoch restarted per split), to tell its cost from the transport's
  service          the same through `python -m tfgpu.data.service_server --role=local
                   --num_workers=1` (a separate process on the same 2 cores), compression none
  service, auto    the same with --data_service_compression=auto

Each measurement: a fresh iterator, 3 warm-up batches, then ~--seconds of per-replica batches
taken as the step takes them (next() on the dataset). images/s are medians over rounds;
ratios are medians of per-round ratios [range]. CPU us/img adds this process's CPU time and
the service process's (psutil): on a shared machine it is steadier than the wall clock. The
overhead per image is the service's minus local's, in wall time and in CPU time.

On one machine the service cannot be faster: the worker decodes on the cores the consumer
uses, and every batch is serialized, sent over loopback gRPC and copied again.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402
from calibration import calibration  # noqa: E402

from tfgpu.distribute.env import free_ports  # noqa: E402

WARMUP_BATCHES = 3


def start_service(port: int) -> subprocess.Popen:
    """A dispatcher and one worker in one process, once it says it serves."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfgpu.data.service_server", "--role=local", "--num_workers=1"]
        + [f"--port={port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    for line in proc.stdout:
        if "serving" in line:
            return proc
    raise SystemExit("the local service did not start")


def datasets(cache_dir: str, num_images: int) -> dict:
    """name -> (DataSpec, DataConfig, per-replica batch)."""
    from input_pipeline import NUM_CLASSES, build_data

    from tfgpu.config import config_from
    from tfgpu.demo import build_demo_dataset
    from tfgpu.data.spec import load_data_spec, load_spec

    tfr, _ = build_data(cache_dir, num_images)
    big = config_from(image_size=224, shuffle_buffer=1024, in_memory="off").data
    demo_dir = build_demo_dataset()
    small = config_from(data_dir=demo_dir, image_size=32, in_memory="off").data
    return {
        "224x224 JPEG crops": (load_data_spec(tfr, num_classes=NUM_CLASSES), big, 64),
        "32x32 demo digits": (load_spec(small), small, 256),
    }


def contenders(spec, data, batch: int, service_address: str) -> dict:
    """name -> function making a fresh dataset of per-replica batches."""
    import dataclasses

    from tfgpu.data import pipeline
    from tfgpu.data import service_client as service
    from tfgpu.data.stream import Stream
    from tfgpu.distribute import InputShard

    shard = InputShard(1, 0)
    kw = dict(stream=Stream(batch_size=batch, global_batch_size=batch, seed=0, deterministic=False))
    jobs = iter(range(10**6))

    def through(compression: str):
        d = dataclasses.replace(data, data_service=service_address)
        d = dataclasses.replace(d, data_service_compression=compression)
        return lambda: service.distribute(
            service.make_train_dataset(spec, d, shard, **kw), d, f"bench-{next(jobs)}-{time.time()}"
        )

    return {
        "local": lambda: pipeline.make_train_dataset(spec, data, shard, name_broken=False, **kw),
        "local by epochs": lambda: service.make_train_dataset(spec, data, shard, **kw),
        "service": through("none"),
        "service, auto": through("auto"),
    }


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def measure(make, seconds: float, service_pid: int) -> tuple[float, float]:
    """(images/s, CPU us per image of this process + the service's) after the warm-up."""
    iterator = iter(make())
    first = next(iterator)
    per_batch = int(first["label"].shape[0])
    for _ in range(WARMUP_BATCHES - 1):
        next(iterator)
    me, other = os.getpid(), service_pid
    cpu0 = cpu_seconds(me) + cpu_seconds(other)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(iterator)
        count += 1
    wall = time.perf_counter() - start
    cpu = cpu_seconds(me) + cpu_seconds(other) - cpu0
    del iterator
    return count * per_batch / wall, cpu / (count * per_batch) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_images", type=int, default=1000)
    parser.add_argument("--cache_dir", default=os.path.expanduser("~/.cache/tfgpu/bench_input"))
    parser.add_argument("--seconds", type=float, default=5.0, help="~ per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(calibration(), flush=True)
    port = free_ports(1)[0]
    server = start_service(port)
    try:
        rows = []
        for name, (spec, data, batch) in datasets(args.cache_dir, args.num_images).items():
            makes = contenders(spec, data, batch, f"grpc://localhost:{port}")
            rates = {k: [] for k in makes}
            cpus = {k: [] for k in makes}
            for r in range(args.rounds):
                order = list(makes) if r % 2 == 0 else list(reversed(makes))
                for k in order:
                    rate, cpu = measure(makes[k], args.seconds, server.pid)
                    rates[k].append(rate)
                    cpus[k].append(cpu)
                    time.sleep(1.0)  # the service's abandoned job winds down
                last = {k: round(v[-1]) for k, v in rates.items()}
                print(f"{name}, round {r + 1}: " + json.dumps(last), flush=True)
            rows.append((name, batch, rates, cpus))
    finally:
        server.terminate()
        server.wait(timeout=30)
    print_table(rows, "python " + " ".join(sys.argv))


def print_table(rows, command: str) -> None:
    med = statistics.median
    print(f"\n`{command}`\n")
    print(
        "| images (batch) | pipeline | images/s | x local [range] | CPU us/img | "
        "overhead us/img, wall | overhead us/img, CPU |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, batch, rates, cpus in rows:
        local, local_cpu = rates["local"], cpus["local"]
        for k in rates:
            ratio = [r / loc for r, loc in zip(rates[k], local)]
            wall = [1e6 / r - 1e6 / loc for r, loc in zip(rates[k], local)]
            cpu = [c - lc for c, lc in zip(cpus[k], local_cpu)]
            over = "-" if k == "local" else f"{med(wall):.0f}"
            over_cpu = "-" if k == "local" else f"{med(cpu):.0f}"
            print(
                f"| {name} ({batch}) | {k} | {med(rates[k]):.0f} | {med(ratio):.2f} "
                f"[{min(ratio):.2f}-{max(ratio):.2f}] | {med(cpus[k]):.0f} | {over} | {over_cpu} |"
            )


if __name__ == "__main__":
    main()
