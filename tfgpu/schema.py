"""The contracts that cross package boundaries: how a setting is declared (``setting``) and
found again by its flag name (``Setting``), the numbers several packages share (the ImageNet
mean and std), the batch layouts, the step's metrics, and how a tensorflow-datasets dataset's
image and label are found. The record format (feature names, info file, framing) is
``recordformat.py``.

No TensorFlow here: ``config/`` and the converter import this module before TensorFlow starts.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypedDict

from tfgpu.errors import ConfigError

Tensor = Any  # a tf.Tensor; this module must not import TensorFlow


# --- settings: how config/ and each package's section declare a flag ---------------------------
# config/ declares every setting with these; config/flags.py turns each into an absl flag.


def positive(section, *names: str) -> None:
    """Raises a ConfigError for the first of ``names`` (fields of ``section``) not above 0."""
    for name in names:
        if getattr(section, name) <= 0:
            raise ConfigError(f"--{name}={getattr(section, name)} must be positive")


def setting(default, help: str, *, choices=(), flag: str = "", per_node: bool = False):  # noqa: A002
    """A Config field: its default, its ``--help`` text, the values it may take (checked once,
    by ``validate``), its flag name when that is not the field's name, and whether it may
    differ between the machines of one run (paths, thread counts: ``per_node``)."""
    meta = {"help": help, "choices": tuple(choices), "flag": flag, "per_node": per_node}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Setting:
    """Where one flag lives in Config: ``section`` (None: the run itself) and ``field``."""

    flag: str
    section: str | None
    field: str
    default: object
    help: str
    choices: tuple
    per_node: bool

    def get(self, config):
        owner = getattr(config, self.section) if self.section else config
        return getattr(owner, self.field)


def collect(config_class, sections: dict) -> dict:
    """{flag name: Setting} of ``config_class``'s own fields and of its ``sections``
    ({field name: section class})."""
    out = {}
    owners = [(None, config_class), *sections.items()]
    for section, cls in owners:
        for f in dataclasses.fields(cls):
            if "help" not in f.metadata:
                continue  # a section itself
            flag = f.metadata["flag"] or f.name
            meta = f.metadata
            out[flag] = Setting(
                flag, section, f.name, f.default, meta["help"], meta["choices"], meta["per_node"]
            )
    return out


def replace_settings(config, changes):
    """A copy of ``config`` with each (Setting, value) of ``changes`` applied."""
    by_section: dict = {}
    for s, value in changes:
        by_section.setdefault(s.section, {})[s.field] = value
    top = by_section.pop(None, {})
    for section, fields in by_section.items():
        top[section] = dataclasses.replace(getattr(config, section), **fields)
    return dataclasses.replace(config, **top)


# --- numbers several packages share, defined once ----------------------------------------------

# ImageNet's per-channel mean and standard deviation (RGB), on images scaled to [0, 1]: what
# keras.applications' models normalize by, and so tfgpu's own nets and augmentation fills.
IMAGENET_MEAN_UNIT = (0.485, 0.456, 0.406)
IMAGENET_STD_UNIT = (0.229, 0.224, 0.225)
# The same on uint8 pixel values (0-255), as the models receive them.
IMAGENET_MEAN = tuple(m * 255 for m in IMAGENET_MEAN_UNIT)
IMAGENET_STD = tuple(s * 255 for s in IMAGENET_STD_UNIT)
IMAGENET_VAR = tuple(s * s for s in IMAGENET_STD)


# --- batches: what the input pipeline hands the step -----------------------------------------
# The train pipeline produces exactly one of the three train layouts, chosen by the config
# (``data.pipeline.train_layout``): consumers never guess the layout from the keys present.


class MixDraws(TypedDict):
    """Each example's MixUp/CutMix draw (present only with --mixup_alpha or --cutmix_alpha)."""

    mix_lam: Tensor  # float32 [N]: the share of the example's own image
    cut_box: Tensor  # int32 [N, 4]: y0, x0, y1, x1 pasted from the partner (CutMix)
    use_cut: Tensor  # bool [N]: CutMix (else MixUp)


