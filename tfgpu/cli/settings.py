"""The commands' own settings, beside the trainer's (``tfgpu/config/``): one frozen dataclass of
``setting()`` fields per command, declared once. ``flags.COMMAND_SETTINGS`` names each
command's; ``flags.define_flags`` makes its absl flags, ``flags.command_settings`` reads them
back as an instance, and ``docs/flags.md`` lists them.

A class may say what ``docs/flags.md`` shows for a default that depends on the machine
(``DOC_DEFAULTS``: {field: words}). No TensorFlow here: ``--help`` must not wait for it.
"""

import os
from dataclasses import dataclass
from typing import ClassVar

from tfgpu.convert.manifest import DEFAULT_MAX_FILE_MB, DEFAULT_MAX_MEGAPIXELS
from tfgpu.inference.export import ExportOptions
from tfgpu.settings import setting


@dataclass(frozen=True)
class LaunchSettings:
    """N multi-worker processes on one machine, each with its TF_CONFIG filled in:
    ``tfgpu-launch --num_workers=N -- <tfgpu-train flags>`` (``python -m tfgpu.launch``)."""

    num_workers: int = setting(2, "Worker processes to start on this machine.")
    host: str = setting(
        "localhost",
        "The host name written into each worker's TF_CONFIG: where the workers reach each other. "
        "TensorFlow's gRPC servers listen on every interface whatever it is (docs/security.md).",
    )
    grace_s: float = setting(30.0, "Seconds the others get to stop after one worker fails.")


@dataclass(frozen=True)
class RaySettings:
    """tfgpu's training loop as a Ray Train job: ``tfgpu-ray --num_workers=N ... -- <tfgpu-train
    flags>`` (``python -m tfgpu.ray``; docs/launchers/ray.md)."""

    DOC_DEFAULTS: ClassVar[dict] = {"num_workers": "none (required)"}

    num_workers: int | None = setting(None, "Ray workers: one process each.")
    use_gpu: bool = setting(False, "One GPU per worker (Ray's ScalingConfig(use_gpu=True)).")
    max_failures: int = setting(
        0,
        "How many failed attempts Ray restarts the worker group after (-1: always); each "
        "restart resumes from the newest checkpoint in --model_dir.",
    )
    address: str = setting(
        "",
        "An existing Ray cluster (its head HEAD_IP:6379, from a machine of the cluster); empty: "
        "RAY_ADDRESS if set, else a new local cluster.",
    )


