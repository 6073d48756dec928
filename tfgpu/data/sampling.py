"""Which example sits at each position of the train stream, beyond a shuffled order: balanced
sampling (``--balanced_sampling``, the in-memory path: ``class_sampler``, ``balanced_index``)
and repeated augmentation (``--repeated_augment=K``, as timm's RepeatAugSampler and DeiT: each
example K times, each copy with its own augmentation draws, the copies on different replicas).

The layout, the same for both train paths: the stream of positions is cut into chunks of one
global batch (``chunk``; a pipeline's own share of it when pipelines read their own files).
Chunk c holds the g = chunk / K source examples c·g .. c·g + g - 1 of the source order (the
shuffled epochs, one after another), K times: copy j of the i-th at position j·g + i. Replicas
take contiguous slices of a global batch, so copies g apart land on different replicas when
there are at least K of them (with fewer, on different micro-batches when there are at least K
of those). A copy's draws are keyed by its own position, so the copies differ, and everything
stays a function of (seed, epoch, position): split-invariant and resumable.

Epoch length: chunks of ``chunk`` positions hold g source examples, so a training epoch (the
train split's size in positions, as ``--epochs`` counts it) holds about N / K distinct examples,
each K times, as timm's sampler does by default (DeiT's too); a pass over the data takes K
epochs. Unlike timm's per-epoch random subset, every example is seen K times per K epochs.
"""

import tensorflow as tf

from tfgpu.data import balance, rng_streams
from tfgpu.data.spec import DataError

_CLASS, _MEMBER = (
    rng_streams.EPOCH["class"],
    rng_streams.EPOCH["member"],
)  # balanced sampling's draws


def check(repeats: int, chunk: int, num_examples: int) -> None:
    """Raises DataError when ``chunk`` positions cannot hold ``repeats`` copies of whole
    groups, or a group is larger than the ``num_examples`` of an epoch (at most three source
    epochs then meet in one repeated epoch: ``repeated_index``)."""
    if repeats == 1:
        return
    if chunk % repeats:
        raise DataError(
            f"--repeated_augment={repeats} must divide each input pipeline's share of the "
            f"global batch ({chunk})"
        )
    if chunk // repeats > num_examples:
        raise DataError(
            f"--repeated_augment={repeats}: global_batch_size / K = {chunk // repeats} is more "
            f"than the {num_examples} train examples"
        )


def split_start(start_index: int, chunk: int, repeats: int) -> tuple[int, int]:
    """(source examples before the chunk holding position ``start_index``, positions of that
    chunk before it): where a resumed repeated stream starts. ``start_index`` may be a
    tensor (the data service's per-epoch pipelines): operators, not divmod."""
    return (start_index // chunk) * (chunk // repeats), start_index % chunk


def repeat_examples(ds: tf.data.Dataset, repeats: int, chunk: int) -> tf.data.Dataset:
    """The per-example path's stream of examples {epoch, position, ...} (from a chunk's start)
    -> the repeated stream: each group of chunk / K examples K times in a row, copy j of an
    example at ``position * K + j`` of its epoch (its own draws; never another's position)."""
    if repeats == 1:
        return ds

    def copies(group):
        def copy(j):
            return tf.data.Dataset.from_tensor_slices(
                {**group, "position": group["position"] * repeats + j}
            )

        return tf.data.Dataset.range(repeats).flat_map(copy)

    return ds.batch(chunk // repeats, drop_remainder=True).flat_map(copies)


def source_positions(q: tf.Tensor, chunk: int, repeats: int) -> tf.Tensor:
    """int64 positions ``q`` of the repeated stream -> their positions in the source order."""
    group = chunk // repeats
    return (q // chunk) * group + (q % chunk) % group


def repeated_index(epoch, n: int, repeats: int, chunk: int, index_of) -> tf.Tensor:
    """The in-memory path's example index at each of the K·n positions of repeated epoch
    ``epoch`` (positions counted across epochs from 0, K·n per epoch), from ``index_of(e)``:
    source epoch e's index over its n positions. The chunks of the repeated stream take their
    source examples across source epochs (a chunk can hold the end of one and the start of the
    next); with chunk / K <= n, those of one repeated epoch lie in source epochs ``epoch - 1``
    .. ``epoch + 1``."""
    epoch = tf.cast(epoch, tf.int64)
    q = epoch * (n * repeats) + tf.range(n * repeats, dtype=tf.int64)
    source = source_positions(q, chunk, repeats)
    around = tf.concat([index_of(epoch - 1), index_of(epoch), index_of(epoch + 1)], 0)
    return tf.gather(around, source - (epoch - 1) * n)


def describe(repeats: int, num_train: int, global_batch_size: int) -> str:
    """The start-up line of ``--repeated_augment`` (empty when off)."""
    if repeats == 1:
        return ""
    return (
        f"repeated augmentation: each example {repeats} times, {global_batch_size // repeats} "
        f"distinct per global batch of {global_batch_size}; an epoch stays {num_train} images "
        f"(about {num_train // repeats} distinct, timm's default), a pass over the data "
        f"{repeats} epochs"
    )


def class_sampler(mem, power: float) -> dict:
    """--balanced_sampling's tables for ``balanced_index``, from the split in memory
    (``memory.InMemory``): its usable examples (weight > 0) grouped by class, and the classes'
    cumulative probabilities (p(class) proportional to count^(1 - ``power``),
    ``balance.sampling_probabilities``)."""
    labels, weights = mem.labels.numpy(), mem.weights.numpy()
    members, starts, counts = balance.class_pools(labels, weights, mem.num_classes)
    if not counts.sum():
        raise DataError("--balanced_sampling: the train split holds no usable examples")
    cdf = balance.cumulative(balance.sampling_probabilities(counts, power))
    tables = {"members": members, "starts": starts, "counts": counts, "cdf": cdf}
    return {k: tf.constant(v) for k, v in tables.items()}


def balanced_index(key, n: int, sampler: dict) -> tf.Tensor:
    """int64 [n]: the example at each of an epoch's ``n`` positions under balanced sampling:
    a class by inverse CDF of one uniform draw, then one of its examples by another, both
    from the epoch's stateless keys (with replacement: a position depends on (seed, epoch,
    position) only, so resume and every split of the batch see the same examples)."""
    u = tf.random.stateless_uniform([n], key(_CLASS), dtype=tf.float64)
    cls = tf.searchsorted(sampler["cdf"], u, side="right")
    count = tf.gather(sampler["counts"], cls)
    v = tf.random.stateless_uniform([n], key(_MEMBER), dtype=tf.float64)
    within = tf.minimum(tf.cast(v * tf.cast(count, tf.float64), tf.int64), count - 1)
    return tf.gather(sampler["members"], tf.gather(sampler["starts"], cls) + within)


def slice_of_each_batch(ds, per_global: int, shard) -> tf.data.Dataset:
    """The contiguous slice of each global batch that pipeline ``shard.index`` of
    ``shard.count`` (an InputShard) keeps, from a stream in the global order whose elements
    come ``per_global`` to a global batch (examples; the in-memory path's batch draws): the
    examples of an update do not depend on the number of pipelines."""
    per_pipeline = per_global // shard.count
    ds = ds.enumerate().filter(lambda i, _: (i % per_global) // per_pipeline == shard.index)
    return ds.map(lambda _, element: element)
