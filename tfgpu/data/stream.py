"""What every train input reader offers (``TrainReader``), and the plain arguments of the stream
it makes (``Stream``): ``pipeline.py`` (records read and decoded per example), ``memory.py``
(the split decoded once into memory) and ``service_client.py`` (the per-example pipeline on a
tf.data service's workers) implement it; ``readers.py`` chooses one for a run.
"""

from dataclasses import dataclass
from typing import Protocol

import tensorflow as tf

from tfgpu.distribute import InputShard


@dataclass(frozen=True)
class Stream:
    """How one input pipeline's endless train stream is cut and ordered, whatever reads it."""

    batch_size: int  # examples per replica per batch
    global_batch_size: int  # examples per update over every replica and worker
    seed: int  # the run's: every draw is a function of (seed, epoch, position)
    deterministic: bool  # every pipeline reads the same global order (``pipeline.py``)
    start_index: int = 0  # global examples skipped (resume)
    repeats: int = 1  # each example that many times (--repeated_augment, ``sampling.py``)


class TrainReader(Protocol):
    """A train input reader: ``make_train_dataset(source, data, shard, stream)``, the endless
    train stream of input pipeline ``shard`` under ``data`` (a config.DataConfig), batched
    ``stream.batch_size`` per replica in the layout ``pipeline.train_layout(data)`` names,
    each pipeline keeping its part of every global batch. ``source``: what the reader reads
    (a DataSpec; an InMemory for ``memory``)."""

    def make_train_dataset(
        self, source, data, shard: InputShard, stream: Stream
    ) -> tf.data.Dataset: ...