class AugmentDraws(TypedDict):
    """Each example's policy ops (present only with --augment_policy), L = ops per image."""

    op: Tensor  # int32 [N, L]: augment_ops.IDS, applied in order (0: the identity)
    arg: Tensor  # float32 [N, L]: each op's argument (degrees, bits, factor, ...)


class EraseDraws(TypedDict):
    """Each example's random-erasing draw (present only with --random_erasing)."""

    box: Tensor  # int32 [N, 4]: y0, x0, y1, x1 (empty: not erased)
    seed: Tensor  # int64 [N, 2]: the stateless seed of the box's noise


class TrainBatch(TypedDict, total=False):
    """Layout "uint8": crops resized on the host; the float work runs in the step."""

    image: Tensor  # uint8 [N, S, S, 3]
    label: Tensor  # int32 [N]
    flip: Tensor  # bool [N]
    weight: Tensor  # float32 [N]: 0 for a broken image (no loss, no gradient)
    mix: MixDraws
    augment: AugmentDraws
    erase: EraseDraws


class PackedTrainBatch(TypedDict, total=False):
    """Layout "packed" (--resize_on=device): un-resized crops packed end to end."""

    pixels: Tensor  # int64 [words]: the crops' RGB pixels, 8 pixels to 3 words, one after another
    sizes: Tensor  # int32 [N, 2]: each crop's (height, width)
    label: Tensor
    flip: Tensor
    weight: Tensor
    mix: MixDraws
    augment: AugmentDraws
    erase: EraseDraws


class FloatTrainBatch(TypedDict):
    """Layout "float" (--preprocess_on=host): the float work already done in tf.data."""

    image: Tensor  # float32 [N, S, S, 3] in [0, 255]
    target: Tensor  # float32 [N, K]: soft targets (all zero for a broken image)
    weight: Tensor


class EvalBatch(TypedDict):
    """Evaluation: center crops resized on the host; weight 0 pads the last batch."""

    image: Tensor  # uint8 [N, S, S, 3]
    label: Tensor
    weight: Tensor


TRAIN_LAYOUTS = ("uint8", "packed", "float")


# --- metrics: what the step and evaluation return ----------------------------------------------


class StepMetrics(TypedDict):
    """One update's sums over the global batch."""

    loss: Tensor  # summed cross-entropy / global batch (so it is the batch mean)
    correct: Tensor  # examples whose arg-max is the (hard) label
    count: Tensor  # examples
    skipped: Tensor  # examples with a broken image (weight 0)
    grad_norm: Tensor  # global norm of the all-reduced gradients, before clipping
    clipped: Tensor  # 1 when --clip_norm clipped this update, else 0


class EvalSums(TypedDict):
    """Sums over the examples of the evaluation batches seen."""

    loss: Tensor  # over the examples with finite logits
    top1: Tensor  # an example with non-finite logits is wrong for top-1 and top-5
    top5: Tensor
    count: Tensor
    non_finite: Tensor  # examples whose logits are not all finite


STEP_METRICS = tuple(StepMetrics.__annotations__)
EVAL_SUMS = tuple(EvalSums.__annotations__)


def tfds_keys(info) -> tuple[str, str]:
    """The (image, label) feature names of a tensorflow-datasets dataset, given its
    ``DatasetInfo``: its ``supervised_keys`` when they name an Image and a ClassLabel, else
    the first Image and the first ClassLabel feature. The converter and the trainer both
    choose with this, so they read a dataset the same way. Raises ValueError when the
    dataset has no such pair."""
    import tensorflow_datasets as tfds  # only for tfds datasets

    features = info.features
    is_image = lambda k: isinstance(features[k], tfds.features.Image)  # noqa: E731
    is_label = lambda k: isinstance(features[k], tfds.features.ClassLabel)  # noqa: E731
    supervised = tuple(info.supervised_keys or ())
    if len(supervised) == 2 and all(k in features for k in supervised):
        if is_image(supervised[0]) and is_label(supervised[1]):
            return supervised
    image = next((k for k in features if is_image(k)), None)
    label = next((k for k in features if is_label(k)), None)
    if image is None or label is None:
        raise ValueError("it has no Image and ClassLabel features")
    return image, label
