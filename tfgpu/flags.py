"""Every command-line flag of ``python -m tfgpu.main``, with its help; defaults come from Config.

Only ``main.py`` reads the parsed values (``config_from_flags``); the library takes a Config.
"""

import dataclasses

from absl import flags

from tfgpu.config import Config

HELP = {
    "strategy": "How to spread training: auto (horovod under horovodrun, multi_worker_mirrored "
    "when TF_CONFIG names several workers, mirrored with >1 GPU, else default), default, "
    "one_device, mirrored, multi_worker_mirrored, horovod.",
    "model": "Registry name: resnet18..resnet152, densenet121/169/201, efficientnet_b0..b7, "
    "efficientnetv2_b0..b3/s/m/l, tiny_cnn.",
    "data_dir": "Directory written by tools/to_tfrecord.py; empty = the built-in demo dataset "
    "(and the demo recipe for every flag not set).",
    "model_dir": "Where the run writes everything; resumes from the newest checkpoint there. "
    "Default: a new folder under runs/.",
    "num_classes": "Number of classes, for records without a dataset_info.json (0 = from it).",
    "label_offset": "Subtracted from stored labels (1 for TF's official ImageNet records; "
    "-1 = from dataset_info.json, else 0).",
    "synthetic_data": "Train on generated batches of the right shape: times the model, no I/O.",
    "image_size": "Training and evaluation image side, in pixels.",
    "small_input": "Small-input stem for 32x32-scale data: ResNets 3x3/1 conv, no max-pool; "
    "DenseNets and EfficientNets keep their stem layers at stride 1.",
    "init_weights": "A local .weights.h5 (same model) or .keras file (its logits layer may "
    "differ: fine-tuning) to start from; no downloads. A checkpoint in --model_dir wins.",
    "global_batch_size": "Examples per optimizer update, over all replicas and micro-batches.",
    "grad_accum_steps": "Micro-batches per update; per-replica micro-batch = global / "
    "(replicas x grad_accum_steps).",
    "train_steps": "Length of training in optimizer updates (0: use --epochs).",
    "epochs": "Length of training in passes over the train split (0: use --train_steps).",
    "steps_per_loop": "Updates per tf.function call (fewer Python round trips).",
    "optimizer": "sgd, nesterov, adam, adamw or lamb.",
    "learning_rate": "Base learning rate (peak, after warmup).",
    "scale_lr_with_batch": "Multiply --learning_rate by global_batch_size / 256.",
    "momentum": "Momentum of sgd and nesterov.",
    "weight_decay": "Decoupled weight decay; BatchNorm and bias variables are not decayed.",
    "lr_schedule": "After warmup: constant, cosine, linear or step (x0.1 at 30/60/90%).",
    "warmup_steps": "Linear learning-rate warmup, in optimizer updates.",
    "label_smoothing": "Label smoothing of the cross-entropy.",
    "clip_norm": "Clip the all-reduced gradients to this global norm (0: off).",
    "ema_decay": "Keep an exponential moving average of the weights with this decay (0: off).",
    "skip_non_finite": "Skip an update whose loss or gradients are not finite, and count it, "
    "instead of stopping (mixed_float16 always skips and lowers the loss scale).",
    "dtype": "float32, mixed_float16 (dynamic loss scaling) or mixed_bfloat16.",
    "jit_compile": "Compile the train step with XLA.",
    "seed": "Seed of initialization, shuffling and augmentation.",
    "deterministic": "Same flags + same seed = same weights: deterministic ops and data order.",
    "random_flip": "Random left-right flips in training.",
    "crop_min_area": "Smallest area fraction of a random-resized crop.",
    "dct_scaled_decode": "Decode JPEG crop windows 2, 4 or 8 times --image_size on both sides at "
    "that DCT scale: 15-20% less host CPU and smaller crops on large photos (1600x1200); costs "
    "~3% on ImageNet-sized images, where it seldom applies.",
    "eval_crop_fraction": "Evaluation center crop, as a fraction of the shorter side.",
    "eval_batch_size": "Global evaluation batch (0: the training global batch).",
    "shuffle_buffer": "Examples in the training shuffle buffer.",
    "cycle_length": "Files read in parallel by the interleave.",
    "data_threads": "Private tf.data thread pool size (0: the shared pool).",
    "cache_eval": "Cache the decoded evaluation split in memory.",
    "block_length": "Consecutive records the interleave takes from each file.",
    "ram_budget_mb": "RAM tf.data's autotuner may use for buffers, in MB (0: its default).",
    "eval_snapshot_dir": "Write the decoded evaluation crops here once (tf.data snapshot); "
    "later runs read them instead of decoding (empty: off).",
    "skip_truncated_shards": "Read a truncated shard up to the break, with a warning, instead "
    "of stopping with an error naming it.",
    "preprocess_on": "device: flip, cast, RandAugment, MixUp/CutMix run inside the step on the "
    "accelerator (uint8 crosses over); host: they run in tf.data.",
    "resize_on": "Where training crops are resized. host: in tf.data; device: they cross "
    "un-resized (packed one after the other, with their sizes) and a gather-based bilinear "
    "resizes them inside the step, before XLA; auto: device with a GPU and "
    "--preprocess_on=device, else host.",
    "mixup_alpha": "MixUp Beta(alpha, alpha) (0: off); pairs (2k, 2k+1) of each batch.",
    "cutmix_alpha": "CutMix Beta(alpha, alpha) (0: off); with --mixup_alpha each example picks "
    "one of the two at random.",
    "randaugment_ops": "RandAugment operations per image (0: off); keras.layers.RandAugment, "
    "not split-invariant under --deterministic.",
    "randaugment_magnitude": "RandAugment factor in [0, 1].",
    "tfds_name": "Train on a prepared tensorflow-datasets dataset (e.g. imagenet2012) instead "
    "of --data_dir.",
    "tfds_data_dir": "tensorflow-datasets data_dir of --tfds_name (empty: tfds' default).",
    "logical_cpu_devices": "Split the CPU into N devices, so mirrored has N replicas on a laptop.",
    "all_reduce_alg": "mirrored: auto, nccl, hierarchical_copy or reduce_to_one.",
    "communication": "multi_worker_mirrored collectives: auto, ring or nccl.",
    "collective_timeout_s": "A collective that waits longer (a dead worker) fails the run.",
    "hvd_compression": "horovod: none or fp16 compression of the gradient all-reduce.",
    "log_every_steps": "Print and log train metrics every N updates.",
    "eval_every_steps": "Evaluate every N updates (0: only at the end).",
    "eval_every_epochs": "Evaluate every N passes over the train split (0: only at the end).",
    "checkpoint_every_steps": "Write a checkpoint every N updates (and always at the end).",
    "keep_checkpoints": "Checkpoints kept (the newest).",
    "export": "At the end, export the model as .keras and as a SavedModel taking uint8 images.",
}


def define_flags(flag_values=flags.FLAGS) -> None:
    """Defines one absl flag per Config field in ``flag_values`` (idempotent)."""
    for field in dataclasses.fields(Config):
        name, default = field.name, field.default
        if name in flag_values:
            continue
        # Choices are checked by config.validate, which names them in one line.
        if isinstance(default, bool):
            flags.DEFINE_bool(name, default, HELP[name], flag_values=flag_values)
        elif isinstance(default, int):
            flags.DEFINE_integer(name, default, HELP[name], flag_values=flag_values)
        elif isinstance(default, float):
            flags.DEFINE_float(name, default, HELP[name], flag_values=flag_values)
        else:
            flags.DEFINE_string(name, default, HELP[name], flag_values=flag_values)


def config_from_flags(flag_values=flags.FLAGS, defaults: dict | None = None) -> Config:
    """A Config from parsed flags; ``defaults`` replace the values of flags not given."""
    values = {}
    for field in dataclasses.fields(Config):
        flag = flag_values[field.name]
        use_default = defaults and field.name in defaults and not flag.present
        values[field.name] = defaults[field.name] if use_default else flag.value
    return Config(**values)
