"""What a training run asks of data/, in one place, so that the trainer (train/loop.py)
calls this module instead of one of data/'s modules for each question:

  load          the dataset's spec and the class weights the loss uses (and whether a
                resumed run's data is what it recorded: ``record``)
  prepare       the rest, worked out once and handed over as plain values (``RunInput``):
                the class-balance line (and the check balanced sampling needs), the start
                line's words on the input, whether the train split is read from memory, what
                the train step does to the train pipeline's batches (``step_fns``), and what
                the export's serving signatures need (``serving``)

The readers themselves are chosen in ``readers.train_maker``.
"""

import enum
from dataclasses import dataclass

import numpy as np

from tfgpu.data import augment, balance, device_ops, dct, identity, memory, pipeline
from tfgpu.data import spec as data_spec
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

    spec: data_spec.DataSpec
    class_weights: np.ndarray | None  # float64 [K] for the loss, or None
    balance_line: str  # the start-up line on class balance ("": neither)
    words: str  # the start line's words on the input (``describe``)
    in_memory: bool  # the train split read from memory (decided at the final size)
    step_fns: tuple  # (prepare, unpack): what the train step does to the train batches
    serving: dict  # the export's serving signatures' keyword arguments (``serving``)


def prepare(data, setting: str, spec: data_spec.DataSpec, weights=READ) -> RunInput:
    """The ``RunInput`` of a run on ``spec`` under ``data`` (a config.DataConfig), whose loss
    takes the class ``weights`` (float64 [K] or None; READ: read --class_weights=``setting``
    now). Raises ConfigError for balanced sampling the split's path cannot do, or a
    --class_weights file that does not fit."""
    weights = class_weights(setting, spec) if weights is READ else weights
    reading = memory.decide(spec, data)
    return RunInput(
        spec=spec,
        class_weights=weights,
        balance_line=class_balance(data, setting, spec, weights),
        words=describe(data, spec, reading),
        in_memory=reading.use,
        step_fns=step_fns(data, spec.num_classes),
        serving=serving(data, spec),
    )


def record(model_dir: str, spec: data_spec.DataSpec) -> None:
    """Records the data of ``spec`` with the run in ``model_dir`` (the chief, at its start),
    for ``load`` to compare when it resumes (``identity.record``)."""
    identity.record(model_dir, spec)


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
