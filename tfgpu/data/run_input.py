"""data/'s one door for a training run: the trainer (``train/``) calls this module and
nothing else of data/, in the order a run asks:

  load          the dataset's spec and the class weights the loss uses (and whether a
                resumed run's data is what it recorded)
  prepare       the rest, worked out once and handed over as plain values (``RunInput``):
                its start-up lines (class balance, repeated augmentation), the start line's
                words on the input, whether the train split is read from memory, what the
                train step does to the train pipeline's batches (``step_fns``), what the
                export's serving signatures need (``serving``), how the train stream is cut
                (``Stream``); the data recorded with the run (on the chief)
  train_batches the train batches from an update on (the reader: ``readers.train_maker``),
                distributed by the backend, and the input's own speed (``readers.probe``)
  first_images  the first training images, for a layer initialised from the data
                (``sample``: a whitening layer)
  forget_broken, broken_found   the records that failed to decode (``broken``)
"""

import dataclasses
import enum
from dataclasses import dataclass

import numpy as np

from tfgpu.data import augment, balance, broken, device_ops, dct, identity, memory, pipeline
from tfgpu.data import readers, sample, sampling
from tfgpu.data import spec as data_spec
from tfgpu.data.stream import Stream
from tfgpu.errors import ConfigError


def class_weights(setting: str, spec: data_spec.DataSpec):
    """--class_weights' float64 [K] weights (``setting``) for the dataset of ``spec``, or None
    when off; a ConfigError names a file that does not fit it (``balance.class_weights``)."""
    return balance.class_weights(setting, spec.data_dir, data_spec.class_names(spec))


def load(data, class_weights_setting: str, resumed_in: str = "") -> tuple:
    """(the DataSpec of ``data``, a config.DataConfig; its class weights as ``class_weights``
    reads them). Raises DataError or ConfigError, naming the file or flag; a DataError too
    when the run in ``resumed_in`` (its --model_dir) resumes on other data than it recorded
    (``identity.check``)."""
    spec = data_spec.load_spec(data)
    if resumed_in:
        identity.check(resumed_in, spec)
    return spec, class_weights(class_weights_setting, spec)


class _Read(enum.Enum):
    """``prepare``'s class weights when its caller has none agreed: read --class_weights
    then (None cannot say so: it means no class weights)."""

    READ = "read --class_weights"


READ = _Read.READ


@dataclass(frozen=True)
class RunInput:
    """What a training run takes from data/ besides its readers, worked out once
    (``prepare``): plain values the trainer hands on."""

    data: object  # the run's config.DataConfig: what the readers and the step read by
    spec: data_spec.DataSpec
    class_weights: np.ndarray | None  # float64 [K] for the loss, or None
    lines: str  # the start-up lines on class balance and repeated augmentation ("": none)
    words: str  # the start line's words on the input (``describe``)
    in_memory: bool  # the train split read from memory (decided at the final size)
    step_fns: tuple  # (prepare, unpack): what the train step does to the train batches
    serving: dict  # the export's serving signatures' keyword arguments (``serving``)
    stream: Stream  # how the train stream is cut and ordered, from update 0
    model_dir: str = ""  # the run's: the tf.data service names its job after it
    is_chief: bool = True  # the chief says where the tf.data service reads


def prepare(
    data,
    setting: str,
    spec: data_spec.DataSpec,
    weights=READ,
    stream=None,
    model_dir: str = "",
    is_chief: bool = True,
) -> RunInput:
    """The ``RunInput`` of a run on ``spec`` under ``data`` (a config.DataConfig), whose loss
    takes the class ``weights`` (float64 [K] or None; READ: read --class_weights=``setting``
    now), whose train stream is ``stream`` (a ``Stream``; None: one replica's batch of 1,
    seed 0, for a look at the set-up alone). ``model_dir``: the run's, where the chief
    (``is_chief``) records the data (``identity.record``: what ``load`` compares a resumed
    run with). Raises ConfigError for balanced sampling the split's path cannot
    do, or a --class_weights file that does not fit."""
    weights = class_weights(setting, spec) if weights is READ else weights
    stream = stream or Stream(batch_size=1, global_batch_size=1, seed=0, deterministic=False)
    reading = memory.decide(spec, data)
    lines = (
        class_balance(data, setting, spec, weights),
        sampling.describe(stream.repeats, spec.num_train, stream.global_batch_size),
    )
    inputs = RunInput(
        data=data,
        spec=spec,
        class_weights=weights,
        lines="\n".join(line for line in lines if line),
        words=describe(data, spec, reading),
        in_memory=reading.use,
        step_fns=step_fns(data, spec.num_classes),
        serving=serving(data, spec),
        stream=stream,
        model_dir=model_dir,
        is_chief=is_chief,
    )
    if model_dir and is_chief:  # once the input is checked
        identity.record(model_dir, spec)
    return inputs


