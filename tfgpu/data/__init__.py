"""The reader: from converted TFRecords (or tfds, or synthetic batches) to the step's batches.

  spec.py        a dataset's shards, counts and checks (DataSpec), whatever its source
  records.py     one record <-> {encoded, label}, with TensorFlow (the schema is ../schema.py)
  pipeline.py    the tf.data pipelines: train, eval, synthetic
  host_ops.py    per-example work on the host: check, decode the crop window, draw the dice
  device_ops.py  per-batch float work, inside the step on the accelerator: resize, flip, mix
  demo.py        the built-in demo dataset, written by the converter's own code

This file holds the choices ``config.py`` checks before TensorFlow starts.
"""

PREPROCESS_ON = ("device", "host")
RESIZE_ON = ("auto", "host", "device")
IN_MEMORY = ("auto", "on", "off")
