"""Class balance: the per-class loss weights of ``--class_weights`` and the class
probabilities of ``--balanced_sampling`` / ``--sampling_power``. Numpy and JSON only.

Weights (``class_weights``) are a vector w [K] the step applies per example
(``TrainStep``'s ``class_weights``): an example's cross-entropy counts class c's share of its
target with weight w_c, i.e. sum_c w_c t_c (-log p_c) (PyTorch's ``CrossEntropyLoss(weight=)``
with probability targets). A hard label y weighs w_y; a MixUp/CutMix target lam e_a +
(1 - lam) e_b weighs lam w_a + (1 - lam) w_b in all, the mixed target's expected class weight.
The sum over the batch is still divided by the global batch size, not by the summed weights,
so every example's term is fixed before any split: replicas and accumulation add up to one
large batch exactly. ``auto`` is normalized so that the mean weight over the training
examples is 1, which keeps the loss (and the learning rate that suits it) on its scale.

Sampling (``sampling_probabilities``, used by ``sampling.py``): class c is drawn with
probability proportional to n_c^(1 - power), n_c its train examples: power 1 gives every
class the same share, 0 the natural frequencies.
"""

import math
import os
import re

import numpy as np

from tfgpu.data.dataset_info import read_info
from tfgpu.errors import ConfigError
from tfgpu.files import read_json
from tfgpu.data.recordformat import INFO_FILE


_INDEX = re.compile(r"\s*[0-9]{1,18}\s*")  # a class index as a key (ASCII digits: int() takes it)


def train_class_counts(data_dir: str, num_classes: int) -> np.ndarray | None:
    """int64 [num_classes]: the train split's examples per class as ``data_dir``'s
    dataset_info.json lists them (``splits.train.per_class``, by class name, in the order of
    ``class_names``); None when it holds no such counts (no info file, or one another tool
    wrote without them)."""
    info = read_info(data_dir) if data_dir and os.path.isdir(data_dir) else {}
    per_class = info.get("splits", {}).get("train", {}).get("per_class")
    names = info.get("class_names", [])
    if not isinstance(per_class, dict) or len(names) != num_classes:
        return None
    if any(name not in per_class for name in names):
        return None
    return np.array([int(per_class[name]) for name in names], np.int64)


def inverse_frequency(counts: np.ndarray) -> np.ndarray:
    """float64 [K] weights N / (K' n_c) of classes with n_c > 0 examples (N examples, K' such
    classes): inversely proportional to frequency, with a mean of 1 over the N examples
    (sum_c n_c w_c = N). A class without examples gets 1 (no example carries it)."""
    n = np.asarray(counts, np.float64)
    present = n > 0
    weights = np.ones_like(n)
    weights[present] = n.sum() / (present.sum() * n[present])
    return weights


def weights_from_file(path: str, class_names: list[str]) -> np.ndarray:
    """float64 [K] weights from a JSON object {class name or index: weight} in ``path``;
    classes not in it get 1. A key is a class name first, else a decimal index. Unknown
    classes, a class given twice, and weights that are not finite numbers >= 0 are a
    ConfigError naming the file."""
    flag = f"--class_weights={path}"
    if not os.path.isfile(os.path.expanduser(path)):
        raise ConfigError(f"{flag}: no such file")
    try:
        given = read_json(os.path.expanduser(path))
    except ValueError as err:
        raise ConfigError(f"{flag}: {err}") from None
    index = {name: i for i, name in enumerate(class_names)}
    weights = np.ones(len(class_names), np.float64)
    seen: dict[int, str] = {}
    for key, value in given.items():
        c = index.get(key)
        if c is None and _INDEX.fullmatch(key) and int(key) < len(class_names):
            c = int(key)
        if c is None:
            raise ConfigError(
                f"{flag}: {key!r} is not a class of the dataset (names or indices 0.."
                f"{len(class_names) - 1})"
            )
        if c in seen:
            raise ConfigError(f"{flag}: class {class_names[c]!r} is given twice ({seen[c]!r})")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0:
            raise ConfigError(
                f"{flag}: the weight of {key!r} is {value!r}, not a finite number >= 0"
            )
        seen[c], weights[c] = key, float(value)
    return weights


