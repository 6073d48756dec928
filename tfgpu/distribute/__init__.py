"""How training is spread: the only package that knows strategies, TF_CONFIG, ranks and Horovod.

  env.py        what the environment says (TF_CONFIG, horovodrun's variables); no TensorFlow
  backends.py   one backend per strategy, all with the same few verbs (see its docstring)

This file holds the choices ``config.py`` checks before TensorFlow starts, and the names
shared by the modules above; it imports nothing heavy.
"""

from dataclasses import dataclass

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker_mirrored", "horovod")
ALL_REDUCE_ALGS = ("auto", "nccl", "hierarchical_copy", "reduce_to_one")
COMMUNICATIONS = ("auto", "ring", "nccl")
HVD_COMPRESSIONS = ("none", "fp16")


class DistributeError(ValueError):
    """A strategy that cannot be set up in this environment; the message is one line."""


@dataclass(frozen=True)
class InputShard:
    """Which slice of the data one input pipeline reads: pipeline ``index`` of ``count``."""

    count: int
    index: int
