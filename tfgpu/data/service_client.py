"""``--data_service=grpc://HOST:PORT``: the per-example train pipeline runs on the workers of a
tf.data service (``python -m tfgpu.data.service_server``), and the step consumes the per-replica
batches they send back. Evaluation still reads here.

Visitation: DYNAMIC sharding ("distributed_epoch") with one split per epoch. The stream sent to
the service is ``Dataset.range(epochs).flat_map(one epoch)``, where one epoch is
``pipeline.make_train_dataset`` started at that epoch and cut after the epoch's last full
per-replica batch (``epoch_batches``). The dispatcher hands each epoch number to one worker,
once, so within one job each (epoch, position) is produced at most once: no example twice in
an epoch, no epoch twice. Without faults every epoch the step passes through is complete but
for its last (examples mod batch) examples; a worker that dies mid-epoch loses the rest of
that epoch, and a trainer that restarts loses what its client had prefetched. Several workers
work on successive epochs at once, so the step sees them interleaved.

Why not the pipeline's own endless stream: it counts epochs with ``Dataset.counter``, a scan
over ``from_tensors(0).repeat()``, whose state lives on each worker; the dispatcher then splits
only the repetitions, and every worker produces epoch 0, 1, ... itself. Measured with 2 workers
(tests/data/test_data_service.py): every (epoch, position) twice, as identical batches
(the randomness is a function of (seed, epoch, position)), in either processing mode.

Jobs: one per trainer input pipeline (never round-robin consumers, which need every consumer
alive), named by what makes its stream (``job_name``), so that a restarted trainer rejoins its
job. A job found by name is rejoined as it is, whatever dataset the new client sends (measured):
the name must change whenever the stream would. Iterator checkpoints are not supported through
the service, so a rejoined job continues where the job is, not at the restored step.

Determinism (``--deterministic``): each example's crop, flip, augmentation and MixUp/CutMix
draws are still a function of (seed, epoch, position), and each batch holds consecutive
positions of one epoch; which epochs the workers take, and the order in which their batches
reach the step, are the service's. Runs with the same flags need not end with the same
weights, nor resume exactly.
"""

import dataclasses
import hashlib
import json
import os

import tensorflow as tf

from tfgpu import __version__
from tfgpu.data import pipeline
from tfgpu.data import spec as data_spec
from tfgpu.data.spec import DataError, DataSpec
from tfgpu.data.stream import Stream
from tfgpu.distribute import InputShard
from tfgpu.data.recordformat import scan_shard

PROCESSING_MODE = tf.data.experimental.service.ShardingPolicy.DYNAMIC
GUARANTEE = "each example at most once per epoch"
_EPOCHS = 2**62  # the stream's epochs: endless in practice, and a splittable source
_GET_WORKERS = "/tensorflow.data.DispatcherService/GetWorkers"


def address(service: str) -> str:
    """``grpc://host:port`` -> ``host:port``."""
    return service.split("://", 1)[-1]


def check_reachable(service: str, timeout_s: float) -> int | None:
    """The number of workers the dispatcher at ``service`` knows (None: it did not say), once
    it answers; a DataError naming the address when nothing answers within ``timeout_s``.

    Without this, ``distribute`` would wait up to an hour (TensorFlow's own retry deadline)
    for a dispatcher that is not there, and say nothing.
    """
    import grpc  # noqa: PLC0415  (grpcio comes with TensorFlow)

    target = address(service)
    channel = grpc.insecure_channel(target)
    try:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise DataError(
                f"--data_service={service}: no tf.data service dispatcher answered at {target} "
                f"within --data_service_timeout_s={timeout_s:g} s (start one with python -m "
                "tfgpu.data.service_server --role=dispatcher)"
            ) from None
        get_workers = channel.unary_unary(
            _GET_WORKERS, request_serializer=bytes, response_deserializer=bytes
        )
        try:
            reply = get_workers(b"", timeout=timeout_s)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise DataError(
                    f"--data_service={service}: the gRPC server at {target} is not a tf.data "
                    "service dispatcher"
                ) from None
            return None
        return _count_workers(reply)
    finally:
        channel.close()


def _count_workers(reply: bytes) -> int | None:
    """The entries of field 1 (``repeated WorkerInfo workers``) of a GetWorkersResponse, read
    from the wire format (TensorFlow ships no Python module for the dispatcher's messages)."""
    i, count = 0, 0
    while i < len(reply):
        if reply[i] != 0x0A:  # field 1, length-delimited; anything else: not what we expect
            return None
        i, length, shift = i + 1, 0, 0
        while i < len(reply):
            byte = reply[i]
            i, length, shift = i + 1, length | (byte & 0x7F) << shift, shift + 7
            if byte < 0x80:
                break
        i, count = i + length, count + 1
    return count


