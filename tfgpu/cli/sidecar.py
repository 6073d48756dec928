"""The side-car evaluator's command part (docs/evaluator.md): its settings, which
``tfgpu-evaluate --watch`` and a TF_CONFIG evaluator task of ``tfgpu-train`` share, and
``follow``, which starts TensorFlow quietly and hands the run to ``trained.sidecar.watch``.
"""

from dataclasses import dataclass

from absl import flags

from tfgpu.cli import quiet
from tfgpu.cli.flags import define_settings
from tfgpu.errors import UsageError
from tfgpu.schema import setting

GROUP = "the side-car evaluator"


@dataclass(frozen=True)
class SidecarSettings:
    """How the side-car evaluator follows a run."""

    watch_interval_s: float = setting(10.0, "With --watch: seconds between looks.")
    watch_timeout_s: float = setting(
        3600.0,
        "With --watch: give up (an error) after this many seconds without a new checkpoint "
        "or the run's end.",
    )


def define_flags(flag_values=flags.FLAGS) -> None:
    """--watch_interval_s and --watch_timeout_s."""
    define_settings(SidecarSettings, GROUP, flag_values)


def follow(model_dir: str, settings: SidecarSettings) -> int:
    """Evaluates every checkpoint of the run in ``model_dir`` as it appears, to the run's end
    (``trained.sidecar.watch``); returns how many it evaluated."""
    if not model_dir:
        raise UsageError("--watch needs --model_dir (the trainers')")
    quiet.import_tensorflow()
    from tfgpu.trained import sidecar  # noqa: PLC0415 (TensorFlow: after its quiet start)

    return sidecar.watch(model_dir, settings.watch_interval_s, settings.watch_timeout_s)
