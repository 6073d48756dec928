"""The optimizer's settings (``config.optim``): the optimizer, its learning rate and schedule,
the loss, the weight average, and the checks that need no TensorFlow.
"""

import os
import re
from dataclasses import dataclass

from tfgpu.errors import ConfigError
from tfgpu.optim import LOSSES, LR_SCALINGS, OPTIMIZERS, SCHEDULES, patterns
from tfgpu.settings import positive, setting


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer, its learning-rate schedule, the loss and what is done to the gradients."""

    name: str = setting(
        "sgd",
        "sgd, nesterov, adam, adamw, lamb or lars (layer-wise trust ratio for large batches: "
        "docs/large-batch.md).",
        choices=OPTIMIZERS,
        flag="optimizer",
    )
    learning_rate: float = setting(
        0.1,
        "Learning rate (peak, after warmup); with --lr_scaling, the rate of a batch of "
        "--base_batch_size.",
    )
    scale_lr_with_batch: bool = setting(
        False,
        "Multiply --learning_rate by global_batch_size / 256 (the same as --lr_scaling=linear "
        "--base_batch_size=256).",
    )
    lr_scaling: str = setting(
        "none",
        "How --learning_rate follows the global batch: none, linear (x global / base) or sqrt "
        "(x sqrt(global / base)), base being --base_batch_size; the rate used is logged at "
        "the start.",
        choices=LR_SCALINGS,
    )
    base_batch_size: int = setting(
        256, "The batch size --learning_rate is given for, with --lr_scaling."
    )
    momentum: float = setting(0.9, "Momentum of sgd, nesterov and lars.")
    weight_decay: float = setting(
        5e-5,
        "Weight decay; BatchNorm and bias variables are not decayed. Decoupled (x learning "
        "rate, applied to the weights) except for lars, where it is L2 added to the gradient "
        "before the trust ratio (--lars_exclude_from_decay).",
    )
    lars_eeta: float = setting(
        0.001,
        "lars: trust coefficient; a variable's rate is lr * eeta * |w| / |g + decay * w|.",
    )
    lars_exclude_from_decay: str = setting(
        "bias,gamma,beta",
        "lars: comma-separated regular expressions; a variable whose path (layer/name) "
        "matches one is not decayed (default: biases and BatchNorm's scale and offset).",
    )
    lars_exclude_from_adaptation: str = setting(
        "bias,gamma,beta",
        "lars: the same, for the trust ratio: a matching variable trains at the plain rate.",
    )
    lr_schedule: str = setting(
        "cosine",
        "After warmup: constant, cosine, linear, poly ((1 - progress)^--lr_poly_power, to 0) or "
        "step (x0.1 at 30/60/90%).",
        choices=SCHEDULES,
    )
    lr_poly_power: float = setting(2.0, "The power of --lr_schedule=poly.")
    warmup_steps: int = setting(0, "Linear learning-rate warmup, in optimizer updates.")
    backbone_lr_multiplier: float = setting(
        1.0,
        "Learning rate of the backbone (every layer before the head, logits) relative to the "
        "head's, in (0, 1] (1: off); with --layer_lr_decay=D a block at depth d trains at "
        "lr * M * D^d.",
    )
    layer_lr_decay: float = setting(
        1.0,
        "Layer-wise learning-rate decay D in (0, 1] (1: off): the head (logits) trains at the "
        "learning rate, a block at depth d (d blocks before the head) at lr * D^d. Blocks by "
        "layer name, depth 1 first: EfficientNet(V2) top (top_conv, top_bn), blockN .. block1, "
        "stem; DenseNet conv5 (last dense block and bn), conv4 (with its transition pool4) .. "
        "conv2, conv1 (stem); ResNet stage4 .. stage1, stem.",
    )
    loss: str = setting(
        "cross_entropy",
        "cross_entropy (softmax) or bce (one sigmoid per class, the mean over classes, as "
        "timm's BinaryCrossEntropy). Evaluation reports top-1/top-5 of the logits either way.",
        choices=LOSSES,
    )
    bce_target_threshold: float = setting(
        0.0,
        "bce: a target above this becomes 1, the others 0, after smoothing and MixUp/CutMix "
        "(timm's --bce-target-thresh; 0: off, soft targets).",
    )
    label_smoothing: float = setting(0.0, "Label smoothing of the loss (cross_entropy or bce).")
    class_weights: str = setting(
        "",
        "Weight each example's loss by its class (docs/data.md: Class balance). auto: inverse "
        "frequency from the train split's per-class counts in dataset_info.json, normalized so "
        "the mean weight over training examples is 1; or a JSON file {class name or index: "
        "weight} (classes not in it: 1). Empty: off. Evaluation stays unweighted.",
    )
    clip_norm: float = setting(0.0, "Clip the all-reduced gradients to this global norm (0: off).")
    ema_decay: float = setting(
        0.0, "Keep an exponential moving average of the weights with this decay (0: off)."
    )
    ema_warmup: bool = setting(
        False,
        "Warm the EMA's decay up: min(--ema_decay, (1 + n) / (10 + n)) at update n, as TF "
        "Model Garden (the first update copies the weights either way).",
    )
    ema_batchnorm: bool = setting(
        False,
        "Average BatchNorm's moving statistics too (with the weights' decay): evaluation with "
        "the EMA weights then normalizes with averaged statistics.",
    )
    lookahead_steps: int = setting(
        0,
        "Lookahead every K updates (0: off), airbench's: slow weights (and BatchNorm's moving "
        "statistics) move toward the trained ones by 1 - d, d = --lookahead_decay^K x "
        "progress^3, and training restarts from them; the run ends on them.",
    )
    lookahead_decay: float = setting(
        0.95, "Lookahead's decay per update, in (0, 1) (airbench: 0.95 with K = 5)."
    )
    batchnorm_lr_multiplier: float = setting(
        1.0,
        "Learning rate of BatchNorm's offsets and scales relative to the other weights' "
        "(airbench: 64); they are not decayed either way. 1: one rate for all.",
    )
    skip_non_finite: bool = setting(
        False,
        "Skip an update whose loss or gradients are not finite, and count it, instead of "
        "stopping (mixed_float16 always skips and lowers the loss scale).",
    )
    max_skipped_updates: int = setting(
        100,
        "Stop (exit code 3) after this many skipped updates in a row: with mixed_float16 "
        "those at the loss scale's floor of 1, with --skip_non_finite any (0: never stop).",
    )


def check_optim(o: OptimConfig) -> None:
    """Raises a ConfigError for a setting of ``o`` (the run's ``config.optim``) that cannot
    work, or that is set for an optimizer, loss or average the run does not use."""
    positive(o, "base_batch_size", "lr_poly_power")
    if o.scale_lr_with_batch and o.lr_scaling != "none":
        raise ConfigError("set --scale_lr_with_batch or --lr_scaling, not both")
    if o.name == "lars" and o.lars_eeta <= 0:
        raise ConfigError(f"--lars_eeta={o.lars_eeta} must be positive")
    for name in ("lars_exclude_from_decay", "lars_exclude_from_adaptation"):
        for pattern in patterns(getattr(o, name)):
            try:
                re.compile(pattern)
            except re.error as err:
                raise ConfigError(
                    f"--{name}: {pattern!r} is no regular expression ({err})"
                ) from None
    if o.name != "lars" and o.lars_eeta != OptimConfig.lars_eeta:
        raise ConfigError(f"--lars_eeta is for --optimizer=lars, not --optimizer={o.name}")
    if not 0.0 <= o.bce_target_threshold < 1.0:
        raise ConfigError(f"--bce_target_threshold={o.bce_target_threshold} must be in [0, 1)")
    if o.bce_target_threshold and o.loss != "bce":
        raise ConfigError("--bce_target_threshold is for --loss=bce")
    if not 0.0 <= o.ema_decay < 1.0:
        raise ConfigError(f"--ema_decay={o.ema_decay} must be in [0, 1) (0: off)")
    if o.lookahead_steps < 0 or not 0.0 < o.lookahead_decay < 1.0:
        raise ConfigError(
            f"--lookahead_steps={o.lookahead_steps} must not be negative (0: off) and "
            f"--lookahead_decay={o.lookahead_decay} must be in (0, 1)"
        )
    if o.batchnorm_lr_multiplier <= 0:
        raise ConfigError(
            f"--batchnorm_lr_multiplier={o.batchnorm_lr_multiplier} must be positive (1: off)"
        )
    if (o.ema_warmup or o.ema_batchnorm) and not o.ema_decay:
        flag = "--ema_warmup" if o.ema_warmup else "--ema_batchnorm"
        raise ConfigError(f"{flag} is for the weights' average: set --ema_decay (e.g. 0.9999)")


def check_class_weights(o: OptimConfig) -> None:
    """--class_weights is empty, auto or a file (what it holds is checked against the
    dataset's classes when the run is built: ``data/balance.py``)."""
    value = o.class_weights
    if value not in ("", "auto") and not os.path.isfile(os.path.expanduser(value)):
        raise ConfigError(
            f"--class_weights={value}: no such file (auto, or a JSON file of class name or "
            "index -> weight)"
        )
