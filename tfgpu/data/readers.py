"""Which reader a run's train batches come from (``train_maker``). The readers, each a
``stream.TrainReader``:

  pipeline.py        records read and decoded per example (files, or tfds)
  memory.py          the train split decoded once into memory, batches cut from it
  service_client.py  the per-example pipeline on a tf.data service's workers

and synthetic batches (``--synthetic_data``) need no reader at all.
"""

import time
from typing import Callable

import tensorflow as tf

from tfgpu.data import memory, pipeline, service_client
from tfgpu.data.spec import DataSpec
from tfgpu.data.stream import Stream, TrainReader
from tfgpu.distribute import InputShard

Maker = Callable[[InputShard], tf.data.Dataset]  # what a backend's distribute_dataset takes

READERS: tuple[TrainReader, ...] = (pipeline, memory, service_client)


def train_maker(spec: DataSpec, data, stream: Stream, *, model_dir: str, is_chief: bool) -> Maker:
    """``make(InputShard) -> tf.data.Dataset`` of per-replica train batches of ``stream``
    under ``data`` (a config.DataConfig): synthetic ones (--synthetic_data), through the
    tf.data service (--data_service: ``model_dir`` names the run's job, the chief says where
    it reads), cut from the decoded split in memory when ``memory.load`` gives it
    (--in_memory, loaded here, once), else read and decoded per example."""
    if data.synthetic_data:
        return lambda _: pipeline.make_synthetic_dataset(stream.batch_size, spec.num_classes, data)
    if data.data_service:
        return service_client.train_maker(
            spec, data, stream, model_dir=model_dir, is_chief=is_chief
        )
    mem = memory.load(spec, data)  # None: read per example
    source, reader = (spec, pipeline) if mem is None else (mem, memory)
    return lambda shard: reader.make_train_dataset(source, data, shard, stream)


PROBE_MAX_BATCHES = 100  # enough for a rate; small sets in memory finish early


def probe(make: Maker, shard: InputShard, data, batch_size: int, seconds: float) -> float | None:
    """Images/s of input pipeline ``shard``'s train batches alone (``make``: ``train_maker``'s
    for ``data``, batches of ``batch_size``): a fresh dataset read for ``seconds`` after its
    first batch (what training reads is untouched, so resume stays exact). None when off,
    synthetic or through the data service (a probe there would be a job of its own)."""
    if seconds <= 0 or data.synthetic_data or data.data_service:
        return None
    iterator = iter(make(shard))
    next(iterator)  # the pipeline's start (files opened, buffers filled) is not its rate
    batches, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds and batches < PROBE_MAX_BATCHES:
        next(iterator)
        batches += 1
    return batches * batch_size / (time.perf_counter() - start)
