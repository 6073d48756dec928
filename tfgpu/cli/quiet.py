"""A quiet start: the first line a user reads is tfgpu's, not TensorFlow's start-up notices.

Every command imports TensorFlow through ``import_tensorflow()``. Unless the user set
``TF_CPP_MIN_LOG_LEVEL``, TensorFlow's C++ log level becomes warnings-and-above (1): that
silences the INFO notices that respect it (oneDNN's "custom operations are on", the
CPU-instructions notice). Some lines come before TensorFlow's logging is initialized and ignore
any level (absl writes everything to stderr until then): "WARNING: All log messages before
absl::InitializeLog() ...", cudart_stub's "Could not find cuda drivers" (INFO) and, on a machine
without an NVIDIA driver, cuda_platform's "failed call to cuInit". Nothing in Python can raise
absl's threshold before the library that holds it is loaded, so those lines are taken out of
stderr while TensorFlow is imported and its devices are first listed (that is when cuInit
runs), and every other line is passed on as it came.

A level the user set is honoured for those lines too: 1 drops them as the default does, 2 also
absl's warnings of that moment, 3 (what users export to silence TensorFlow) its errors too, so
that it is never louder than the default; 0 (every log) keeps them all.
"""

import contextlib
import gc
import os
import re
import sys
import tempfile

from tfgpu import compat

# Keras imports these at start-up when they are installed, only to accept them in fit() (a
# pandas DataFrame) and to draw its image gallery (matplotlib), which no tfgpu command uses:
# hidden while TensorFlow and Keras are imported, importable as usual afterwards (tfgpu-report
# imports matplotlib itself). pandas: 0.5 of the ~4.5 CPU-s of `import tensorflow`; matplotlib
# ~0.3 of the ~2.4 CPU-s a command takes to import TensorFlow and the train loop (measured, 2
# cores, 3 interleaved rounds).
# TensorFlow's legacy tf.keras, which TensorFlow imports itself (tfgpu uses Keras 3), tries
# scipy (sparse inputs to its fit): hidden too, so that a run imports no scipy (with the
# converter's imported where it searches: a 6-update run 4.38 -> 4.05 CPU-s, best of 4). Not
# h5py, which it tries as well: Keras 3's legacy H5 reader (a Keras .h5 file of pretrained
# weights) tries it once and keeps None.
HIDDEN_WHILE_IMPORTING = ("pandas", "matplotlib", "scipy")

# Read when this module is first imported: before any tfgpu code sets the variable.
USER_LOG_LEVEL = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
DEFAULT_LOG_LEVEL = "1"  # warnings and above

_NOISE = (
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called"),
    re.compile(r"^I\d{4} "),  # absl INFO lines written before its log was initialized
    re.compile(r"^To enable the following instructions: .* rebuild TensorFlow"),
)
_NO_DRIVER = re.compile(r"^E\d{4} .*\] failed call to cuInit")
# What each level above 1 drops besides: absl's warnings (2), and its errors too (3).
_QUIETER = {2: re.compile(r"^W\d{4} "), 3: re.compile(r"^[WE]\d{4} ")}


def _is_noise(line: str, has_driver: bool, level: int = 1) -> bool:
    """Whether ``line``, written to stderr while TensorFlow starts, is dropped at the C++ log
    ``level`` (the user's TF_CPP_MIN_LOG_LEVEL, else DEFAULT_LOG_LEVEL; 0 drops nothing)."""
    if level < 1:
        return False
    if any(p.search(line) for p in _NOISE):
        return True
    if level in _QUIETER and _QUIETER[level].search(line):
        return True
    return not has_driver and bool(_NO_DRIVER.search(line))


def log_level() -> int:
    """The C++ log level TensorFlow starts with: the user's (a number from 0 to 3; anything
    else TensorFlow reads as 0), else DEFAULT_LOG_LEVEL."""
    text = (DEFAULT_LOG_LEVEL if USER_LOG_LEVEL is None else USER_LOG_LEVEL).strip()
    return min(int(text), 3) if text.isdigit() else 0


def has_nvidia_driver() -> bool:
    """Whether an NVIDIA kernel driver is loaded: without one TensorFlow sees no GPU."""
    return os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/nvidiactl")


def quiet_log_level() -> None:
    """TensorFlow's C++ log level: the user's, or warnings and above. Call before TensorFlow
    is imported (also by processes that hand their environment to TensorFlow children)."""
    if USER_LOG_LEVEL is None:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = DEFAULT_LOG_LEVEL


@contextlib.contextmanager
def _hidden(names):
    """Inside, ``import name`` raises ImportError for each of ``names`` not yet imported."""
    hidden = [name for name in names if name not in sys.modules]
    sys.modules.update(dict.fromkeys(hidden))
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, "") is None:
                del sys.modules[name]


@contextlib.contextmanager
def _importing():
    """Around TensorFlow's import: HIDDEN_WHILE_IMPORTING hidden, and Python's cycle collector
    off, then what the import built moved out of its reach (``gc.freeze``). The import builds
    over a million objects that live as long as the process, which every full collection would
    otherwise walk again (measured: a 6-update tiny_cnn run 8.65 -> 6.88 CPU-s)."""
    if "tensorflow" in sys.modules:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        with _hidden(HIDDEN_WHILE_IMPORTING):
            yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def import_tensorflow():
    """``import tensorflow`` (and a first look at its GPUs) without the start-up notices the
    log level drops (``_is_noise``), as ``_importing`` does it, with tfgpu's code traced as written
    (``compat.trace_tfgpu_as_written``); returns the module."""
    quiet_log_level()
    level = log_level()
    if "tensorflow" in sys.modules or level == 0:
        with _importing():
            import tensorflow as tf

        compat.trace_tfgpu_as_written()
        return tf
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            with _importing():
                import tensorflow as tf

            tf.config.list_physical_devices("GPU")  # cuInit: its complaint comes now
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            has_driver = has_nvidia_driver()
            kept = [
                line
                for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True)
                if not _is_noise(line, has_driver, level)
            ]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
    compat.trace_tfgpu_as_written()
    return tf
