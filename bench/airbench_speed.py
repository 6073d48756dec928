"""Training and evaluation images per CPU-second of the airbench peer's network
(``time_to_accuracy_airbench.py``) on this CPU: float32 against bfloat16 autocast, channels_last
against NCHW, torch.compile against eager; the variants interleaved, round after round, in one
process, on random 28 x 28 gray images.

    /work/torchenv/bin/python bench/airbench_speed.py [--widths=32,64,64] [--batch=512] \\
        [--steps=6] [--rounds=2] [--threads=1] [--compile]

Per CPU-second (the process's user + system time), not per wall second: on a shared machine a
process gets a varying share of the cores, and PyTorch's OpenMP threads spin while a sibling
waits for a core, so wall figures there say more about the neighbours than the kernels. With
--threads=1 the CPU time is the work; on a quiet machine 2 threads give nearly twice the wall
rate. Prints a calibration line (bench/calibration.py) and the load average with the figures.
"""

import argparse
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import time_to_accuracy_airbench as ab  # noqa: E402
from calibration import calibration  # noqa: E402


def variant(widths, dtype: str, channels_last: bool, batch: int, compiled: bool):
    """(one training step, one evaluation pass over 2,000 images) of a fresh network."""
    layout = torch.channels_last if channels_last else torch.contiguous_format
    net = ab.make_net(1, widths, 10, ab.AIRBENCH94).to(memory_format=layout).train()
    model = torch.compile(net) if compiled else net
    optimizer, _ = ab.build_optimizer(net, ab.AIRBENCH94, batch, 1000)
    x = torch.randn(batch, 1, 28, 28).contiguous(memory_format=layout)
    y = torch.randint(0, 10, (batch,))
    test = torch.randn(2000, 1, 28, 28).contiguous(memory_format=layout)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.2, reduction="none")

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")

    def step():
        with autocast():
            loss = loss_fn(model(x), y).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def evaluate():
        with torch.no_grad(), autocast():
            ab.tta_logits(model.eval(), test, 0)
        model.train()

    return step, evaluate


def per_cpu_second(fn, images: int, repeats: int) -> float:
    start = time.process_time()
    for _ in range(repeats):
        fn()
    return images * repeats / (time.process_time() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--widths", default="32,64,64")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--steps", type=int, default=6, help="timed training steps per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="also torch.compile (bfloat16, NHWC)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    widths = tuple(int(w) for w in args.widths.split(","))
    names = [("float32", True, False), ("bfloat16", True, False), ("bfloat16", False, False)]
    names += [("bfloat16", True, True)] if args.compile else []
    print("calibration:", calibration(), flush=True)
    variants = {}
    for name in names:
        start = time.perf_counter()
        step, evaluate = variants[name] = variant(widths, name[0], name[1], args.batch, name[2])
        step(), step(), evaluate()  # first calls: oneDNN primitives, or compilation
        print(f"{name}: warm-up {time.perf_counter() - start:.1f} s", flush=True)
    for r in range(args.rounds):
        for name, (step, evaluate) in variants.items():
            train = per_cpu_second(step, args.batch, args.steps)
            test = per_cpu_second(evaluate, 2000, 2)
            dtype, nhwc, compiled = name
            print(
                f"round {r}: {dtype:8s} {'NHWC' if nhwc else 'NCHW'}"
                f"{' compiled' if compiled else ''}: train {train:,.0f}, eval {test:,.0f} "
                f"images/CPU-s (widths {args.widths}, batch {args.batch}, "
                f"{args.threads} thread(s), load {os.getloadavg()[0]:.1f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
