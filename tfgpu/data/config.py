"""The reader's settings (``config.data``): where the images come from and how the input
pipeline treats them, with the checks that need no TensorFlow. The pipeline takes this
section as it is: no copy, no renaming.
"""

import os
import re
from dataclasses import dataclass, fields

from tfgpu.data import AUGMENT_POLICIES, DCT_SCALED_DECODE, IN_MEMORY, PREPROCESS_ON, RESIZE_ON
from tfgpu.errors import ConfigError
from tfgpu.settings import collect, positive, setting


@dataclass(frozen=True)
class _Source:
    """Where the images come from: ``DataConfig``'s first settings."""

    data_dir: str = setting(
        "",
        "Directory written by tools/to_tfrecord.py; empty = the built-in demo dataset "
        "(and the demo recipe for every flag not set).",
        per_node=True,
    )
    tfds_name: str = setting(
        "",
        "Train on a prepared tensorflow-datasets dataset (e.g. imagenet2012) instead of "
        "--data_dir.",
    )
    tfds_data_dir: str = setting(
        "", "tensorflow-datasets data_dir of --tfds_name (empty: tfds' default).", per_node=True
    )
    synthetic_data: bool = setting(
        False, "Train on generated batches of the right shape: times the model, no I/O."
    )
    num_classes: int = setting(
        0, "Number of classes, for records without a dataset_info.json (0 = from it)."
    )
    label_offset: int = setting(
        -1,
        "Subtracted from stored labels (1 for TF's official ImageNet records; -1 = from "
        "dataset_info.json, else 0).",
    )


@dataclass(frozen=True)
class _Reading(_Source):
    """How tf.data reads, crops and decodes them: ``DataConfig``'s next settings."""

    image_size: int = setting(224, "Training and evaluation image side, in pixels.")
    random_flip: bool = setting(True, "Random left-right flips in training.")
    alternating_flips: bool = setting(
        False,
        "With --random_flip: each training image mirrored in every other epoch (a coin per "
        "image, drawn once, picks the epochs: even or odd), not by a new coin each epoch "
        "(airbench's alternating flips: every image is seen both ways every two epochs).",
    )
    crop_min_area: float = setting(0.08, "Smallest area fraction of a random-resized crop.")
    dct_scaled_decode: str = setting(
        "off",
        "Decode JPEG crop windows 2, 4 or 8 times --image_size on both sides at that DCT scale "
        "(less host CPU and smaller crops on large photos). auto: off where the converter's "
        "stored image sizes say under half the crop windows qualify, else decided per example "
        "(the run's start line says which); on: every window goes through the choice (~3% "
        "slower than off on ImageNet-sized images); off.",
        choices=DCT_SCALED_DECODE,
    )
    eval_crop_fraction: float = setting(
        0.875, "Evaluation center crop, as a fraction of the shorter side."
    )
    shuffle_buffer: int = setting(10_000, "Examples in the training shuffle buffer.")
    cycle_length: int = setting(8, "Files read in parallel by the interleave.")
    block_length: int = setting(1, "Consecutive records the interleave takes from each file.")
    data_threads: int = setting(
        0, "Private tf.data thread pool size (0: the shared pool).", per_node=True
    )
    ram_budget_mb: int = setting(
        0, "RAM tf.data's autotuner may use for buffers, in MB (0: its default).", per_node=True
    )
    cache_eval: bool = setting(True, "Cache the decoded evaluation split in memory.")
    eval_snapshot_dir: str = setting(
        "",
        "Write the decoded evaluation crops here once (tf.data snapshot); later runs read "
        "them instead of decoding (empty: off).",
        per_node=True,
    )
    skip_truncated_shards: bool = setting(
        False,
        "Read a truncated shard up to the break, with a warning, instead of stopping with an "
        "error naming it.",
    )
    preprocess_on: str = setting(
        "device",
        "device: flip, cast, the augmentation policy, MixUp/CutMix run inside the step on the "
        "accelerator (uint8 crosses over); host: they run in tf.data.",
        choices=PREPROCESS_ON,
    )
    resize_on: str = setting(
        "auto",
        "Where training crops are resized. host: in tf.data; device: they cross un-resized "
        "(packed one after the other, with their sizes) and a gather-based bilinear resizes "
        "them inside the step, before XLA; auto: device with a GPU and --preprocess_on=device, "
        "else host.",
        choices=RESIZE_ON,
    )


