"""One frozen, validated Config per run. ``main.py`` makes it from flags; tests make it directly.

The field defaults here are the flags' defaults (``flags.py`` reads them from this class).
"""

import dataclasses
import os
from dataclasses import dataclass

from tfgpu import distribute, models, optim

DTYPES = ("float32", "mixed_float16", "mixed_bfloat16")


class ConfigError(ValueError):
    """A setting that cannot work; the message is one line naming the flag and what it expects."""


@dataclass(frozen=True)
class Config:
    # What and where.
    strategy: str = "auto"
    model: str = "resnet50"
    data_dir: str = ""
    model_dir: str = ""
    num_classes: int = 0
    label_offset: int = -1
    synthetic_data: bool = False
    image_size: int = 224
    small_input: bool = False
    init_weights: str = ""
    # How long and how big.
    global_batch_size: int = 256
    grad_accum_steps: int = 1
    train_steps: int = 0
    epochs: float = 0.0
    steps_per_loop: int = 10
    # Optimization.
    optimizer: str = "sgd"
    learning_rate: float = 0.1
    scale_lr_with_batch: bool = False
    momentum: float = 0.9
    weight_decay: float = 5e-5
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    label_smoothing: float = 0.0
    clip_norm: float = 0.0
    ema_decay: float = 0.0
    skip_non_finite: bool = False
    # Numerics and speed.
    dtype: str = "float32"
    jit_compile: bool = False
    seed: int = 0
    deterministic: bool = False
    # Input pipeline.
    random_flip: bool = True
    crop_min_area: float = 0.08
    dct_scaled_decode: bool = False
    eval_crop_fraction: float = 0.875
    eval_batch_size: int = 0
    shuffle_buffer: int = 10_000
    cycle_length: int = 8
    data_threads: int = 0
    cache_eval: bool = True
    block_length: int = 1
    ram_budget_mb: int = 0
    eval_snapshot_dir: str = ""
    skip_truncated_shards: bool = False
    preprocess_on: str = "device"
    resize_on: str = "auto"
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    randaugment_ops: int = 0
    randaugment_magnitude: float = 0.5
    tfds_name: str = ""
    tfds_data_dir: str = ""
    # Distribution.
    logical_cpu_devices: int = 0
    all_reduce_alg: str = "auto"
    communication: str = "auto"
    collective_timeout_s: float = 600.0
    hvd_compression: str = "none"
    # Bookkeeping.
    log_every_steps: int = 100
    eval_every_steps: int = 0
    eval_every_epochs: float = 0.0
    checkpoint_every_steps: int = 1000
    keep_checkpoints: int = 3
    export: bool = True

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _choice(name: str, value: str, choices) -> None:
    if value not in choices:
        raise ConfigError(f"--{name}={value!r} is unknown; choose from {', '.join(choices)}")


def _positive(config: Config, *names: str) -> None:
    for name in names:
        if getattr(config, name) <= 0:
            raise ConfigError(f"--{name}={getattr(config, name)} must be positive")


def validate(config: Config) -> Config:
    """Checks every setting that can be checked before TensorFlow starts; returns ``config``."""
    _choice("strategy", config.strategy, distribute.STRATEGIES)
    _choice("model", config.model, sorted(models.MODELS))
    _choice("optimizer", config.optimizer, optim.OPTIMIZERS)
    _choice("lr_schedule", config.lr_schedule, optim.SCHEDULES)
    _choice("dtype", config.dtype, DTYPES)
    _choice("all_reduce_alg", config.all_reduce_alg, distribute.ALL_REDUCE_ALGS)
    _choice("communication", config.communication, distribute.COMMUNICATIONS)
    _choice("hvd_compression", config.hvd_compression, ("none", "fp16"))
    _choice("preprocess_on", config.preprocess_on, ("device", "host"))
    _choice("resize_on", config.resize_on, ("auto", "host", "device"))
    _positive(config, "global_batch_size", "grad_accum_steps", "image_size", "steps_per_loop")
    _positive(config, "log_every_steps", "checkpoint_every_steps", "keep_checkpoints")
    if config.global_batch_size % config.grad_accum_steps:
        raise ConfigError(
            f"--global_batch_size={config.global_batch_size} does not divide by "
            f"--grad_accum_steps={config.grad_accum_steps}"
        )
    if config.train_steps < 0 or config.epochs < 0:
        raise ConfigError("--train_steps and --epochs must not be negative")
    if config.deterministic and config.jit_compile:
        raise ConfigError(
            "--deterministic and --jit_compile do not go together: XLA has no deterministic "
            "kernel for some gradients (MaxPool's), and TensorFlow refuses them"
        )
    if config.eval_every_steps and config.eval_every_epochs:
        raise ConfigError("set --eval_every_steps or --eval_every_epochs, not both")
    if config.train_steps and config.epochs:
        raise ConfigError("set --train_steps or --epochs, not both")
    if not 0 < config.crop_min_area <= 1 or not 0 < config.eval_crop_fraction <= 1:
        raise ConfigError("--crop_min_area and --eval_crop_fraction must be in (0, 1]")
    if config.data_dir and not os.path.isdir(os.path.expanduser(config.data_dir)):
        raise ConfigError(f"--data_dir={config.data_dir} is not a directory")
    return config


def per_replica_batch(config: Config, num_replicas: int) -> int:
    """Examples per replica per update (all micro-batches); errors if the batch does not split."""
    parts = num_replicas * config.grad_accum_steps
    if config.global_batch_size % parts:
        raise ConfigError(
            f"--global_batch_size={config.global_batch_size} does not divide by "
            f"{num_replicas} replicas x --grad_accum_steps={config.grad_accum_steps} = {parts}"
        )
    return config.global_batch_size // num_replicas
