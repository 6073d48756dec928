"""The converter behind ``tfgpu-to-tfrecord`` (``tools/to_tfrecord.py``; its flags, one-line
errors and exit codes: ``tfgpu/cli/convert.py``): apart from the trainer; it writes the
record format the reader reads (``tfgpu/data/recordformat.py``) and imports nothing else of
``tfgpu.data``.

  inputs/     where images come from (folders, HDF5, tensorflow-datasets, LMDB, IDX, .npz,
              CIFAR's python batches)
  manifest.py what an input lists (Item, LazySplit, Source), how items are encoded
  plan.py     deals items into shards, runs the workers, writes dataset_info.json last
  replace.py  --overwrite: the new dataset written beside the old one, swapped in when complete
  worker.py   writes one whole shard (records serialized by hand)
  encode.py   one image checked (file, size, pixels) and encoded: passed through or re-encoded
  fingerprint.py  what the duplicate check keeps of each image (exact key, pHashes, thumbnail)
  duplicates.py   the duplicate check: near and exact groups, leaks, quality.json's content
  near_search.py  its search for near pairs (a k-d tree, or multi-index hashing)
  crops.py        its second relation: cropped (and small) copies, aligned with their nearest
  dedupe.py   --dedupe: the shards rewritten without the dropped copies
  verify.py   --verify: re-reads the output as the trainer does (the only part using TF)

Nothing in this package but verify.py imports TensorFlow when imported (tests/test_imports.py).
"""