def train_maker(inputs: RunInput, start_step: int, data=None):
    """``make(InputShard) -> tf.data.Dataset``: the per-replica train batches of ``inputs``
    from update ``start_step`` on (``readers.train_maker``; ``data``: the DataConfig to read
    by, a progressive stage's; None: the run's)."""
    stream = inputs.stream
    stream = dataclasses.replace(stream, start_index=start_step * stream.global_batch_size)
    where = dict(model_dir=inputs.model_dir, is_chief=inputs.is_chief)
    return readers.train_maker(inputs.spec, data or inputs.data, stream, **where)


def train_batches(inputs: RunInput, backend, start_step: int, data=None, probe_s: float = 0.0):
    """(an iterator of the train batches of ``inputs`` from update ``start_step`` on,
    distributed over the replicas of ``backend``; ``data``: the DataConfig to read by, a
    progressive stage's, None: the run's), and the images/s of this worker's input alone
    (``readers.probe``: a fresh pipeline read for ``probe_s`` seconds first; None when off or
    not measurable)."""
    make = train_maker(inputs, start_step, data)
    shard, batch = backend.input_shard, inputs.stream.batch_size
    input_ips = readers.probe(make, shard, data or inputs.data, batch, probe_s)
    return iter(backend.distribute_dataset(make)), input_ips


def probe(inputs: RunInput, make, shard, seconds: float) -> float | None:
    """Images/s of the train batches of ``make`` (``train_maker``) alone, read on input
    pipeline ``shard`` for ``seconds`` (``readers.probe``; None: off or not measurable)."""
    return readers.probe(make, shard, inputs.data, inputs.stream.batch_size, seconds)


def first_images(inputs: RunInput, count: int):
    """uint8 [n, S, S, 3]: the first ``count`` training records of the run's data
    (``sample.first_train_images``), what a layer initialised from the data reads."""
    return sample.first_train_images(inputs.spec, inputs.data, count)


def forget_broken() -> None:
    """Forgets the broken records an earlier run in this process found (``broken.forget``)."""
    broken.forget()


def broken_found() -> list:
    """The broken records this process has read so far (``broken.found``)."""
    return broken.found()


def class_balance(data, setting: str, spec: data_spec.DataSpec, weights) -> str:
    """The start-up line on class balance (--balanced_sampling, and the class ``weights``, float
    [K] or None, read by --class_weights=``setting``), "" for neither. Balanced sampling that
    the split's path cannot do is a ConfigError naming why."""
    lines = []
    if data.balanced_sampling:
        decision = memory.decide(spec, data)
        if not decision.use:  # the streaming reader has no random access by class
            raise ConfigError(
                "--balanced_sampling needs the train split in memory (--in_memory; docs/data.md: "
                f"Class balance), and here: {decision.reason}"
            )
        lines.append(balance.describe_sampling(data.sampling_power))
    if weights is not None:
        names = data_spec.class_names(spec)
        lines.append(balance.describe_weights(setting, weights, names))
    return "; ".join(lines)


def describe(data, spec: data_spec.DataSpec, reading: memory.Decision) -> str:
    """The start line's words on the input: where crops are resized, how the train split is
    read (``reading``: ``memory.decide``'s decision), the augmentation and the DCT-scaled
    decode, if any."""
    policy = augment.describe(data)
    scaled = "" if reading.use else dct.describe(data, spec.train_sides, train=True)
    return (
        f"data {spec.data_dir or 'synthetic'}, crops resized on the {data.resize_on}, "
        f"{reading.reason}"
        + (f", augmentation: {policy}" if policy else "")
        + (f", {scaled}" if scaled else "")
    )


def _then(first, second):
    """``second`` after ``first`` (None: nothing to do first)."""
    return second if first is None else lambda batch: second(first(batch))


def step_fns(data, num_classes: int) -> tuple:
    """(prepare, unpack): what the TrainStep does to the batches of the layout the train
    pipeline makes under ``data`` (a config.DataConfig), ``TrainStep``'s arguments."""
    layout = pipeline.train_layout(data)
    unpack = None
    if layout == "packed":  # resized first, outside XLA; then the "uint8" path on floats
        unpack = lambda batch: device_ops.resized(batch, data.image_size)  # noqa: E731
        layout = "uint8"
    if layout == "uint8" and augment.num_slots(data) + data.random_erasing > 0:
        unpack = _then(unpack, device_ops.augmented)  # outside XLA too, see augmented
    return device_ops.make_batch_fn(layout, num_classes, data), unpack


def serving(data, spec: data_spec.DataSpec) -> dict:
    """The serving signatures' keyword arguments (``serving.export_model``): the class names,
    and evaluation's preprocessing as evaluation resolves it for this data (``dct.resolved``),
    so that classify_bytes is exactly evaluation's."""
    return dict(
        class_names=data_spec.class_names(spec),
        data=dct.resolved(data, spec.eval_sides, train=False),
    )
