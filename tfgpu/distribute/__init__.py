"""How training is spread: the only package that knows strategies, TF_CONFIG, Slurm and Horovod.

  config.py      its settings (``config.dist``); no TensorFlow
  env.py         what the environment says (TF_CONFIG, horovodrun's, Slurm's variables)
  slurm.py       Slurm's host lists and task layout, read without Slurm's tools
  devices.py     what a process sees: logical CPUs, GPU memory growth, a rank's or task's GPUs
  backends.py    one backend per strategy, all with the same few verbs (see its docstring)
  consensus.py   what the workers agree on at start-up, and step-time skew
  heartbeats.py  the UDP side channel and stall watchdog that name a stuck worker
  failures.py    a lost worker's error, in one line naming it
  hvdrun.py      tfgpu-horovodrun: horovodrun with one line instead of its traceback

This file holds the choices ``config.py`` checks before TensorFlow starts, and the names
shared by the modules above; it imports nothing heavy.
"""

from dataclasses import dataclass

from tfgpu.errors import DistributeError  # noqa: F401  (what distribute's modules raise)

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker_mirrored", "horovod")
ALL_REDUCE_ALGS = ("auto", "nccl", "hierarchical_copy", "reduce_to_one")
COMMUNICATIONS = ("auto", "ring", "nccl")
HVD_COMPRESSIONS = ("none", "fp16")


@dataclass(frozen=True)
class InputShard:
    """Which slice of the data one input pipeline reads: pipeline ``index`` of ``count``."""

    count: int
    index: int