@dataclass(frozen=True)
class ConvertSettings:
    """The converter: a dataset into sharded TFRecords, ``tfgpu-to-tfrecord``
    (``python tools/to_tfrecord.py``; docs/data.md)."""

    DOC_DEFAULTS: ClassVar[dict] = {"num_workers": "the number of CPUs"}

    input: str = setting(  # noqa: A003  (the flag's name)
        "",
        "A folder ROOT/<class>/<image> or ROOT/train|validation/<class>/..., an HDF5 file, "
        "an LMDB database (its folder, holding data.mdb, or the data.mdb file), a folder of IDX "
        "files (MNIST's: train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k- or "
        "test- files as validation), a NumPy .npz (keras.datasets' x_train, y_train[, x_test, "
        "y_test]) or CIFAR's python batches (the folder cifar-10-batches-py or "
        "cifar-100-python).",
    )
    class_names: str = setting(
        "",
        "IDX and .npz inputs, which name no classes (else 0..N-1): comma-separated names, or a "
        "text file with one name per line; one per class, label 0 first.",
    )
    tfds_name: str = setting("", "A tensorflow-datasets name (instead of --input), e.g. cifar10.")
    tfds_data_dir: str = setting(
        "", "Where that dataset is already prepared; nothing is downloaded."
    )
    hdf5_images: str = setting("images", "HDF5 dataset of uint8 images (N, H, W[, C]).")
    hdf5_labels: str = setting("labels", "HDF5 dataset of integer labels (N,).")
    lmdb_layout: str = setting(
        "auto",
        "LMDB values: datum (Caffe Datum records: raw or encoded pixels and a label), encoded "
        "(image bytes), or auto (told from the first values). Pickled values are refused. "
        "Labels: --lmdb_labels_file, else --lmdb_label_regex, else a key '<key>.label' beside "
        "each image holding its class index or name (ASCII/UTF-8), else the Datum's label.",
    )
    lmdb_label_regex: str = setting(
        "",
        "LMDB: a regular expression with one group, searched in each key, that captures the "
        r"label (class name or index), e.g. '^(\w+)/' or '_(\d+)$'.",
    )
    lmdb_labels_file: str = setting(
        "", "LMDB: a file of 'key,label' (or 'key label') lines, or a JSON object {key: label}."
    )
    lmdb_channel_order: str = setting(
        "bgr",
        "LMDB: channel order of raw 3-channel Datum pixels: bgr (what Caffe's convert_imageset "
        "and OpenCV write) or rgb.",
    )
    output_dir: str = setting("", "Where the shards and dataset_info.json go (created if missing).")
    validation_fraction: float = setting(
        0.1, "Share of each class held out when the input has no validation split."
    )
    seed: int = setting(0, "Seed of the validation split and of the shuffle across shards.")
    num_shards: int = setting(
        0, "Train shards (other splits in proportion); 0 = by --shard_size_mb."
    )
    shard_size_mb: float = setting(128.0, "Target shard size when --num_shards=0.")
    num_workers: int = setting(
        os.cpu_count() or 1, "Worker processes (whole shards each); 0 = in this process."
    )
    jpeg_quality: int = setting(
        95, "Quality of images that are re-encoded (non-JPEG, non-RGB, resized)."
    )
    lossless: bool = setting(
        False,
        "Re-encode as PNG instead of JPEG (original JPEGs still pass through). Inputs of raw "
        "pixel arrays (IDX, .npz, CIFAR) are stored as PNG unless --nolossless is given, so "
        "that their records hold the exact pixels (grayscale stays 1-channel).",
    )
    max_side: int = setting(0, "Shrink images whose longer side exceeds this (0 = keep sizes).")
    max_file_mb: int = setting(
        DEFAULT_MAX_FILE_MB,
        "Skip (by name, with the reason) input files larger than this many MB, unread.",
    )
    max_megapixels: int = setting(
        DEFAULT_MAX_MEGAPIXELS,
        "Skip images of more than this many million pixels, undecoded (their header says): "
        "a decompression bomb, a few kB that decode to GBs, is skipped by name.",
    )
    check_duplicates: bool = setting(
        True,
        "Find exact duplicates (equal pixels) and near-duplicates (re-encoded, resized, "
        "slightly cropped or flipped copies: perceptual hash plus thumbnail) within and across "
        "splits, and duplicates with different labels; writes quality.json beside "
        "dataset_info.json and prints one line (docs/data.md#data-quality). It adds about a "
        "seventh to the conversion's CPU time (measured on a quiet host: +13.4% to +14.2% on "
        "Fashion-MNIST's 28x28 images, +13.8% to +14.4% of the wall time with 2 workers; "
        "+11.3% on 20,000 photo-sized JPEGs: bench/README.md); --nocheck_duplicates skips it.",
    )
    dedupe: str = setting(
        "none",
        "With --check_duplicates: none (only report), validation (drop every non-train image "
        "that has a copy in train) or all (also keep one image of each group within a split).",
    )
    overwrite: bool = setting(
        False,
        "Replace a finished or different conversion in --output_dir. A finished dataset is "
        "replaced only once the new one is complete (written beside it, then swapped in): an "
        "interrupted run leaves it as it was.",
    )
    verify: bool = setting(False, "Re-read the output: counts match and every image decodes.")
    progress: bool = setting(True, "Show a progress bar with images/s and ETA.")


@dataclass(frozen=True)
class DataServiceSettings:
    """The tf.data service that ``--data_service=grpc://HOST:PORT`` sends the train pipeline
    to: ``tfgpu-data-service --role=...`` (``python -m tfgpu.data.service_server``;
    docs/input-pipeline.md)."""

    role: str = setting("", "dispatcher, worker or local.")
    port: int = setting(
        5050,
        "dispatcher and local: the dispatcher's port (on every interface: TensorFlow offers no "
        "narrower bind).",
    )
    work_dir: str = setting(
        "",
        "dispatcher and local: journal the dispatcher's state here (fault-tolerant mode: a "
        "restart on the same port and work dir resumes its jobs). Empty: no journal.",
    )
    dispatcher: str = setting("", "worker: the dispatcher's HOST:PORT (or grpc://HOST:PORT).")
    worker_port: int = setting(0, "worker: its port (0: any free one).")
    worker_host: str = setting(
        "",
        "worker: the name or address trainers reach it at (default: this machine's address on "
        "the route to the dispatcher); it listens on every interface whatever this is.",
    )
    num_workers: int = setting(2, "local: workers started in this process.")


# --- the uses of a trained run (tfgpu/inference/) --------------------------------------------