@dataclass(frozen=True)
class DataConfig(_Reading):
    """Where the images come from and how the input pipeline treats them: ``_Source``'s and
    ``_Reading``'s settings (base classes only to keep each class short: the order of the
    fields, of the flags and of config.json is theirs, then these), then the in-memory path,
    augmentation, balanced sampling and the tf.data service."""

    in_memory: str = setting(
        "auto",
        "Small datasets: decode the train split once into a uint8 array in host memory and cut "
        "each batch from it, vectorized (padded random crop of --crop_padding, flip, "
        "MixUp/CutMix; no random-resized crop). on, off, or auto: on for --image_size <= 64 "
        "when the decoded split fits --in_memory_mb.",
        choices=IN_MEMORY,
    )
    input_probe_s: float = setting(
        1.0,
        "At start-up, read this worker's train input alone for this long (at most 100 "
        "batches; a fresh pipeline: training's is untouched) and report its images/s next to "
        "training's, to tell an input-bound run (0: off).",
        per_node=True,
    )
    in_memory_mb: int = setting(
        1024,
        "RAM budget of --in_memory=auto, in MB: the decoded train split as stored (examples "
        "x (--image_size + 2 x --crop_padding)^2 x 3 bytes) must fit.",
    )
    crop_padding: int = setting(
        4,
        "In-memory path: pixels added on each side (by reflection) before the random "
        "--image_size crop (4 as for CIFAR; 0: no crop). Images stored at another size are "
        "resized once, at load.",
    )
    mixup_alpha: float = setting(
        0.0, "MixUp Beta(alpha, alpha) (0: off); pairs (2k, 2k+1) of each batch."
    )
    cutmix_alpha: float = setting(
        0.0,
        "CutMix Beta(alpha, alpha) (0: off); with --mixup_alpha each example picks one of the "
        "two at random.",
    )
    augment_policy: str = setting(
        "none",
        "Per-example augmentation policy after the crop and flip (docs/input-pipeline.md: "
        "Augmentation policies): randaugment (timm's rand-mM-nN-mstdS), trivialaugment "
        "(TrivialAugmentWide), autoaugment (the original ImageNet policy), none. Drawn per "
        "example from (seed, "
        "epoch, position), applied where --preprocess_on says: split-invariant.",
        choices=AUGMENT_POLICIES,
    )
    randaugment_ops: int = setting(2, "--augment_policy=randaugment: ops per image (timm's n).")
    randaugment_magnitude: float = setting(
        9.0,
        "--augment_policy=randaugment: magnitude M on timm's 0..10 scale (timm's m; above 10 "
        "as timm's mmax), at most 30.",
    )
    randaugment_magnitude_std: float = setting(
        0.5,
        "--augment_policy=randaugment: std of the normal noise added to M per op (timm's "
        "mstd; 0: fixed M).",
    )
    random_erasing: float = setting(
        0.0,
        "Probability of timm's RandomErasing (its --reprob, --remode=pixel: one box of 2% to 1/3 "
        "of the image filled with per-pixel normal noise), after the policy (0: off).",
    )
    balanced_sampling: bool = setting(
        False,
        "Draw each training position's class with probability proportional to "
        "count^(1 - --sampling_power), then an example of that class uniformly (with "
        "replacement), statelessly from (seed, epoch, position); needs the train split in "
        "memory (--in_memory). docs/data.md: Class balance.",
    )
    sampling_power: float = setting(
        1.0,
        "--balanced_sampling: p(class) proportional to count^(1 - power), in [0, 1]: 1 draws "
        "classes uniformly, 0 at their natural frequencies.",
    )
    data_service: str = setting(
        "",
        "grpc://HOST:PORT of a tf.data service dispatcher (tfgpu-data-service): its "
        "workers run the per-example train pipeline, each example at most once per epoch, and "
        "the step consumes the batches they return (docs/input-pipeline.md: tf.data "
        "service). Empty: off.",
        per_node=True,
    )
    data_service_timeout_s: float = setting(
        30.0,
        "--data_service: how long start-up waits for the dispatcher before stopping with a "
        "line naming its address.",
        per_node=True,
    )
    data_service_compression: str = setting(
        "none",
        "--data_service: none, or auto (snappy) compression of the batches the workers send. "
        "On one machine they measured about the same (224x224 crops through a local service: "
        "0.74x the local pipeline with auto, 0.69x with none: bench/README.md); auto sends "
        "fewer bytes over a slow network.",
        choices=("none", "auto"),
        per_node=True,
    )

    def __post_init__(self):
        # Before "auto" the setting was a bool: configs (config.json) that say so still load.
        if isinstance(self.dct_scaled_decode, bool):
            object.__setattr__(self, "dct_scaled_decode", "on" if self.dct_scaled_decode else "off")

    @property
    def mixing(self) -> bool:
        """True when MixUp or CutMix is on (batches then carry ``mix`` draws)."""
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0

    def shared(self) -> dict:
        """{flag name: value} of the data settings every machine of a run reads alike: all
        but the per-node ones (paths, thread counts), as ``Config.shared`` for the whole run."""
        return {flag: s.get(self) for flag, s in collect(type(self), {}).items() if not s.per_node}


