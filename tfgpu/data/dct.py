"""``--dct_scaled_decode=auto``: whether a run's crop windows are worth the per-example choice
of a DCT scale, decided once per run from the stored images' sizes.

libjpeg can decode a window at 1/2, 1/4 or 1/8 scale, which pays only for windows at least
2x the output on both sides. Choosing per example costs a comparison and a branch on every
example (0-5% of the host CPU per image where no window qualifies, bench/README.md); so
``auto`` keeps that choice only where enough windows can qualify, estimated from the
converter's histogram of shorter sides (``short_sides`` in dataset_info.json), and is
exactly ``off`` elsewhere. Without the histogram (TF's ImageNet records, tfds, older
conversions) it stays per example.
"""

import dataclasses
import functools

import numpy as np

from tfgpu.data.recordformat import SIDE_STEP

# Share of windows >= 2x the output from which the choice pays for its cost on every example:
# on ~37 KB photos, with 52% of windows qualifying auto read 1.05x off's images/s at equal
# CPU per image, with 9.5% 0.98x at +2% CPU (bench/README.md).
MIN_SHARE = 0.5
_DRAWS = 512  # windows drawn per histogram bucket for the estimate
_ATTEMPTS = 10  # as host_ops.random_crop_window


def train_window_share(sides: dict, min_side: int, min_area: float) -> float:
    """The estimated share of training crop windows (``host_ops.random_crop_window``'s
    sampler) at least ``2 * min_side`` on both sides, for images whose shorter sides are
    counted in ``sides`` {bucket edge: count} (longer sides taken as 4/3 of them)."""
    return _train_share(tuple(sorted(sides.items())), min_side, min_area)


# Every input pipeline a run builds (one per worker, the input probe's, each epoch's on a
# tf.data service) asks again; the estimate takes ~50 ms on an ImageNet-wide histogram.
@functools.lru_cache(maxsize=8)
def _train_share(sides: tuple, min_side: int, min_area: float) -> float:
    """``train_window_share`` of ``sides`` as sorted (edge, count) pairs (hashable)."""
    rng = np.random.default_rng(0)
    hits = total = 0
    for edge, count in sides:
        short = int(edge) + SIDE_STEP // 2  # a bucket's middle
        windows = _sample_windows(rng, short, round(short * 4 / 3), min_area)
        hits += count * np.mean(windows.min(1) >= 2 * min_side)
        total += count
    return float(hits / max(total, 1))


def _sample_windows(rng, height: int, width: int, min_area: float) -> np.ndarray:
    """[_DRAWS, 2] (h, w) windows as TensorFlow's SampleDistortedBoundingBox draws them:
    an aspect ratio in [3/4, 4/3], a height uniform between those of the smallest and the
    largest area, up to 10 attempts, else the whole image."""
    area = height * width
    out = np.tile([height, width], (_DRAWS, 1))
    done = np.zeros(_DRAWS, bool)
    for _ in range(_ATTEMPTS):
        aspect = rng.uniform(3 / 4, 4 / 3, _DRAWS)
        low = np.rint(np.sqrt(min_area * area / aspect))
        high = np.minimum(np.rint(np.sqrt(area / aspect)), np.minimum(height, width / aspect))
        h = np.floor(low + rng.random(_DRAWS) * np.maximum(high - low + 1, 1))
        w = np.rint(h * aspect)
        ok = ~done & (h <= height) & (w <= width) & (h * w >= max(min_area, 0.1) * area)
        out[ok] = np.stack([h, w], 1)[ok]
        done |= ok
    return out


def eval_window_share(sides: dict, min_side: int, crop_fraction: float) -> float:
    """The share of evaluation center crops (``crop_fraction`` of the shorter side) at least
    ``2 * min_side``."""
    counts = {int(edge): count for edge, count in sides.items()}
    hits = sum(c for e, c in counts.items() if int(crop_fraction * e) >= 2 * min_side)
    return hits / max(sum(counts.values()), 1)


def share(sides, data, train: bool):
    """The share of ``train`` (else evaluation) crop windows of ``data`` (a DataConfig) >= 2x
    ``--image_size`` on both sides, for images whose shorter sides ``sides`` counts (None:
    not known, then None)."""
    if sides is None:
        return None
    if train:
        return train_window_share(sides, data.image_size, data.crop_min_area)
    return eval_window_share(sides, data.image_size, data.eval_crop_fraction)


def _decision(data, sides, train: bool) -> tuple:
    """(what "auto" becomes: "auto" to choose per example or "off", the ``share`` it
    followed, None when not known)."""
    fraction = share(sides, data, train)
    keep = fraction is None or fraction >= MIN_SHARE
    return ("auto" if keep else "off"), fraction


def resolved(data, sides, train: bool):
    """``data`` with ``--dct_scaled_decode=auto`` made "off" where ``share`` is known and
    under ``MIN_SHARE``; as it is otherwise ("auto" then chooses per example)."""
    if data.dct_scaled_decode != "auto" or _decision(data, sides, train)[0] == "auto":
        return data
    return dataclasses.replace(data, dct_scaled_decode="off")


def describe(data, sides, train: bool) -> str:
    """What ``--dct_scaled_decode=auto`` does on the ``train`` (else evaluation) split, and
    why, for the run's start line; "" for the other modes."""
    if data.dct_scaled_decode != "auto":
        return ""
    mode, fraction = _decision(data, sides, train)
    if fraction is None:
        return "DCT-scaled decode chosen per example (image sizes not stored)"
    verdict = "per example" if mode == "auto" else "off"
    return (
        f"DCT-scaled decode {verdict} ({fraction:.0%} of crop windows >= 2x the output, "
        f"pays from {MIN_SHARE:.0%})"
    )
