"""One line that tells how fast this machine is, printed by every benchmark next to its
absolute figures: CPU model, cores, vector units and numpy float32 matmul GFLOP/s. Machines
here differ up to ~6x (AVX2 vs AVX-512); scale absolute figures by the GFLOP/s."""

import os
import time

import numpy as np


def calibration(repeats: int = 5) -> str:
    """ "CPU model, N cores (AVX-512|AVX2), numpy sgemm 2048^2: X GFLOP/s", the best of
    ``repeats`` matmuls (each ~17 GFLOP: ~0.25 s on 2 cores)."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    a = np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    gflops = 2 * 2048**3 / best / 1e9
    cores = len(os.sched_getaffinity(0))
    return f"{model}, {cores} cores ({simd}), numpy sgemm 2048^2: {gflops:.0f} GFLOP/s"


if __name__ == "__main__":
    print(calibration())