def job_name(data, spec: DataSpec, shard: InputShard, stream: Stream, model_dir: str) -> str:
    """``tfgpu-<hash>-shard<i>of<n>``: the same for a restart of this run (so it rejoins its
    job), different whenever the stream would differ (the job's dataset is not compared).

    The hash covers what makes the stream: the common settings of ``data`` (a
    config.DataConfig, as resolved), the seed, the order and the batch sizes of ``stream``, the
    dataset (classes, counts, shard names), tfgpu's version, and the run's ``model_dir``, so two
    runs with the same flags never share a job (they would split its epochs between them).
    """
    key = {
        "data": data.shared(),
        "seed": stream.seed,
        "deterministic": stream.deterministic,
        "global_batch_size": stream.global_batch_size,
        "batch_size": stream.batch_size,
        "spec": spec.summary(),
        "version": __version__,
        "model_dir": os.path.abspath(os.path.expanduser(model_dir)),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    return f"tfgpu-{digest[:12]}-shard{shard.index}of{shard.count}"


def _by_file(spec: DataSpec, shard: InputShard, deterministic: bool) -> bool:
    """Whether ``pipeline.make_train_dataset`` gives this pipeline its own files (its rule)."""
    return not deterministic and len(spec.train_files) >= shard.count


def epoch_batches(
    spec: DataSpec, shard: InputShard, batch_size: int, global_batch_size: int, deterministic: bool
) -> int:
    """Per-replica batches of one epoch that hold only that epoch's examples, in the stream
    ``pipeline.make_train_dataset`` makes for ``shard`` from an epoch's start.

    Own files (``_by_file``): the records of those files, counted (the dataset's count is for
    all files). Else every pipeline keeps its contiguous part of each global batch of the
    epoch, the last one partial.
    """
    if _by_file(spec, shard, deterministic):
        files = spec.train_files[shard.index :: shard.count]
        examples = spec.num_train if shard.count == 1 else _count_records(files)
    else:
        n, part = spec.num_train, global_batch_size // shard.count
        last = min(part, max(0, n % global_batch_size - shard.index * part))
        examples = (n // global_batch_size) * part + last
    return examples // batch_size


def _count_records(files) -> int:
    """Records in ``files``: local ones by their headers (``scan_shard``), others read."""
    local = [f for f in files if "://" not in f and os.path.isfile(f)]
    remote = [f for f in files if f not in local]
    return sum(scan_shard(f)[0] for f in local) + data_spec.count_records(remote)


def make_train_dataset(spec: DataSpec, data, shard: InputShard, stream: Stream) -> tf.data.Dataset:
    """The endless train stream of one input pipeline as the service runs it: epoch after
    epoch, each one ``pipeline.make_train_dataset`` from that epoch's start, cut after its
    ``epoch_batches``; its source, the epoch numbers, is what the dispatcher splits
    (``TrainReader``'s contract).

    It does not depend on where a restarted run resumes (``stream.start_index``): the job
    continues where it is; ``stream.repeats`` above 1 is refused before (--repeated_augment).
    """
    batch_size, deterministic = stream.batch_size, stream.deterministic
    per_epoch = epoch_batches(spec, shard, batch_size, stream.global_batch_size, deterministic)
    if per_epoch < 1:
        raise DataError(
            f"--data_service: an epoch of {spec.num_train} examples gives input pipeline "
            f"{shard.index} of {shard.count} no full batch of {batch_size}"
        )
    by_file = _by_file(spec, shard, deterministic)
    epoch_size = spec.num_train // (shard.count if by_file else 1)  # the pipeline's own unit

    def one_epoch(epoch):
        at = dataclasses.replace(stream, start_index=epoch * epoch_size, repeats=1)
        # name_broken: a py_function, which cannot run on a service worker
        return pipeline.make_train_dataset(spec, data, shard, at, name_broken=False).take(per_epoch)

    ds = tf.data.Dataset.range(_EPOCHS).flat_map(one_epoch)
    return ds.with_options(pipeline.dataset_options(deterministic, data))


def distribute(dataset: tf.data.Dataset, data, job: str) -> tf.data.Dataset:
    """``dataset`` (already batched: the service's cost is per element) read through the
    service at ``data.data_service``, as job ``job``."""
    return dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode=PROCESSING_MODE,
            service=data.data_service,
            job_name=job,
            compression=None if data.data_service_compression == "none" else "AUTO",
        )
    )


def start_line(data, deterministic: bool, job: str, workers: int | None) -> str:
    """What the run says at start-up: where the pipeline runs, the visitation guarantee, and
    that exact resume (and, with ``deterministic``, the batch order) does not hold."""
    known = "" if workers is None else f"{workers} worker(s), "
    line = (
        f"data service {data.data_service} ({known}job {job}): the train pipeline runs on its "
        f"workers, {GUARANTEE} (a worker lost mid-epoch loses the rest of that epoch); no exact "
        "resume: a restarted run rejoins its job where the job is"
    )
    if deterministic:
        line += (
            "; --deterministic keeps each example's crop and flips a function of (seed, epoch, "
            "position), not which epochs the batches come from nor their order"
        )
    return line


def train_maker(spec: DataSpec, data, stream: Stream, *, model_dir: str, is_chief: bool):
    """``make(shard)`` for a backend's ``distribute_dataset``: the ``stream`` of ``spec`` under
    ``data`` (a config.DataConfig) through the service, once the dispatcher has answered
    (``check_reachable``); the chief says where it reads. ``model_dir`` names the run's job."""
    workers = check_reachable(data.data_service, data.data_service_timeout_s)
    if workers == 0 and is_chief:
        print(
            f"tfgpu: the tf.data service at {data.data_service} has no worker yet; training "
            "waits for one (python -m tfgpu.data.service_server --role=worker "
            f"--dispatcher={address(data.data_service)})",
            flush=True,
        )

    def make(shard: InputShard) -> tf.data.Dataset:
        job = job_name(data, spec, shard, stream, model_dir)
        if is_chief:
            print(start_line(data, stream.deterministic, job, workers), flush=True)
        return distribute(make_train_dataset(spec, data, shard, stream), data, job)

    return make
