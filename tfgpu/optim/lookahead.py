"""Lookahead (Zhang et al. 2019), as airbench schedules it: every k updates the slow weights
move toward the trained ("fast") ones, and the fast weights restart from them.

After update t (t a multiple of k, or the last update of the run):

    slow <- slow + (1 - d_t) (fast - slow);  fast <- slow,   d_t = decay^k * (t / T)^3

so early in training (d_t ~ 0) the slow weights just follow, and toward the end they average
over the last few hundred updates (airbench: decay 0.95, k = 5). The run ends on the slow
weights. BatchNorm's moving statistics go the same way as the weights (airbench's state
dict holds them); a fast BatchNorm momentum (airbench's 0.6) goes with it.

Keras optimizers have no hook for it; ``with_lookahead`` re-classes an optimizer (each of a
``GroupedOptimizer``'s) so that ``apply`` ends with this step. The slow weights are optimizer
variables, so checkpoints hold them and a resumed run goes on exactly; they start as the
weights before the first update. The step runs in each replica after the all-reduced update,
on values equal in every replica, so replicas stay equal.
"""

import tensorflow as tf

RAMP_POWER = 3  # d_t's growth with progress: airbench's


class _LookaheadMixin:
    """Keras optimizer + lookahead (module docstring); its settings in ``_tfgpu_lookahead``."""

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        state = self._tfgpu_lookahead
        state["variables"] = list(variables) + state["extra"]
        # Added last: the optimizer's other checkpointed variables keep their places.
        state["slow"] = self.add_optimizer_variables(state["variables"], "slow")

    def apply(self, grads, trainable_variables=None):
        state = self._tfgpu_lookahead
        pairs = list(zip(state["variables"], state["slow"]))
        tf.cond(self.iterations == 0, lambda: _assign_all(pairs, to_slow=True), tf.no_op)
        super().apply(grads, trainable_variables)
        t = tf.cast(self.iterations, tf.float64)  # updates done, this one counted
        total = float(state["total_steps"])
        due = tf.logical_or(tf.math.floormod(self.iterations, state["every"]) == 0, t >= total)
        pull = state["decay"] ** state["every"] * tf.minimum(t / total, 1.0) ** RAMP_POWER
        tf.cond(due, lambda: _sync(pairs, pull), tf.no_op)


def _assign_all(pairs, to_slow: bool):
    for fast, slow in pairs:
        (slow if to_slow else fast).assign(fast if to_slow else slow)
    return tf.no_op()


def _sync(pairs, pull):
    """slow <- pull * slow + (1 - pull) * fast; fast <- slow."""
    for fast, slow in pairs:
        d = tf.cast(pull, slow.dtype)
        moved = d * slow + (1 - d) * tf.cast(fast, slow.dtype)
        slow.assign(moved)
        fast.assign(tf.cast(moved, fast.dtype))
    return tf.no_op()


def with_lookahead(optimizer, *, every: int, decay: float, total_steps: int, extra=()):
    """Re-classes the Keras ``optimizer`` (not built yet) so that every ``every`` updates its
    variables (and ``extra`` ones: BatchNorm's moving statistics) take a lookahead step with
    ``decay`` over a run of ``total_steps`` updates (module docstring). Returns it."""
    cls = type(optimizer)
    optimizer.__class__ = type(cls.__name__, (_LookaheadMixin, cls), {})
    state = dict(every=int(every), decay=float(decay), total_steps=int(total_steps))
    # Set past Keras' attribute tracking: the slow weights are tracked as optimizer variables.
    object.__setattr__(optimizer, "_tfgpu_lookahead", dict(state, extra=list(extra)))
    return optimizer


def describe(every: int, decay: float) -> str:
    """The start-up line of --lookahead_steps."""
    return (
        f"lookahead: every {every} updates the slow weights move toward the trained ones "
        f"(decay {decay:g}^{every}, ramped by progress^{RAMP_POWER}) and training restarts "
        "from them; BatchNorm's moving statistics too"
    )