@dataclass(frozen=True)
class RunHead:
    """Which trained run, at which checkpoint, on which data: the head of every command that
    opens a run (``cli/head.py`` checks it before TensorFlow starts)."""

    model_dir: str = setting("", "A training run's --model_dir (its config.json names the data).")
    checkpoint: str = setting(
        "latest",
        "latest (newest in checkpoints/), best (best/best.json's first), a checkpoint path "
        "(.../ckpt-N), a .weights.h5 file of the run (final.weights.h5, tfgpu-average's) or "
        "an exported .keras file.",
    )
    data_dir: str = setting(
        "", "Another converted dataset with the same classes (default: the run's)."
    )


@dataclass(frozen=True)
class SidecarSettings:
    """How the side-car evaluator follows a run (docs/evaluator.md)."""

    watch_interval_s: float = setting(10.0, "With --watch: seconds between looks.")
    watch_timeout_s: float = setting(
        3600.0,
        "With --watch: give up (an error) after this many seconds without a new checkpoint "
        "or the run's end.",
    )


@dataclass(frozen=True)
class EvaluateSettings(SidecarSettings, RunHead):
    """A trained run's checkpoint evaluated on a split, or with ``--watch`` every checkpoint as
    it appears (the side-car evaluator): ``tfgpu-evaluate`` (``python -m tfgpu.evaluate``;
    docs/finetune.md, docs/evaluator.md)."""

    split: str = setting("validation", "Which split: train, validation or any other converted one.")
    output: str = setting(
        "",
        "Also write the results to this file (checked before anything is loaded; written "
        "whole through a temporary file in its folder, then renamed).",
    )
    eval_batch_size: int = setting(0, "Images per batch (0: the run's).")
    eval_tta: str = setting(
        "",
        "Test-time augmentation: none, flip (the softmax probabilities of each image and "
        "its mirror averaged) or flip_translate (and of the image shifted by one pixel both "
        "ways: tfgpu.main's --eval_tta). Default: the run's --eval_tta.",
    )
    tensorboard_dir: str = setting(
        "",
        "Where to write the confusion matrix as a TensorBoard image (default: the run's "
        "tensorboard/evaluate/; without --model_dir, nowhere unless given).",
    )
    watch: bool = setting(
        False,
        "Evaluate every checkpoint of --model_dir as it appears, until the run's last (a "
        "side-car evaluator; docs/evaluator.md).",
    )


@dataclass(frozen=True)
class PredictSettings(RunHead):
    """Top-k classes of image files, folders or a converted split, as CSV: ``tfgpu-predict
    [flags] FILE_OR_FOLDER ...`` (``python -m tfgpu.predict``; docs/finetune.md)."""

    split: str = setting("", "Predict a split of the dataset (--data_dir, or the run's) instead.")
    output: str = setting(
        "",
        "Write the CSV to this file (default: stdout; checked before anything is loaded; "
        "written whole through a temporary file in its folder, then renamed).",
    )
    top_k: int = setting(5, "Classes per image, most probable first.")
    batch_size: int = setting(32, "Images per forward pass.")


# Its flags: the run's head, then inference.export.ExportOptions' (declared there, in order).
@dataclass(frozen=True)
class ExportSettings(ExportOptions, RunHead):
    """A trained run as a SavedModel, a LiteRT or an ONNX model, checked against predict before
    it is put in place: ``tfgpu-export`` (``python -m tfgpu.export``; docs/deploying.md)."""


@dataclass(frozen=True)
class AverageSettings:
    """The mean of a finished run's last K checkpoints as a .weights.h5 file: ``tfgpu-average``
    (``python -m tfgpu.average``; docs/training-loop.md)."""

    model_dir: str = setting("", "A finished training run's --model_dir.")
    last: int = setting(0, "How many of the run's newest checkpoints to average.")
    output: str = setting(
        "", "The .weights.h5 file to write (default: --model_dir's averaged.weights.h5)."
    )


@dataclass(frozen=True)
class ReportSettings:
    """Runs as one self-contained HTML page (curves, the runs compared, where the time went,
    the confusion matrix and the worst mistakes): ``tfgpu-report RUN_DIR [RUN_DIR ...]
    --output=report.html`` (``python -m tfgpu.report``; docs/reports.md)."""

    output: str = setting(
        "report.html",
        "The HTML file to write (checked before any work; written whole through a temporary "
        "file in its folder, then renamed).",
    )
    evaluate: bool = setting(
        True,
        "Evaluate each run's checkpoint on its data (TensorFlow starts): the confusion matrix, "
        "accuracy per class and the gallery. --noevaluate: the run's files alone.",
    )
    checkpoint: str = setting(
        "latest", "Which checkpoint to evaluate: latest, best, or a path (as tfgpu-evaluate's)."
    )
    split: str = setting("validation", "The split evaluated.")
    gallery: int = setting(
        16, "Misclassified images to show, those the model was surest of first (0: none)."
    )
    batch_size: int = setting(64, "Images per forward pass when evaluating.")
