"""Convert image folders, HDF5, LMDB, tfds, IDX, .npz or CIFAR batches into sharded TFRecords.

  python tools/to_tfrecord.py --input=~/imagenet --output_dir=/data/imagenet-tfr [--verify]

``--help`` lists the flags; the code is ``tfgpu/convert/cli.py`` (also ``tfgpu-to-tfrecord``).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfgpu.convert.cli import run

if __name__ == "__main__":
    run()
