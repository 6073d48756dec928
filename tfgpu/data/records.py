"""The records of a split's shards as the input pipeline reads them: a parallel interleave
over the files (``read``: each record with its file and index, ``origin`` making them one),
and for training the endless stream of examples from an epoch on (``train_examples``), each
epoch's blocks shuffled statelessly by (seed, epoch), so that a restarted run reads epoch k
as an uninterrupted one did. ``pipeline.py`` decodes and batches them.
"""

import tensorflow as tf

from tfgpu.data import broken, host_ops
from tfgpu.data.spec import DataSpec

AUTOTUNE = tf.data.AUTOTUNE


def read(files, data, deterministic: bool, epoch_seed=None) -> tf.data.Dataset:
    """Parallel interleave over ``files``, their order shuffled by ``epoch_seed`` when given:
    {record, file (its index in ``files``), index (in the file)}; ``origin`` makes them one.

    Each record is zipped with its file and index, not mapped: a map per record cost ~60 µs
    of host CPU per image on ~37 KB photos, about as much as reading and parsing them
    (bench/README.md)."""
    names = tf.constant(list(files))
    order = tf.range(len(files), dtype=tf.int64)
    if epoch_seed is not None:
        order = tf.random.experimental.stateless_shuffle(order, seed=epoch_seed)

    def read(index):
        # 1 MB reads: an 8 MB buffer cost +0.02 ms of host CPU per record (cache misses).
        ds = tf.data.TFRecordDataset(tf.gather(names, index), buffer_size=1 << 20)
        # load_data_spec has already named truncated shards; here they end at the break.
        ds = ds.ignore_errors() if data.skip_truncated_shards else ds
        file = tf.data.Dataset.from_tensors(index).repeat()
        return tf.data.Dataset.zip(
            {"record": ds, "file": file, "index": tf.data.Dataset.range(1 << 62)}
        )

    return tf.data.Dataset.from_tensor_slices(order).interleave(
        read,
        cycle_length=min(data.cycle_length, len(files)),
        block_length=data.block_length,
        num_parallel_calls=AUTOTUNE,
        deterministic=deterministic,
    )


def origin(record: dict) -> tf.Tensor:
    """``broken.origin`` of records of ``read`` (one, or a block of them)."""
    return broken.origin(record["file"], record["index"])


def _blocks(ds, size: int, epoch_seed, shuffle: bool, spec: DataSpec, files) -> tf.data.Dataset:
    """One epoch's records as (block index, block of up to ``size`` parsed examples
    {encoded, label, valid}), each block shuffled statelessly when ``shuffle``.

    A hand-made block shuffle because ``Dataset.shuffle`` draws from a stateful generator: a
    stateless one makes epoch k the same whether or not the run was restarted before it (exact
    resume without replaying earlier epochs). Whole blocks are the unit so that the caller can
    prefetch the next one (see ``train_examples``), and so that parsing and the byte check run
    once per block, vectorized (measured: 5-8% more images/s than one record at a time).
    """

    def parsed(i, block):
        # A label out of range stops the run here, naming its shard and index (``files``:
        # what the block's file indices point into), before a batch holds it.
        example = spec.parse(block["record"], origin(block), files)
        example["valid"] = host_ops.looks_whole(example["encoded"])
        example["origin"] = origin(block)
        if shuffle:
            order = tf.range(tf.shape(block["index"])[0])
            order = tf.random.experimental.stateless_shuffle(order, seed=epoch_seed + [0, i + 1])
            example = {k: tf.gather(v, order) for k, v in example.items()}
        return i, example

    return ds.batch(size).enumerate().map(parsed)


def train_examples(files, data, spec: DataSpec, first_epoch, seed, deterministic):
    """The endless stream of examples {epoch, position in the epoch, encoded, label, valid}
    from ``first_epoch`` on.

    Blocks are read and shuffled one ahead of the decoder (``prefetch(1)`` outside the
    per-epoch ``flat_map``): without it, the decoders sat idle while each block, and above all
    each epoch's first block, was read (a stall of ``shuffle_buffer`` reads; measured 10-30%
    of throughput with 1,000-image epochs). Costs one more block of encoded records in RAM.
    """
    size = max(data.shuffle_buffer, 256)

    def one_epoch(epoch):
        epoch_seed = tf.stack([tf.cast(seed, tf.int64), epoch * 1_000_003])
        records = read(files, data, deterministic, epoch_seed)
        blocks = _blocks(records, size, epoch_seed, data.shuffle_buffer > 1, spec, files)
        return blocks.map(lambda i, block: (epoch, i, block))

    def examples_of(epoch, i, block):
        count = tf.shape(block["label"], out_type=tf.int64)[0]
        positions = tf.range(count) + i * size  # blocks are full except an epoch's last
        return tf.data.Dataset.from_tensor_slices(
            {"epoch": tf.fill([count], epoch), "position": positions, **block}
        )

    blocks = tf.data.Dataset.counter(first_epoch).flat_map(one_epoch)
    return blocks.prefetch(1).flat_map(examples_of)
