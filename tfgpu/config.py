"""One frozen, validated Config per run: the one home of every setting.

Each setting is a field of one section (``data``, ``model``, ``optim``, ``train``, ``dist``) or
of the run itself, declared with its default, its help and its choices; ``flags.py`` makes
one flat absl flag of each (the field's name, or the ``flag`` it declares), so
``--global_batch_size`` is ``config.train.global_batch_size``. The input pipeline takes
``config.data`` as it is: no copy, no renaming.

No TensorFlow here (nor in the modules whose choices it reads): ``--help`` and a bad flag
must not wait for TensorFlow's start-up.
"""

import os
import re
from dataclasses import dataclass, field

from tfgpu import data, distribute, models, optim
from tfgpu.settings import collect, replace_settings, setting


class ConfigError(ValueError):
    """A setting that cannot work; the message is one line naming the flag and what it expects."""


@dataclass(frozen=True)
class DataConfig:
    """Where the images come from and how the input pipeline treats them."""

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
    image_size: int = setting(224, "Training and evaluation image side, in pixels.")
    random_flip: bool = setting(True, "Random left-right flips in training.")
    crop_min_area: float = setting(0.08, "Smallest area fraction of a random-resized crop.")
    dct_scaled_decode: bool = setting(
        False,
        "Decode JPEG crop windows 2, 4 or 8 times --image_size on both sides at that DCT scale: "
        "15-20% less host CPU and smaller crops on large photos (1600x1200); costs ~3% on "
        "ImageNet-sized images, where it seldom applies.",
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
        "device: flip, cast, RandAugment, MixUp/CutMix run inside the step on the accelerator "
        "(uint8 crosses over); host: they run in tf.data.",
        choices=data.PREPROCESS_ON,
    )
    resize_on: str = setting(
        "auto",
        "Where training crops are resized. host: in tf.data; device: they cross un-resized "
        "(packed one after the other, with their sizes) and a gather-based bilinear resizes "
        "them inside the step, before XLA; auto: device with a GPU and --preprocess_on=device, "
        "else host.",
        choices=data.RESIZE_ON,
    )
    in_memory: str = setting(
        "auto",
        "Small datasets: decode the train split once into a uint8 array in host memory and cut "
        "each batch from it, vectorized (padded random crop of --crop_padding, flip, "
        "MixUp/CutMix; no random-resized crop). on, off, or auto: on for --image_size <= 64 "
        "when the decoded split fits --in_memory_mb.",
        choices=data.IN_MEMORY,
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
    randaugment_ops: int = setting(
        0,
        "RandAugment operations per image (0: off); keras.layers.RandAugment, not "
        "split-invariant under --deterministic.",
    )
    randaugment_magnitude: float = setting(0.5, "RandAugment factor in [0, 1].")

    @property
    def mixing(self) -> bool:
        """True when MixUp or CutMix is on (batches then carry ``mix`` draws)."""
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0


@dataclass(frozen=True)
class ModelConfig:
    """Which network, in which precision."""

    name: str = setting(
        "resnet50",
        "Registry name: resnet18..resnet152, densenet121/169/201, efficientnet_b0..b7, "
        "efficientnetv2_b0..b3/s/m/l, tiny_cnn.",
        choices=sorted(models.MODELS),
        flag="model",
    )
    small_input: bool = setting(
        False,
        "Small-input stem for 32x32-scale data: ResNets 3x3/1 conv, no max-pool; DenseNets "
        "and EfficientNets keep their stem layers at stride 1.",
    )
    init_weights: str = setting(
        "",
        "A local .weights.h5 (same model) or .keras file (its logits layer may differ: "
        "fine-tuning) to start from; no downloads. A checkpoint in --model_dir wins.",
    )
    dtype: str = setting(
        "float32",
        "float32, mixed_float16 (dynamic loss scaling) or mixed_bfloat16.",
        choices=models.DTYPES,
    )
    jit_compile: bool = setting(False, "Compile the train step with XLA.")


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer, its learning-rate schedule and what is done to the gradients."""

    name: str = setting(
        "sgd", "sgd, nesterov, adam, adamw or lamb.", choices=optim.OPTIMIZERS, flag="optimizer"
    )
    learning_rate: float = setting(0.1, "Base learning rate (peak, after warmup).")
    scale_lr_with_batch: bool = setting(
        False, "Multiply --learning_rate by global_batch_size / 256."
    )
    momentum: float = setting(0.9, "Momentum of sgd and nesterov.")
    weight_decay: float = setting(
        5e-5, "Decoupled weight decay; BatchNorm and bias variables are not decayed."
    )
    lr_schedule: str = setting(
        "cosine",
        "After warmup: constant, cosine, linear or step (x0.1 at 30/60/90%).",
        choices=optim.SCHEDULES,
    )
    warmup_steps: int = setting(0, "Linear learning-rate warmup, in optimizer updates.")
    label_smoothing: float = setting(0.0, "Label smoothing of the cross-entropy.")
    clip_norm: float = setting(0.0, "Clip the all-reduced gradients to this global norm (0: off).")
    ema_decay: float = setting(
        0.0, "Keep an exponential moving average of the weights with this decay (0: off)."
    )
    skip_non_finite: bool = setting(
        False,
        "Skip an update whose loss or gradients are not finite, and count it, instead of "
        "stopping (mixed_float16 always skips and lowers the loss scale).",
    )


@dataclass(frozen=True)
class TrainConfig:
    """How big an update is, how long training runs, and when to log, evaluate and save."""

    global_batch_size: int = setting(
        256, "Examples per optimizer update, over all replicas and micro-batches."
    )
    grad_accum_steps: int = setting(
        1,
        "Micro-batches per update; per-replica micro-batch = global / (replicas x "
        "grad_accum_steps).",
    )
    micro_batch_size: int = setting(
        0,
        "Per-replica micro-batch that fits in memory (0: off); --grad_accum_steps then follows "
        "from the global batch and the number of replicas, so one command runs on any number "
        "of workers.",
    )
    train_steps: int = setting(0, "Length of training in optimizer updates (0: use --epochs).")
    epochs: float = setting(
        0.0, "Length of training in passes over the train split (0: use --train_steps)."
    )
    steps_per_loop: int = setting(10, "Updates per tf.function call (fewer Python round trips).")
    eval_batch_size: int = setting(0, "Global evaluation batch (0: the training global batch).")
    log_every_steps: int = setting(100, "Print and log train metrics every N updates.")
    log_every_s: float = setting(
        30.0,
        "... and after this many seconds without a line, at the next loop boundary (one "
        "process only: several log together, at the same step).",
    )
    eval_every_steps: int = setting(0, "Evaluate every N updates (0: only at the end).")
    eval_every_epochs: float = setting(
        0.0, "Evaluate every N passes over the train split (0: only at the end)."
    )
    checkpoint_every_steps: int = setting(
        1000, "Write a checkpoint every N updates (and always at the end)."
    )
    keep_checkpoints: int = setting(3, "Checkpoints kept (the newest).")
    export: bool = setting(
        True, "At the end, export the model as .keras and as a SavedModel taking uint8 images."
    )


@dataclass(frozen=True)
class DistConfig:
    """How training is spread over devices, processes and machines."""

    strategy: str = setting(
        "auto",
        "How to spread training: auto (horovod under horovodrun, multi_worker_mirrored when "
        "TF_CONFIG names several workers, mirrored with >1 GPU, else default), default, "
        "one_device, mirrored, multi_worker_mirrored, horovod.",
        choices=distribute.STRATEGIES,
    )
    logical_cpu_devices: int = setting(
        0, "Split the CPU into N devices, so mirrored has N replicas on a laptop."
    )
    all_reduce_alg: str = setting(
        "auto",
        "mirrored: auto, nccl, hierarchical_copy or reduce_to_one.",
        choices=distribute.ALL_REDUCE_ALGS,
    )
    communication: str = setting(
        "auto",
        "multi_worker_mirrored collectives: auto, ring or nccl.",
        choices=distribute.COMMUNICATIONS,
    )
    collective_timeout_s: float = setting(
        600.0, "A collective that waits longer (a dead worker) fails the run."
    )
    startup_timeout_s: float = setting(
        60.0,
        "multi_worker_mirrored: how long the workers wait for one another at start-up before "
        "they stop, naming the worker that never joined.",
    )
    heartbeat_timeout_s: float = setting(
        10.0,
        "multi_worker_mirrored: a worker whose process stops sending TensorFlow's heartbeats "
        "this long (killed, frozen, its machine gone) is declared lost.",
    )
    stall_timeout_s: float = setting(
        60.0,
        "Every strategy with several processes: when no update completes for this long (a "
        "worker alive but stuck, e.g. on a hung file system), every process stops, naming the "
        "stuck worker and the step (0: off).",
    )
    stop_grace_s: float = setting(
        20.0,
        "After SIGTERM/SIGINT, how long a run may take to reach the next loop boundary and save "
        "a checkpoint; past it (blocked waiting for another worker) it stops without saving.",
    )
    hvd_compression: str = setting(
        "none",
        "horovod: none or fp16 compression of the gradient all-reduce.",
        choices=distribute.HVD_COMPRESSIONS,
    )


SECTIONS = {
    "data": DataConfig,
    "model": ModelConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "dist": DistConfig,
}


@dataclass(frozen=True)
class Config:
    """The whole run: three run-wide settings and one section per concern."""

    model_dir: str = setting(
        "",
        "Where the run writes everything; resumes from the newest checkpoint there. Default: "
        "a new folder under runs/.",
        per_node=True,
    )
    seed: int = setting(0, "Seed of initialization, shuffling and augmentation.")
    deterministic: bool = setting(
        False, "Same flags + same seed = same weights: deterministic ops and data order."
    )
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def shared(self) -> dict:
        """{flag name: value} of the settings every worker of one run must agree on."""
        return {s.flag: s.get(self) for s in SETTINGS.values() if not s.per_node}

    def flat(self) -> dict:
        """{flag name: value} of every setting (what config.json holds)."""
        return {s.flag: s.get(self) for s in SETTINGS.values()}

    def with_settings(self, **values) -> "Config":
        """A copy with settings changed, named by their flags: ``with_settings(train_steps=7)``."""
        unknown = [name for name in values if name not in SETTINGS]
        if unknown:
            raise ConfigError(f"--{unknown[0]} is not a tfgpu flag")
        return replace_settings(self, [(SETTINGS[k], v) for k, v in values.items()])


SETTINGS = collect(Config, SECTIONS)  # flag name -> Setting, in declaration order


def config_from(**values) -> Config:
    """A Config from flat settings named by their flags (what tests and tools write)."""
    return Config().with_settings(**values)


def validate(config: Config) -> Config:
    """Checks every setting that can be checked before TensorFlow starts; returns ``config``."""
    for s in SETTINGS.values():
        value = s.get(config)
        if s.choices and value not in s.choices:
            raise ConfigError(
                f"--{s.flag}={value!r} is unknown; choose from {', '.join(s.choices)}"
            )
    _check_data(config.data)
    _check_train(config.train)
    if config.deterministic and config.model.jit_compile:
        raise ConfigError(
            "--deterministic and --jit_compile do not go together: XLA has no deterministic "
            "kernel for some gradients (MaxPool's), and TensorFlow refuses them"
        )
    return config


def _positive(section, *names: str) -> None:
    for name in names:
        if getattr(section, name) <= 0:
            raise ConfigError(f"--{name}={getattr(section, name)} must be positive")


def _check_data(d: DataConfig) -> None:
    _positive(d, "image_size")
    if not 0 <= d.crop_padding < d.image_size:
        raise ConfigError(
            f"--crop_padding={d.crop_padding} must be in [0, --image_size={d.image_size})"
        )
    if d.in_memory_mb < 0:
        raise ConfigError(f"--in_memory_mb={d.in_memory_mb} must not be negative")
    if not 0 < d.crop_min_area <= 1 or not 0 < d.eval_crop_fraction <= 1:
        raise ConfigError("--crop_min_area and --eval_crop_fraction must be in (0, 1]")
    if d.data_dir and not os.path.isdir(os.path.expanduser(d.data_dir)):
        raise ConfigError(f"--data_dir={d.data_dir} is not a directory")


def _check_train(t: TrainConfig) -> None:
    _positive(t, "global_batch_size", "grad_accum_steps", "steps_per_loop")
    _positive(t, "log_every_steps", "checkpoint_every_steps", "keep_checkpoints")
    if t.global_batch_size % t.grad_accum_steps:
        raise ConfigError(
            f"--global_batch_size={t.global_batch_size} does not divide by "
            f"--grad_accum_steps={t.grad_accum_steps}"
        )
    if t.micro_batch_size < 0:
        raise ConfigError(f"--micro_batch_size={t.micro_batch_size} must not be negative")
    if t.micro_batch_size and t.grad_accum_steps != 1:
        raise ConfigError("set --grad_accum_steps or --micro_batch_size, not both")
    if t.train_steps < 0 or t.epochs < 0:
        raise ConfigError("--train_steps and --epochs must not be negative")
    if t.eval_every_steps and t.eval_every_epochs:
        raise ConfigError("set --eval_every_steps or --eval_every_epochs, not both")
    if t.train_steps and t.epochs:
        raise ConfigError("set --train_steps or --epochs, not both")


def split_batch(train: TrainConfig, num_replicas: int) -> tuple[int, int]:
    """(examples per replica per update, micro-batches per update) of ``num_replicas``:
    --grad_accum_steps, or with --micro_batch_size=M as many as make M per micro-batch, so
    that one command keeps its global batch on any number of workers. A batch that does not
    split is a ConfigError naming the numbers."""
    g, m = train.global_batch_size, train.micro_batch_size
    if g % num_replicas:
        raise ConfigError(f"--global_batch_size={g} does not divide by {num_replicas} replicas")
    replica_batch = g // num_replicas
    if m:
        if replica_batch % m:
            raise ConfigError(
                f"--global_batch_size={g} over {num_replicas} replicas is {replica_batch} per "
                f"replica, which does not divide into micro-batches of --micro_batch_size={m}"
            )
        return replica_batch, replica_batch // m
    k = train.grad_accum_steps
    if g % (num_replicas * k):
        raise ConfigError(
            f"--global_batch_size={g} does not divide by "
            f"{num_replicas} replicas x --grad_accum_steps={k} = {num_replicas * k}"
        )
    return replica_batch, k


def resolve(config: Config, has_gpu: bool) -> Config:
    """The settings that depend on the machine, decided once (config.json shows the outcome).

    ``--resize_on=auto``: on the device when it is a GPU that does the float work. Else the
    resize would run on CPU cores, where the step's gather-based resize costs ~10x the host's
    ResizeBilinear (measured: 2.7 vs 0.25 ms of CPU per image, bench/README.md). Synthetic
    batches are uint8 like real ones: their float work is always on the device.
    """
    d = config.data
    preprocess_on = "device" if d.synthetic_data else d.preprocess_on
    resize_on = d.resize_on
    if resize_on == "auto":
        resize_on = "device" if has_gpu and preprocess_on == "device" else "host"
    return config.with_settings(preprocess_on=preprocess_on, resize_on=resize_on)
