"""data/'s one door for a training run: the trainer (``train/``) calls this module and
nothing else of data/. ``prepare`` takes the run's data settings once and gives back a
``RunInput``, which the run's later uses read without settings:

  prepare        the dataset's spec (and whether a resumed run's data is what it recorded),
                 the class weights the loss uses, and the rest worked out once as plain
                 values: the start-up lines (class balance, repeated augmentation), the start
                 line's words on the input, whether the train split is read from memory,
                 what the train step does to the train pipeline's batches (``step_fns``),
                 what the export's serving signatures need (``serving``), how the train
                 stream is cut (``Stream``), what the run records of its data (``recorded``)
  scratch_copy   the input of the micro-batch search's scratch copy of the run and its
                 batches: synthetic, of the run's shape
  train_batches  the train batches from an update on (the reader: ``readers.train_maker``),
                 distributed by the backend, the step's functions for them (a progressive
                 stage's: ``stage_data``) and the input's own speed (``readers.probe``)
  first_images   the first training images, for a layer initialised from the data
                 (``sample``: a whitening layer)
  forget_broken, broken_found   the records that failed to decode (``broken``)
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from tfgpu.data import augment, balance, broken, device_ops, dct, identity, memory, pipeline
from tfgpu.data import readers, sample, sampling
from tfgpu.data import spec as data_spec
from tfgpu.data.stream import Stream
from tfgpu.errors import ConfigError


@dataclass(frozen=True)
class RunInput:
    """What a training run takes from data/, worked out once (``prepare``): plain values the
    trainer hands on, and what the train batches are read by (``train_batches``)."""

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
    recorded: dict = dataclasses.field(default_factory=dict)  # {file: JSON} for --model_dir

    @property
    def fingerprint(self) -> tuple:
        """(the spec's summary, the class weights as a list or None): what every worker of
        the run must hold alike (``consensus.fingerprint``)."""
        weights = self.class_weights
        return self.spec.summary(), None if weights is None else weights.tolist()


def prepare(
    data,
    class_weights_setting: str,
    *,
    batch_size: int = 1,
    global_batch_size: int = 1,
    seed: int = 0,
    deterministic: bool = False,
    repeats: int = 1,
    model_dir: str = "",
    is_chief: bool = True,
) -> RunInput:
    """data/'s door for a training run: the ``RunInput`` of a run under ``data`` (a
    config.DataConfig) whose loss takes --class_weights=``class_weights_setting``, whose train
    stream (``Stream``) cuts ``batch_size`` per replica of ``global_batch_size`` per update,
    drawn from ``seed`` (``deterministic``: one global order), each example ``repeats`` times
    (--repeated_augment). ``model_dir``: the run's, which a resumed run's data is compared
    with (``identity.check``) and where the chief (``is_chief``) records it (``recorded``,
    written by the run's writer). Raises DataError or ConfigError naming the file or flag:
    data that cannot be read, other data than a resumed run recorded, a --class_weights file
    that does not fit, balanced sampling the split's path cannot do."""
    spec = data_spec.load_spec(data)
    if model_dir:
        identity.check(model_dir, spec)
    stream = Stream(batch_size, global_batch_size, seed, deterministic, repeats=repeats)
    reading = memory.decide(spec, data)
    sampled = class_balance(data, spec)
    repeated = sampling.describe(repeats, spec.num_train, global_batch_size)
    names = data_spec.class_names(spec)
    words = describe(data, spec, reading)
    fns, served = step_fns(data, spec.num_classes), serving(data, spec)
    recorded = identity.to_record(model_dir, spec) if model_dir and is_chief else {}
    # Last, once the data's own files are read: the loss' class weights, from the user's
    # --class_weights file (or the data's counts), and their words.
    weights, weighted = balance.described_weights(class_weights_setting, spec.data_dir, names)
    balanced = "; ".join(line for line in (sampled, weighted) if line)
    return RunInput(
        data=data,
        spec=spec,
        class_weights=weights,
        lines="\n".join(line for line in (balanced, repeated) if line),
        words=words,
        in_memory=reading.use,
        step_fns=fns,
        serving=served,
        stream=stream,
        model_dir=model_dir,
        is_chief=is_chief,
        recorded=recorded,
    )


def scratch_copy(inputs: RunInput, backend, batch_size: int) -> tuple:
    """(the input of a scratch copy of the run of ``inputs``, the micro-batch search's: one
    replica's batches of ``batch_size``, synthetic, of the run's shape and classes, prepared
    on the device, with nothing recorded or served; its train batches on ``backend``)."""
    data = dataclasses.replace(
        inputs.data,
        synthetic_data=True,
        preprocess_on="device",
        resize_on="host",
        balanced_sampling=False,
    )
    stream = dataclasses.replace(inputs.stream, batch_size=batch_size, global_batch_size=batch_size)
    fns = step_fns(data, inputs.spec.num_classes)
    scratch = dataclasses.replace(
        inputs, data=data, step_fns=fns, stream=stream, model_dir="", recorded={}
    )
    batches, _, _ = train_batches(scratch, backend, 0)
    return scratch, batches


def train_batches(
    inputs: RunInput, backend, start_step: int, stage=None, probe_s: float = 0.0
) -> tuple:
    """(an iterator of the train batches of ``inputs`` from update ``start_step`` on,
    distributed over the replicas of ``backend``; the (prepare, unpack) the train step takes
    them with; the images/s of this worker's input alone: ``readers.probe``, a fresh pipeline
    read for ``probe_s`` seconds first, None when off or not measurable). ``stage``: a
    progressive stage's values (``stage_data``), None: the run's own settings."""
    data = inputs.data if stage is None else stage_data(inputs, stage)
    make = train_maker(inputs, start_step, data)
    shard, batch = backend.input_shard, inputs.stream.batch_size
    input_ips = readers.probe(make, shard, data, batch, probe_s)
    fns = inputs.step_fns if stage is None else step_fns(data, inputs.spec.num_classes)
    return iter(backend.distribute_dataset(make)), fns, input_ips


def stage_data(inputs: RunInput, stage):
    """The DataConfig a progressive ``stage`` (its image_size, magnitude, mixup_alpha and
    cutmix_alpha) reads and is prepared by: the run's, at the stage's values, on the train
    split's path decided once at the final size (a smaller stage must not change the path,
    which draws differently)."""
    return dataclasses.replace(
        inputs.data,
        image_size=stage.image_size,
        randaugment_magnitude=stage.magnitude,
        mixup_alpha=stage.mixup_alpha,
        cutmix_alpha=stage.cutmix_alpha,
        in_memory="on" if inputs.in_memory else "off",
    )


def train_maker(inputs: RunInput, start_step: int, data=None):
    """``make(InputShard) -> tf.data.Dataset``: the per-replica train batches of ``inputs``
    from update ``start_step`` on (``readers.train_maker``; ``data``: the DataConfig to read
    by, a progressive stage's; None: the run's)."""
    stream = inputs.stream
    stream = dataclasses.replace(stream, start_index=start_step * stream.global_batch_size)
    where = dict(model_dir=inputs.model_dir, is_chief=inputs.is_chief)
    return readers.train_maker(inputs.spec, data or inputs.data, stream, **where)


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


def class_balance(data, spec: data_spec.DataSpec) -> str:
    """The start-up line's words on --balanced_sampling ("" when off; the class weights' are
    ``balance.described_weights``'). Balanced sampling that the split's path cannot do is a
    ConfigError naming why."""
    if not data.balanced_sampling:
        return ""
    decision = memory.decide(spec, data)
    if not decision.use:  # the streaming reader has no random access by class
        raise ConfigError(
            "--balanced_sampling needs the train split in memory (--in_memory; docs/data.md: "
            f"Class balance), and here: {decision.reason}"
        )
    return balance.describe_sampling(data.sampling_power)


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
