"""The converter, ``tools/to_tfrecord.py``: a program of its own, apart from the trainer.

  cli.py      flags -> one conversion; one-line errors and exit codes
  inputs/     where images come from (folders, HDF5, tensorflow-datasets, LMDB, IDX, .npz,
              CIFAR's python batches)
  items.py    what an input lists (Item, LazySplit, Source) and the converter's errors
  plan.py     deals items into shards, runs the workers, writes dataset_info.json last
  replace.py  --overwrite: the new dataset written beside the old one, swapped in when complete
  worker.py   encodes images and writes one whole shard (records serialized by hand)
  verify.py   --verify: re-reads the output as the trainer does (the only part using TF)

Nothing in this package imports TensorFlow when imported (tests/test_imports.py).
"""
