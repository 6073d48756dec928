"""The reader: from converted TFRecords (or tfds, or synthetic batches) to the step's batches.

  config.py      its settings (``config.data``) and their checks; no TensorFlow
  spec.py        a dataset's shards, counts and checks (DataSpec), whatever its source
  records.py     one record <-> {encoded, label}, with TensorFlow (the schema is ../schema.py)
  pipeline.py    the tf.data pipelines: train, eval, synthetic
  memory.py      small images: the train split decoded once into memory, batches cut from it
  host_ops.py    per-example work on the host: check, decode the crop window, draw the dice
  device_ops.py  per-batch float work, inside the step on the accelerator: resize, flip, mix
  broken.py      records that fail to decode, named once (shard and index)
  service.py     --data_service: the train pipeline run by tf.data service workers
  demo.py        the built-in demo dataset, written by the converter's own code

This file holds the choices ``config.py`` checks before TensorFlow starts.
"""

PREPROCESS_ON = ("device", "host")
RESIZE_ON = ("auto", "host", "device")
IN_MEMORY = ("auto", "on", "off")
