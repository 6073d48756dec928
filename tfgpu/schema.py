"""The named shapes that cross module boundaries: the batch layouts, the step's metrics, and
how a tensorflow-datasets dataset's image and label are found. The record format (feature
names, info file, framing) is ``recordformat.py``.

No TensorFlow here: ``config.py`` and the converter import this module before TensorFlow starts.
"""

from typing import Any, TypedDict

Tensor = Any  # a tf.Tensor; this module must not import TensorFlow


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
