"""What a test needs beyond tfgpu's own dependencies, said in one place: ``requires(name)``.

The suite uses system pieces and optional packages (Horovod, Ray, mpirun, network
namespaces, sshd, Chromium, MLflow, the export runtimes, KerasHub, Fashion-MNIST ...). Where
one is missing, a test that needs it skips and says how to get it, so that ``make
test-fast-bare`` (a virtualenv without the extras) runs what it can. ``make test`` (what CI
runs, ``.ci/run``) installs every one and sets ``REQUIRE_ALL_ENV``: there a missing dependency
fails the test that needs it instead of vanishing into a skip count (and tests/conftest.py
turns any other skip but the opt-in heavy tier's into a failure too).

``requires("ray")`` in a test, a fixture or at a module's top; ``@pytest.mark.requires("onnx")``
on a test (tests/conftest.py calls ``requires`` before it runs). Each check is cheap (a file
or a module looked up, not imported) and made once per process.
"""

import functools
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

REQUIRE_ALL_ENV = "TFGPU_REQUIRE_ALL"
_SBIN = "/usr/sbin:/usr/local/sbin"


def _module(name: str, how: str):
    def check():
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError:  # its parent package is missing
            found = False
        return None if found else f"no {name}: {how}"

    return check


def _program(name: str, how: str, path: str | None = None):
    def check():
        where = f"{path}:{os.environ.get('PATH', '')}" if path else None
        return None if shutil.which(name, path=where) else f"no `{name}`: {how}"

    return check


def _horovod():
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable))
    missing = _module("horovod.tensorflow", "`make horovod` builds it")()
    return missing or (None if horovodrun else "no horovodrun beside this Python: `make horovod`")


def _horovod_mpi():
    """Horovod built with its MPI controller (asked in a process of its own: importing
    horovod.tensorflow here would cost the test process seconds and a TensorFlow)."""
    missing = _horovod() or _program("mpirun", "apt-get install openmpi-bin")()
    if missing:
        return missing
    code = "import horovod.tensorflow as h; raise SystemExit(0 if h.mpi_built() else 1)"
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    return None if probe.returncode == 0 else "Horovod built without MPI: `make horovod` (mpicxx)"


def _netns():
    """Network namespaces can be made here: one is added and removed."""
    if os.geteuid() != 0:
        return f"network namespaces need root (CAP_SYS_ADMIN); running as uid {os.geteuid()}"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"no `{tool}`: apt-get install {package}"
    name = f"tfgpu-probe-{os.getpid()}"
    added = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    return None if added.returncode == 0 else f"`ip netns add` failed: {added.stderr.strip()}"


def _sshd():
    for tool, where in (("sshd", _SBIN), ("ssh", None), ("ssh-keygen", None)):
        missing = _program(tool, "apt-get install openssh-server openssh-client", where)()
        if missing:
            return missing
    return None


def _chromium():
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        return None
    return "no chromium: apt-get install chromium (tools/install_system_packages.sh)"


def _mlflow_server():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    server = os.path.join(root, ".venv-mlflow", "bin", "mlflow")
    return None if os.access(server, os.X_OK) else f"no {server}: `make mlflow-server`"


def _export(*modules):
    def check():
        for name in modules:
            missing = _module(name, "pip install -e '.[export]' (`make export`)")()
            if missing:
                return missing
        return None

    return check


def _directory(path: str, how: str):
    return lambda: None if os.path.isdir(path) else f"no {path}: {how}"


def _two_cores():
    cores = len(os.sched_getaffinity(0))
    return None if cores >= 2 else f"{cores} CPU core(s): the test needs 2"


def _gpu_kernels():
    from tfgpu.compat import gpu_kernels  # noqa: PLC0415 (TensorFlow: only where asked)

    return None if gpu_kernels("GatherV2") else "this TensorFlow build registers no GPU kernels"


def _no_gpu():
    import tensorflow as tf  # noqa: PLC0415

    gpus = tf.config.list_physical_devices("GPU")
    return f"checks the CPU-only behaviour; this machine has {len(gpus)} GPU(s)" if gpus else None


FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
# name -> a check that returns None when the dependency is there, else what is missing and how
# to get it. `make test` installs every one (the Makefile's targets, tools/*.sh).
DEPENDENCIES = {
    "horovod": _horovod,
    "horovod_mpi": _horovod_mpi,
    "mpirun": _program("mpirun", "apt-get install openmpi-bin"),
    "netns": _netns,
    "sshd": _sshd,
    "ray": _module("ray.train", "pip install -e '.[ray]' (`make ray`)"),
    "mlflow": _module("mlflow", "pip install -e '.[mlflow]' (`make mlflow`)"),
    "mlflow_server": _mlflow_server,
    "matplotlib": _module("matplotlib", "pip install -e '.[report]' (`make report`)"),
    "hub": _module("keras_hub", "pip install -e '.[hub]' (`make hub`)"),
    "chromium": _chromium,
    "litert": _export("ai_edge_litert"),
    "onnx": _export("tf2onnx", "onnx", "onnxruntime"),
    "fashion_mnist": _directory(FASHION_MNIST, "apt-get install dataset-fashion-mnist"),
    "two_cores": _two_cores,
    "gpu_kernels": _gpu_kernels,
    "no_gpu": _no_gpu,
}


def require_all() -> bool:
    """True where every dependency must be there (``make test``, CI): a missing one fails."""
    return os.environ.get(REQUIRE_ALL_ENV, "") not in ("", "0")


@functools.cache
def missing(dependency: str) -> str | None:
    """What is missing of ``dependency`` and how to get it, or None when it is there."""
    if dependency not in DEPENDENCIES:
        raise KeyError(f"requires({dependency!r}): not one of {sorted(DEPENDENCIES)}")
    return DEPENDENCIES[dependency]()


def requires(dependency: str) -> None:
    """Returns when ``dependency`` is there; else skips the test (the module, at its top) or,
    under ``REQUIRE_ALL_ENV``, fails it."""
    reason = missing(dependency)
    if reason is None:
        return
    if require_all():
        pytest.fail(f"requires {dependency}: {reason} ({REQUIRE_ALL_ENV} is set: `make test`)")
    pytest.skip(f"requires {dependency}: {reason}", allow_module_level=True)
