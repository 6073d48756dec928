"""The side-car evaluator's command part (docs/evaluator.md): ``follow`` starts TensorFlow
quietly and hands the run to ``inference.sidecar.watch``, for ``tfgpu-evaluate --watch`` and for a
TF_CONFIG evaluator task of ``tfgpu-train``, whose --watch_interval_s and --watch_timeout_s
``define_flags`` defines (``settings.SidecarSettings``; tfgpu-evaluate's include them).
"""

from absl import flags

from tfgpu.cli import quiet
from tfgpu.cli.flags import define_settings
from tfgpu.cli import head
from tfgpu.cli.settings import SidecarSettings
from tfgpu.errors import UsageError

GROUP = "tfgpu: the side-car evaluator (a TF_CONFIG evaluator task)"


def define_flags(flag_values=flags.FLAGS) -> None:
    """--watch_interval_s and --watch_timeout_s, for tfgpu-train's evaluator task."""
    define_settings(SidecarSettings, GROUP, flag_values)


def follow(model_dir: str, interval_s: float, timeout_s: float) -> int:
    """Evaluates every checkpoint of the run in ``model_dir`` as it appears, to the run's end,
    looking every ``interval_s`` seconds and giving up after ``timeout_s`` without anything
    new (``inference.sidecar.watch``); returns how many it evaluated."""
    if not model_dir:
        raise UsageError("--watch needs --model_dir (the trainers')")
    quiet.import_tensorflow()
    return watch(model_dir, interval_s, timeout_s)


def watch(model_dir: str, interval_s: float = 10.0, timeout_s: float = 3600.0, log=print) -> int:
    """``inference.sidecar.watch`` of the run in ``model_dir``, which it opens once its
    config.json is there (``head.open_run``, its optimizer too: the learning rate of each
    row it writes). Call it once TensorFlow has started."""
    from tfgpu.inference import sidecar  # noqa: PLC0415 (TensorFlow: after its quiet start)

    opening = lambda folder: head.open_run(folder, optimizer=True)  # noqa: E731
    return sidecar.watch(model_dir, opening, interval_s, timeout_s, log)