def auto_weights(data_dir: str, num_classes: int) -> np.ndarray:
    """--class_weights=auto's float64 [num_classes] weights for the dataset in ``data_dir``:
    ``inverse_frequency`` of its train split's per-class counts. An info file without the
    counts, or whose train split counts no examples, is a ConfigError naming it."""
    counts = train_class_counts(data_dir, num_classes)
    if counts is None:
        where = os.path.join(data_dir, INFO_FILE) if data_dir else "the dataset"
        raise ConfigError(
            f"--class_weights=auto needs the train split's per-class counts, which {where} "
            "does not hold (convert with tools/to_tfrecord.py again, or give "
            "--class_weights=FILE)"
        )
    if not counts.sum():
        raise ConfigError(f"--class_weights=auto: {data_dir}'s train split counts no examples")
    return inverse_frequency(counts)


def class_weights(setting: str, data_dir: str, class_names: list[str]) -> np.ndarray | None:
    """The weights --class_weights=``setting`` gives the dataset in ``data_dir`` (its
    ``class_names``): None when off, else float64 [K] (``auto_weights``, or
    ``weights_from_file``)."""
    if not setting:
        return None
    if setting == "auto":
        return auto_weights(data_dir, len(class_names))
    return weights_from_file(setting, class_names)


def described_weights(setting: str, data_dir: str, class_names: list[str]) -> tuple:
    """(``class_weights``' weights, the start-up line's words on them: "class weights (auto:
    inverse frequency, mean 1 over the train examples): 0.5 (a) to 3 (d); evaluation
    unweighted"); (None, "") when off."""
    weights = class_weights(setting, data_dir, class_names)
    if weights is None:
        return None, ""
    how = (
        "auto: inverse frequency, mean 1 over the train examples" if setting == "auto" else setting
    )
    low, high = int(np.argmin(weights)), int(np.argmax(weights))
    return weights, (
        f"class weights ({how}): {weights[low]:.3g} ({class_names[low]}) to "
        f"{weights[high]:.3g} ({class_names[high]}); evaluation unweighted"
    )


def sampling_probabilities(counts: np.ndarray, power: float) -> np.ndarray:
    """float64 [K] class probabilities of balanced sampling: proportional to n_c^(1 - power)
    for classes with n_c > 0 examples, 0 for the others."""
    n = np.asarray(counts, np.float64)
    present = n > 0
    p = np.zeros_like(n)
    p[present] = n[present] ** (1.0 - power)
    return p / p.sum()


def class_pools(labels: np.ndarray, weights: np.ndarray, num_classes: int) -> tuple:
    """(members int64 [M], starts int64 [K], counts int64 [K]): the indices of the usable
    examples (weight > 0: a broken image is never drawn) grouped by class, class c's at
    members[starts[c] : starts[c] + counts[c]], in index order."""
    usable = np.flatnonzero(np.asarray(weights) > 0)
    members = usable[np.argsort(np.asarray(labels)[usable], kind="stable")].astype(np.int64)
    counts = np.bincount(np.asarray(labels)[usable], minlength=num_classes).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return members, starts, counts


def cumulative(p: np.ndarray) -> np.ndarray:
    """float64 [K] cumulative probabilities for drawing a class by ``searchsorted(cdf, u,
    "right")`` with u in [0, 1): exactly 1 from the last class with p > 0 on, so rounding can
    never pick a class without examples."""
    cdf = np.cumsum(p)
    cdf[int(np.flatnonzero(p > 0)[-1]) :] = 1.0
    return cdf


def describe_sampling(power: float) -> str:
    """The start-up line's words: "balanced sampling (p(class) ~ n^(1 - 1): uniform over the
    classes; with replacement)"."""
    what = {1.0: "uniform over the classes", 0.0: "natural frequencies"}.get(
        float(power), f"n^{1 - power:g}"
    )
    return f"balanced sampling (p(class) ~ n^(1 - {power:g}): {what}; with replacement)"
