"""bench/gpu_check.py, the GPU machine's first check: its --dry_run runs every path on this
CPU and prints every row of its table, exit 0; without a GPU and without --dry_run it says so
in one line and exits 2; its batch search doubles, backs off and stops at the cap."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"
THROUGHPUT = [
    f"{model} {setting}"
    for model in ("resnet50", "efficientnet_b0", "densenet121")
    for setting in ("float32", "mixed_float16", "mixed_float16 + XLA")
]

no_gpu = pytest.mark.requires("no_gpu")  # checks the CPU-only behaviour


def _gpu_check(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, timeout=600
    )


def _table(stdout: str) -> dict:
    """{check: [measured, reference, ratio, notes]} of the printed markdown table."""
    rows = [line.strip("|").split(" | ") for line in stdout.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}


@no_gpu
def test_the_dry_run_prints_every_row_and_exits_0():
    # A budget of 0: resnet50 always runs; the other models show the budget's skip.
    out = _gpu_check("--dry_run", "--time_budget_s=0")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "calibration: " in out.stdout and "numpy sgemm" in out.stdout
    assert "devices: no GPU" in out.stdout
    table = _table(out.stdout)
    assert list(table)[:9] == THROUGHPUT
    for check in THROUGHPUT[:3]:
        assert table[check][0].endswith("img/s (batch 4)"), table[check]
        assert "dry run" in table[check][3]
    assert table["resnet50 float32"][1] == "909 (TF32+XLA b256, A100 40GB)"
    assert table["densenet121 float32"][1] == "n/a (not published)"
    for check in THROUGHPUT[3:]:
        assert table[check][0] == "skipped: --time_budget_s"
    assert table["train step ops with a GPU kernel"][0] == "all"
    placement = table["train step ops placed on the CPU"]
    assert placement[0] == "skipped: no GPU" and "placement log read" in placement[3]
    assert "img/s (reader alone" in table["input pipeline, resize on device"][0]
    assert table["gradient all-reduces per update"][0].startswith("1 per update")
    auto = table["micro-batch auto"]  # replica batch 8, out of memory injected above 2
    assert auto[0].startswith("2 of 8 (8: out of memory (injected); 4: out of memory"), auto
    nccl = table["NCCL all-reduce, 2+ GPUs"]
    assert nccl[0] == "skipped: no GPU"
    assert "{'NcclAllReduce': 2}" in nccl[3] and "2 all-reduces in 2 updates" in nccl[3]


@no_gpu
def test_without_a_gpu_it_says_so_in_one_line_and_exits_2():
    out = _gpu_check()
    assert out.returncode == 2
    [line] = out.stdout.strip().splitlines()
    assert line.startswith("gpu_check: no GPU is visible")
    assert line.endswith("--dry_run or --allow_cpu to go on without one")


def _load_gpu_check():
    """The script as a module (it imports no TensorFlow until main runs); the bench folder
    it puts on sys.path is taken off again (bench/models.py is not tfgpu.models)."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module, path = importlib.util.module_from_spec(spec), list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
    return module


@pytest.mark.fast
@pytest.mark.parametrize(
    "start, cap, fits_up_to, found, tried",
    [
        (2, 64, 16, 16, [2, 4, 8, 16, 32]),  # doubles until out of memory
        (128, 512, 16, 16, [128, 64, 32, 16]),  # the start does not fit: halves
        (4, 20, 100, 16, [4, 8, 16]),  # the cap: 32 is not tried
        (4, 64, 0, None, [4, 2, 1]),  # nothing fits
    ],
)
def test_the_batch_search_doubles_backs_off_and_caps(start, cap, fits_up_to, found, tried):
    calls = []

    def fits(batch):
        calls.append(batch)
        return f"ran {batch}" if batch <= fits_up_to else None

    best = _load_gpu_check().largest_batch(fits, start, cap)
    assert calls == tried
    assert best == (None if found is None else (found, f"ran {found}"))
