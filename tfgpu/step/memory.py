"""What one train step takes of this process' memory, and whether that fits: the measuring of
``--micro_batch_size=auto`` (``train/micro_batch.py`` searches with it; docs/memory.md).

On a GPU: the peak of TensorFlow's allocator on ``GPU:0`` over one run of the step
(``tf.config.experimental.get_memory_info``, reset before), TensorFlow's out-of-memory error
caught; the step fits when it ran and MARGIN more than its peak can still be allocated (or,
with --memory_budget_gb, is within it). On a CPU: the growth of the process' resident memory
over one run (Linux's VmHWM, reset through /proc/self/clear_refs), MARGIN more than it within
--memory_budget_gb or the memory the machine has available (/proc/meminfo MemAvailable).

Test hook (tests and bench/gpu_check.py only, never for real runs): with TFGPU_TEST_OOM_ABOVE=N
in the environment, a step of a micro-batch above N raises TensorFlow's own
ResourceExhaustedError before it runs, as a device that holds N would.
"""

import os
import re
from dataclasses import dataclass

import tensorflow as tf

MARGIN = 0.10  # kept free beyond the measured peak: fragmentation, evaluation, other work
TEST_HOOK = "TFGPU_TEST_OOM_ABOVE"
GB = 1e9


@dataclass(frozen=True)
class Device:
    """Where the step runs and what it may take: ``name`` ("GPU:0" or "CPU"),
    ``budget_bytes`` (None on a GPU without --memory_budget_gb: its allocator's limit) and
    where that budget came from."""

    name: str
    budget_bytes: int | None
    budget_from: str

    def describe(self) -> str:
        if self.budget_bytes is None:
            return f"{self.name} (what its allocator gives)"
        return f"{self.name}, budget {self.budget_bytes / GB:.2f} GB ({self.budget_from})"


@dataclass(frozen=True)
class Measurement:
    """One micro-batch size tried: whether it fits, the step's peak (bytes; None when it
    did not run) and, when it does not fit, why."""

    size: int
    fits: bool
    peak_bytes: int | None
    why: str = ""

    def describe(self) -> str:
        peak = "" if self.peak_bytes is None else f"{self.peak_bytes / GB:.3f} GB"
        return f"{self.size}: " + ", ".join(p for p in (peak, self.why or "fits") if p)


def this_device(budget_bytes: int | None) -> Device:
    """The device this process' step runs on, with ``budget_bytes`` (--memory_budget_gb in
    bytes, None: auto)."""
    gpu = bool(tf.config.list_logical_devices("GPU"))
    name = "GPU:0" if gpu else "CPU"
    if budget_bytes is not None:
        return Device(name, budget_bytes, "--memory_budget_gb")
    if gpu:
        return Device(name, None, "")
    return Device(name, available_bytes(), "MemAvailable")


def available_bytes() -> int:
    """The memory Linux says this machine has available (/proc/meminfo MemAvailable)."""
    return _kib_field("/proc/meminfo", "MemAvailable") * 1024


def measure(run_once, size: int, device: Device) -> Measurement:
    """Runs ``run_once()`` (one train step of micro-batch ``size``) and says whether it fits
    ``device``. TensorFlow's ResourceExhaustedError is caught (and raised by the test hook for
    sizes above its limit); other errors go through."""
    limit = os.environ.get(TEST_HOOK, "")
    try:
        if limit and size > int(limit):
            raise tf.errors.ResourceExhaustedError(
                None, None, f"injected out of memory: micro-batch {size} > {TEST_HOOK}={limit}"
            )
        peak = _gpu_peak(run_once) if device.name.startswith("GPU") else _cpu_growth(run_once)
    except tf.errors.OpError as err:
        if not is_out_of_memory(err):
            raise
        injected = "injected" in (err.message or "")
        return Measurement(size, False, None, "out of memory" + (" (injected)" * injected))
    needed = int(peak * (1 + MARGIN))
    if device.budget_bytes is not None:
        if needed > device.budget_bytes:
            return Measurement(size, False, peak, "over budget with the margin")
    elif not _gpu_can_hold(needed):
        return Measurement(size, False, peak, "no room for the margin")
    return Measurement(size, True, peak)


def is_out_of_memory(err: Exception) -> bool:
    """Whether TensorFlow's error ``err`` is a device out of memory: a ResourceExhaustedError,
    or another error type with those words (XLA and cuDNN report it so, bench/gpu_probes.py)."""
    text = str(err).lower()
    words = "out of memory" in text or "oom when allocating" in text
    return isinstance(err, tf.errors.ResourceExhaustedError) or (
        isinstance(err, tf.errors.OpError) and words
    )


def _gpu_peak(run_once) -> int:
    """The peak bytes of TensorFlow's allocator on GPU:0 while ``run_once()`` runs."""
    tf.config.experimental.reset_memory_stats("GPU:0")
    run_once()
    return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])


def _gpu_can_hold(total: int) -> bool:
    """Whether GPU:0's allocator can hold ``total`` bytes at once, what it holds now
    included: one block of the rest is allocated and freed."""
    rest = total - int(tf.config.experimental.get_memory_info("GPU:0")["current"])
    if rest <= 0:
        return True
    try:
        with tf.device("GPU:0"):
            block = tf.zeros([rest], tf.uint8)
        del block
    except tf.errors.ResourceExhaustedError:
        return False
    return True


def _cpu_growth(run_once) -> int:
    """How far the process' resident memory rose above where it was while ``run_once()``
    ran (bytes): VmHWM, reset first, against VmRSS before. Where the peak cannot be reset
    (/proc/self/clear_refs not writable), against the earlier peak: an underestimate only
    when an earlier step had risen higher."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to VmRSS (Linux >= 4.0)
    except OSError:
        pass
    before = _kib_field("/proc/self/status", "VmRSS")
    run_once()
    return max(0, _kib_field("/proc/self/status", "VmHWM") - before) * 1024


def _kib_field(path: str, name: str) -> int:
    """The value (kB) of line ``name:`` of a /proc file."""
    with open(path) as f:
        found = re.search(rf"^{name}:\s+(\d+)", f.read(), re.M)
    if found is None:
        raise OSError(f"{path} has no {name}")
    return int(found.group(1))
