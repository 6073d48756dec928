"""Checkpoints of a run: what they hold, where they go, how a run resumes from them.

They hold the model, the optimizer (with its EMA), the step, the loss scale and the counters;
the input position follows from the step (every random choice is a function of seed, epoch
and position), so a resumed ``--deterministic`` run ends with the weights of an uninterrupted
one. Only the chief writes to ``--model_dir/checkpoints``; the others take part in each save
(reading sync-on-read variables is collective) into a scratch directory. So only the chief
restores, and every other worker takes its values: node-local disks need no shared copy.
"""

import os

import tensorflow as tf

from tfgpu.errors import CheckpointError, first_line, op_error_cause, warn
from tfgpu.files import pause_for_tests
from tfgpu.models.layers import refresh_derived_state


class Checkpoints:
    """Saves and restores ``tracked`` (name -> trackable) for one run. ``optional`` names the
    entries a checkpoint may lack, written by the same run before a flag added them (the best
    so far of --keep_best): they keep their initial values, and the restore says so."""

    def __init__(self, tracked: dict, backend, model_dir: str, keep: int, optional=()):
        self.directory = os.path.join(model_dir, "checkpoints")
        self.checkpoint = tf.train.Checkpoint(**tracked)
        self.tracked, self._optional = tracked, frozenset(optional)
        self._backend = backend
        self._model = tracked.get("model")  # None: no Keras model among them
        self._step = tracked["step"]
        self._variables = variables_of(tracked.values())
        self._manager = tf.train.CheckpointManager(
            self.checkpoint, backend.checkpoint_dir(self.directory), keep
        )

    def restore(self, log) -> int:
        """The chief restores the newest checkpoint of its --model_dir that reads back,
        passing over damaged ones with a warning naming each; then every worker takes the
        chief's values. Returns the step reached; ``log(line)`` says what was restored.
        Raises CheckpointError, on every worker, when the chief has checkpoints but none
        reads back."""
        failure = self._restore_newest(log) if self._backend.is_chief else ""
        failure = self._backend.all_gather_bytes(failure.encode())[0].decode()
        if failure:
            raise CheckpointError(failure)
        self._backend.broadcast_from_chief(self._variables)
        if self._model is not None:
            refresh_derived_state(self._model)
        return int(self._step.numpy())

    def _restore_newest(self, log) -> str:
        """Restores the newest readable checkpoint, if any; returns "" or why none could be."""
        state = tf.train.get_checkpoint_state(self.directory)
        paths = list(reversed(state.all_model_checkpoint_paths)) if state else []
        for path in paths:
            try:
                missing = self._restore(path)
            except DAMAGED as err:
                reason = first_line(err, 200)
                if readable(path):  # whole, but of another model: the older ones are too
                    return (
                        f"checkpoint {path} reads back but does not fit this run's model "
                        f"({reason}): it was written with other settings; start the run with "
                        "its own (--model_dir alone takes them from its config.json), or use "
                        "another --model_dir"
                    )
                warn(f"checkpoint {path} does not read back ({reason}); trying an older one")
                continue
            log(f"resumed from {path} at step {int(self._step.numpy())}")
            if missing:
                log(
                    f"  (it holds no {', '.join(missing)}: written before the flags that add "
                    "them; they start from this run)"
                )
            return ""
        if paths:
            return (
                f"no checkpoint in {self.directory} reads back (the newest, {paths[0]}, is "
                "damaged); move them away to start over"
            )
        return ""

    def _restore(self, path: str) -> list[str]:
        """Restores ``path``, every entry it must hold matched; returns the optional entries
        it lacks (restored from the others alone)."""
        missing = self._missing(path)
        checkpoint = self._without(missing) if missing else self.checkpoint
        checkpoint.restore(path).assert_existing_objects_matched()
        return missing

    def _missing(self, path: str) -> list[str]:
        """The optional entries checkpoint ``path`` does not hold."""
        present = {name.split("/")[0] for name, _ in tf.train.list_variables(path)}
        return sorted(name for name in self._optional if name not in present)

    def _without(self, missing: list[str]) -> tf.train.Checkpoint:
        """A checkpoint of every tracked entry but ``missing``."""
        return tf.train.Checkpoint(**{k: v for k, v in self.tracked.items() if k not in missing})

    def save(self, final: bool = False) -> None:
        """Writes a checkpoint. A failed write (disk full, ...) is reported loudly, in words:
        what failed, where, why, and which checkpoint is kept; training goes on with it,
        except at the end, where it is an error."""
        # The callback runs once the files are written, before the manager records them in
        # the index: the moment a kill must not turn into a damaged checkpoint.
        written = tf.train.CheckpointOptions(
            experimental_write_callbacks=[lambda: pause_for_tests("checkpoint")]
        )
        try:
            self._manager.save(checkpoint_number=self._step, options=written)
        except (tf.errors.OpError, OSError) as err:
            kept = self._manager.latest_checkpoint
            message = (
                f"checkpoint at step {int(self._step.numpy())} failed: writing it to "
                f"{self._manager.directory} failed ({op_error_cause(err)}); the newest complete "
                + (f"checkpoint, {os.path.basename(kept)}, is kept" if kept else "one: none yet")
            )
            if final:
                raise CheckpointError(message) from None
            warn(message)


def readable(path: str) -> bool:
    """True when every tensor of checkpoint ``path`` reads back from its files: a restore
    that fails then failed on what the checkpoint holds (another model), not on damage."""
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except DAMAGED:
        return False
    return True


# What a truncated or corrupted checkpoint raises while it is read (a truncated .data file:
# IndexError "Read less bytes than requested"; a broken index: DataLossError, an OpError).
DAMAGED = (tf.errors.OpError, IndexError, ValueError, OSError, AssertionError)


def variables_of(trackables) -> list:
    """The tf.Variables behind ``trackables`` (Keras models and optimizers, variables), in
    a fixed order, as a broadcast needs them (Keras 3 variables unwrapped)."""
    out = []
    for t in trackables:
        for v in [t] if isinstance(t, tf.Variable) else t.variables:
            out.append(v if isinstance(v, tf.Variable) else v.value)
    return out
