"""The curriculum's settings (``config.curriculum``): how what the model sees changes over
training beyond the per-example draws, repeated augmentation (``sampling.py``) and
progressive resizing (``train/progressive.py``), with their checks against the data settings
(``config.DataConfig``), which need no TensorFlow.
"""

from dataclasses import dataclass

from tfgpu.data.config import DataConfig
from tfgpu.errors import ConfigError
from tfgpu.settings import setting


@dataclass(frozen=True)
class CurriculumConfig:
    """How what the model sees changes over training, beyond the per-example draws:
    repeated augmentation (``sampling.py``) and progressive resizing (``train/progressive.py``). A
    section of its own (``config.curriculum``)."""

    repeated_augment: int = setting(
        1,
        "Repeated augmentation (timm's RepeatAugSampler, DeiT): each example K times in a "
        "row of global batches, each copy with its own augmentation draws, the copies "
        "global_batch_size / K positions apart (on different replicas when there are at least "
        "K). An epoch stays the train split's size, as timm's default: about N / K distinct "
        "examples, each K times (a pass over the data takes K epochs). 1: off.",
    )
    progressive_stages: int = setting(
        1,
        "Progressive resizing (EfficientNetV2's progressive learning): N stages, each an equal "
        "share of the updates, whose train image size (and, when their minimums are set, "
        "RandAugment magnitude and MixUp/CutMix alpha) grow linearly from the minimums to "
        "--image_size and the final values; evaluation stays at --image_size. 0 or 1: off.",
    )
    progressive_min_image_size: int = setting(
        0,
        "--progressive_stages: the first stage's image side (rounded down to a multiple of 8 "
        "like every stage's but the last, which is --image_size).",
    )
    progressive_min_magnitude: float = setting(
        -1.0,
        "--progressive_stages: the first stage's --randaugment_magnitude (-1: the final one "
        "in every stage).",
    )
    progressive_min_mixup_alpha: float = setting(
        -1.0, "--progressive_stages: the first stage's --mixup_alpha (-1: the final one)."
    )
    progressive_min_cutmix_alpha: float = setting(
        -1.0, "--progressive_stages: the first stage's --cutmix_alpha (-1: the final one)."
    )


def check_curriculum(c: CurriculumConfig, d: DataConfig, global_batch_size: int) -> None:
    """Raises a ConfigError naming the first --flag of ``c`` that cannot work with the data
    settings ``d`` and --global_batch_size."""
    k = c.repeated_augment
    if not 1 <= k <= 64:
        raise ConfigError(f"--repeated_augment={k} must be in 1..64 (1: off)")
    if k > 1 and global_batch_size % k:
        raise ConfigError(
            f"--repeated_augment={k} must divide --global_batch_size={global_batch_size}: "
            "each global batch holds global_batch_size / K examples, K times"
        )
    for flag, on in (("--data_service", d.data_service), ("--synthetic_data", d.synthetic_data)):
        if k > 1 and on:
            raise ConfigError(
                f"--repeated_augment and {flag} do not go together: it repeats the examples of "
                "tfgpu's own train pipelines"
            )
    if c.progressive_stages < 0:
        raise ConfigError(f"--progressive_stages={c.progressive_stages} must not be negative")
    if c.progressive_stages > 1:
        _check_progressive(c, d)


def _check_progressive(c: CurriculumConfig, d: DataConfig) -> None:
    """--progressive_stages' minimums lie between 0 (8 pixels, above --crop_padding) and the
    final values, each set only where its final one is in use; a run with stages reads
    tfgpu's own train pipelines."""
    n, low = c.progressive_stages, c.progressive_min_image_size
    if n > 64:
        raise ConfigError(f"--progressive_stages={n} must be at most 64")
    if not max(8, d.crop_padding + 1) <= low <= d.image_size:
        raise ConfigError(
            f"--progressive_min_image_size={low} must be in [max(8, --crop_padding + 1), "
            f"--image_size={d.image_size}] with --progressive_stages={n}"
        )
    finals = {
        "magnitude": (d.randaugment_magnitude, d.augment_policy == "randaugment"),
        "mixup_alpha": (d.mixup_alpha, d.mixup_alpha > 0),
        "cutmix_alpha": (d.cutmix_alpha, d.cutmix_alpha > 0),
    }
    for name, (final, used) in finals.items():
        low = getattr(c, f"progressive_min_{name}")
        if low == -1:
            continue
        if not used or not 0 <= low <= final:
            raise ConfigError(
                f"--progressive_min_{name}={low} must be in [0, {final:g}] (the final value), "
                "and its setting in use (-1: no change)"
            )
    if d.data_service:
        raise ConfigError(
            "--progressive_stages and --data_service do not go together: the service's "
            "workers run one pipeline for the whole run"
        )
