"""Checkpoints of a run: what they hold, where they go, how a run resumes from them.

They hold the model, the optimizer (with its EMA), the step, the loss scale and the counters;
the input position follows from the step (every random choice is a function of seed, epoch
and position), so a resumed ``--deterministic`` run ends with the weights of an uninterrupted
one. Only the chief writes to ``--model_dir/checkpoints``; the others take part in each save
(reading sync-on-read variables is collective) into a scratch directory.
"""

import os
import sys

import tensorflow as tf

from tfgpu.faults import CheckpointError


class Checkpoints:
    """Saves and restores ``tracked`` (name -> trackable) for one run."""

    def __init__(self, tracked: dict, backend, model_dir: str, keep: int):
        self.directory = os.path.join(model_dir, "checkpoints")
        self.checkpoint = tf.train.Checkpoint(**tracked)
        self._step = tracked["step"]
        self._manager = tf.train.CheckpointManager(
            self.checkpoint, backend.checkpoint_dir(self.directory), keep
        )

    def restore(self, log) -> int:
        """Restores the newest checkpoint of --model_dir, if any; returns the step reached.
        ``log(line)`` says what was restored."""
        latest = tf.train.latest_checkpoint(self.directory)
        if latest:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
            log(f"resumed from {latest} at step {int(self._step.numpy())}")
        return int(self._step.numpy())

    def save(self, final: bool = False) -> None:
        """Writes a checkpoint. A failed write (disk full, ...) is reported loudly; training
        goes on with the previous checkpoint kept, except at the end, where it is an error."""
        try:
            self._manager.save(checkpoint_number=self._step)
        except (tf.errors.OpError, OSError) as err:
            message = f"checkpoint at step {int(self._step.numpy())} failed: {err}"
            if final:
                raise CheckpointError(message) from None
            print(
                f"tfgpu: WARNING: {message}; the previous checkpoint is kept",
                file=sys.stderr,
                flush=True,
            )
