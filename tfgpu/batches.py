"""The batches the input pipeline hands the step. The train pipeline produces exactly one of the
three train layouts (``TRAIN_LAYOUTS``), chosen by the config (``data.pipeline.train_layout``):
consumers never guess the layout from the keys present. Layout "float" (--preprocess_on=host)
is the "uint8" batch's float work done in tf.data: ``image`` float32 in [0, 255], ``target``
float32 [N, K] soft targets (all zero for a broken image) and ``weight``.

No TensorFlow here: the types name tensors as ``Tensor``.
"""

from typing import Any, TypedDict

Tensor = Any  # a tf.Tensor; this module must not import TensorFlow


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


class EvalBatch(TypedDict):
    """Evaluation: center crops resized on the host; weight 0 pads the last batch."""

    image: Tensor  # uint8 [N, S, S, 3]
    label: Tensor
    weight: Tensor


TRAIN_LAYOUTS = ("uint8", "packed", "float")
