"""Convert image folders, HDF5, LMDB, tfds, IDX, .npz or CIFAR batches into sharded TFRecords.

  python tools/to_tfrecord.py --input=~/imagenet --output_dir=/data/imagenet-tfr [--verify]

``--help`` lists the flags; the command is ``tfgpu/cli/convert.py`` (also ``tfgpu-to-tfrecord``).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfgpu.cli.convert import run

if __name__ == "__main__":
    run()