def check_data(d: DataConfig) -> None:
    """Raises a ConfigError naming the first --flag of ``d`` that cannot work."""
    positive(d, "image_size")
    if d.alternating_flips and not d.random_flip:
        raise ConfigError("--alternating_flips is a way of --random_flip: set both")
    if not 0 <= d.crop_padding < d.image_size:
        raise ConfigError(
            f"--crop_padding={d.crop_padding} must be in [0, --image_size={d.image_size})"
        )
    if d.in_memory_mb < 0:
        raise ConfigError(f"--in_memory_mb={d.in_memory_mb} must not be negative")
    if not 0 < d.crop_min_area <= 1 or not 0 < d.eval_crop_fraction <= 1:
        raise ConfigError("--crop_min_area and --eval_crop_fraction must be in (0, 1]")
    _check_augment(d)
    _check_sampling(d)
    if d.data_dir and not os.path.isdir(os.path.expanduser(d.data_dir)):
        raise ConfigError(f"--data_dir={d.data_dir} is not a directory")
    if d.label_offset < -1 or d.num_classes < 0:  # -1 and 0 say "from dataset_info.json"
        flag, value = ("label_offset", -1) if d.label_offset < -1 else ("num_classes", 0)
        raise ConfigError(
            f"--{flag}={getattr(d, flag)}: expected 0 or more ({value}: from dataset_info.json)"
        )
    if d.data_service:
        _check_data_service(d)


def _check_augment(d: DataConfig) -> None:
    """The policy's and random erasing's numbers are in their ranges."""
    if d.augment_policy == "randaugment" and not 1 <= d.randaugment_ops <= 15:
        raise ConfigError(f"--randaugment_ops={d.randaugment_ops} must be in 1..15")
    if not 0 <= d.randaugment_magnitude <= 30:
        raise ConfigError(f"--randaugment_magnitude={d.randaugment_magnitude} must be in 0..30")
    if d.randaugment_magnitude_std < 0:
        raise ConfigError(
            f"--randaugment_magnitude_std={d.randaugment_magnitude_std} must not be negative"
        )
    if not 0 <= d.random_erasing <= 1:
        raise ConfigError(f"--random_erasing={d.random_erasing} must be in [0, 1]")
    # RandAugment was once on by --randaugment_ops alone, with M in [0, 1]: such a flagfile
    # must not quietly train without it.
    defaults = {f.name: f.default for f in fields(DataConfig)}
    for name in ("randaugment_ops", "randaugment_magnitude", "randaugment_magnitude_std"):
        if d.augment_policy != "randaugment" and getattr(d, name) != defaults[name]:
            raise ConfigError(
                f"--{name}={getattr(d, name)} needs --augment_policy=randaugment (M is on "
                "timm's 0..10 scale)"
            )


def _check_sampling(d: DataConfig) -> None:
    """--sampling_power is in [0, 1] and set only with --balanced_sampling, which needs the
    in-memory path (whether the split fits is known when it is loaded: ``balance.py``)."""
    if not 0 <= d.sampling_power <= 1:
        raise ConfigError(f"--sampling_power={d.sampling_power} must be in [0, 1]")
    if not d.balanced_sampling:
        if d.sampling_power != 1.0:
            raise ConfigError(f"--sampling_power={d.sampling_power} needs --balanced_sampling")
        return
    why = {
        "--in_memory=off": d.in_memory == "off",
        "--data_service": bool(d.data_service),
        "--synthetic_data": d.synthetic_data,
    }
    for flag, on in why.items():
        if on:
            raise ConfigError(
                f"--balanced_sampling and {flag} do not go together: balanced sampling needs "
                "the train split in memory (--in_memory; docs/data.md: Class balance)"
            )


def _check_data_service(d: DataConfig) -> None:
    """--data_service: an address grpc://HOST:PORT, and a run that has a per-example pipeline."""
    match = re.fullmatch(r"grpc://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})", d.data_service)
    if not match or not 0 < int(match.group(2)) < 65536:
        raise ConfigError(f"--data_service={d.data_service} must be grpc://HOST:PORT")
    if d.synthetic_data:
        raise ConfigError(
            "--data_service and --synthetic_data do not go together: synthetic "
            "batches have no input pipeline to send to the service"
        )
    if d.in_memory == "on":
        raise ConfigError(
            "--data_service and --in_memory=on do not go together: the service "
            "runs the per-example pipeline (with it, --in_memory=auto reads per "
            "example)"
        )
    positive(d, "data_service_timeout_s")
