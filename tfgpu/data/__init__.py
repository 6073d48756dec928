"""The reader: from converted TFRecords (or tfds, or synthetic batches) to the step's batches.
The record format it reads is its own (``recordformat.py``): the converter writes it and
imports nothing else of data/.

  recordformat.py  the record format (schema, one example's codec, TFRecord framing), and a
                 tfds dataset's image and label features; no TensorFlow until parsed
  config.py      its settings (``config.data``) and their checks; no TensorFlow
  curriculum.py  the curriculum's settings (``config.curriculum``: repeated augmentation,
                 progressive resizing) and their checks; no TensorFlow
  spec.py        a dataset's shards, counts and checks (DataSpec), whatever its source
  dataset_info.py  what a dataset_info.json may say, checked once when a dataset is opened
  identity.py    the data a run recorded (data.json), compared when the run resumes
  run_input.py   data/'s one door for a training run (``train/`` calls nothing else here):
                 ``prepare`` takes the data settings once and works out the RunInput (the
                 spec, the class weights, start-up lines, the step's batch functions, the
                 serving signatures' inputs, the train stream, the data's record); its later
                 uses take it and no settings: the train batches (a progressive stage's
                 too), a scratch copy for the micro-batch search, the broken records
  readers.py     which reader a run's train batches come from: pipeline, memory or
                 service_client, each a ``stream.TrainReader``
  stream.py      what every train reader offers (``TrainReader``), and the plain arguments
                 of the stream it makes (``Stream``: batch sizes, seed, order, start, repeats)
  pipeline.py    the tf.data pipelines: train, eval, synthetic
  records.py     the shards' records as the pipelines read them: interleaved, and for
                 training an endless stream shuffled statelessly per epoch
  packing.py     train batches of crops of different sizes, packed into int64 words
  memory.py      small images: the train split decoded once into memory, batches cut from it
  host_ops.py    per-example work on the host: check, decode the crop window, draw the dice
  device_ops.py  per-batch float work, inside the step on the accelerator: resize, flip, mix
  augment.py     augmentation policies (RandAugment, TrivialAugment, AutoAugment): per-example
                 draws on the host, applied to the batch in three batched stages
  augment_ops.py the policies' ops, one registry entry each (``OPS``)
  erasing.py     random erasing: its draws, and the noise that fills the boxes
  rng_streams.py every random stream id of the input pipeline, in one table
  balance.py     class balance: --class_weights' weights (applied by the step's loss) and
                 balanced sampling's class probabilities (drawn by memory.py); no TensorFlow
  broken.py      records that fail to decode, named once (shard and index)
  service_client.py  --data_service: the train pipeline run by tf.data service workers
  service_cluster.py the service's servers (dispatcher, workers), which tfgpu-data-service
                 starts (service_server.py: its `python -m` alias)

This file holds the choices ``config.py`` checks before TensorFlow starts.
"""

PREPROCESS_ON = ("device", "host")
RESIZE_ON = ("auto", "host", "device")
IN_MEMORY = ("auto", "on", "off")
AUGMENT_POLICIES = ("none", "randaugment", "trivialaugment", "autoaugment")
DCT_SCALED_DECODE = ("off", "auto", "on")
