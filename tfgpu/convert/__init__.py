"""The converter behind ``tfgpu-to-tfrecord`` (``tools/to_tfrecord.py``; its flags, one-line
errors and exit codes: ``tfgpu/cli/convert.py``): apart from the trainer.

  inputs/     where images come from (folders, HDF5, tensorflow-datasets, LMDB, IDX, .npz,
              CIFAR's python batches)
  manifest.py what an input lists (Item, LazySplit, Source), how items are encoded
  plan.py     deals items into shards, runs the workers, writes dataset_info.json last
  replace.py  --overwrite: the new dataset written beside the old one, swapped in when complete
  worker.py   encodes images and writes one whole shard (records serialized by hand)
  verify.py   --verify: re-reads the output as the trainer does (the only part using TF)

Nothing in this package but verify.py imports TensorFlow when imported (tests/test_imports.py).
"""
