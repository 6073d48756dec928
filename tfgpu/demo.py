"""The built-in demo dataset and its recipe: what ``python -m tfgpu.main`` trains on when no
dataset flag is given (``cli/train.py`` fills in the dataset's directory and the recipe's flags).

It sits above both halves of the package: the converter writes the dataset, the reader reads
it like any other. ``digits.csv.gz`` beside this module holds the UCI handwritten digits
(1,797 real 8x8 scans, 10 classes; E. Alpaydin and C. Kaynak, UCI Machine Learning
Repository, CC BY 4.0), as scikit-learn ships them. They are upscaled to 32x32 RGB and written
as TFRecords by the converter's own code, once, into a cache directory; every later run reads
them from there, through the same pipeline as ImageNet.
"""

import gzip
import os
import shutil
import tempfile

import numpy as np
from PIL import Image

from tfgpu.convert import plan
from tfgpu.convert.manifest import items_from_arrays, split_items
from tfgpu.data.recordformat import INFO_FILE

DIGITS = os.path.join(os.path.dirname(__file__), "digits.csv.gz")
DEMO_VERSION = "digits-v1"
DEMO_IMAGE_SIZE = 32

# Flags the demo uses when no --data_dir is given (flags the user sets still win). The same
# values are written out in flags/demo_digits.flags; tests/cli/test_flags.py keeps the two equal.
DEMO_RECIPE = {
    "model": "tiny_cnn",
    # Read at 16x16 (the in-memory path resizes the 32x32 records once): the scans are 8x8, so
    # nothing is lost, and each update costs a quarter of 32x32's. 350 updates of 32 (7.8
    # epochs; tiny_cnn stays near chance for its first ~75): seeds 0-3 end at 98.1-99.2% top-1
    # in 15-18 s on 2 cores (at 32x32: 97.8% in 28 s; 64 a batch: twice the compute).
    "image_size": 16,
    "global_batch_size": 32,
    "train_steps": 350,
    "optimizer": "adam",
    "learning_rate": 0.002,
    "lr_schedule": "cosine",
    "warmup_steps": 40,
    "weight_decay": 0.0,
    "random_flip": False,  # digits are not mirror-symmetric
    "crop_padding": 1,  # the split is decoded in memory (--in_memory=auto): shifts of +-1 px
    "crop_min_area": 0.6,  # with --in_memory=off
    "eval_crop_fraction": 1.0,
    "eval_every_steps": 100,
    "log_every_steps": 25,
}


def cache_dir() -> str:
    """``$TFGPU_CACHE_DIR`` or ``~/.cache/tfgpu``."""
    return os.environ.get("TFGPU_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "tfgpu"
    )


def _digit_images() -> tuple[np.ndarray, np.ndarray]:
    # DIGITS is the file scikit-learn ships (load_digits reads it the same way), kept here so
    # that tfgpu needs no scikit-learn: Keras imports it at start-up when it is installed.
    with gzip.open(DIGITS, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    images, labels = table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)
    pixels = np.round(images * (255.0 / 16.0)).astype(np.uint8)
    big = [
        np.asarray(
            Image.fromarray(p).resize((DEMO_IMAGE_SIZE, DEMO_IMAGE_SIZE), Image.Resampling.BILINEAR)
        )
        for p in pixels
    ]
    return np.stack(big), labels


def build_demo_dataset(directory: str | None = None, seed: int = 0) -> str:
    """Returns the demo dataset's directory, writing it first if it is not there yet.

    It is written into a temporary sibling and renamed into place, so processes that start
    together (workers, ranks) never read a half-written dataset.
    """
    directory = directory or os.path.join(cache_dir(), "datasets", DEMO_VERSION)
    if os.path.exists(os.path.join(directory, INFO_FILE)):
        return directory
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".demo-", dir=parent)
    try:
        images, labels = _digit_images()
        items = items_from_arrays(images, labels, prefix="sklearn-digits")
        train, validation = split_items(items, validation_fraction=0.2, seed=seed)
        plan.write_dataset(
            {"train": train, "validation": validation},
            class_names=[str(d) for d in range(10)],
            output_dir=scratch,
            source="UCI optical recognition of handwritten digits (test set), upscaled to 32x32",
            num_shards={"train": 4, "validation": 2},
            seed=seed,
        )
        try:
            os.rename(scratch, directory)
        except OSError:  # another process finished first; its copy is identical
            pass
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return directory
