"""Every touch of a private Keras or TensorFlow name, in one place.

tfgpu needs a few things neither library exports. Each is wrapped here, and
``tests/test_compat.py`` asserts that every name in ``PRIVATE_NAMES`` still exists in the
installed versions, so an upgrade that renames one fails a test instead of, say, silently
reducing gradients twice. setup.cfg pins Keras and TensorFlow to the minor versions tested.
"""

import contextlib

# (module, attribute path) of every private name used below.
PRIVATE_NAMES = (
    ("keras.src.backend.tensorflow.optimizer", "TFOptimizer._all_reduce_sum_gradients"),
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer._trainable_variables"),
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer._model_variables_moving_average"),
    ("tensorflow.python.framework.config", "disable_op_determinism"),
)


class _OwnAllReduceMixin:
    """Keras' TF optimizer all-reduces gradients itself when applied inside a replica
    context (``TFOptimizer._all_reduce_sum_gradients``); tfgpu's step has already done that,
    once, so the second reduction is turned off."""

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)


def without_implicit_all_reduce(optimizer):
    """Returns ``optimizer`` re-classed so that ``apply`` does not all-reduce again."""
    cls = type(optimizer)
    if not issubclass(cls, _OwnAllReduceMixin):
        optimizer.__class__ = type(cls.__name__, (_OwnAllReduceMixin, cls), {})
    return optimizer


@contextlib.contextmanager
def ema_weights(optimizer):
    """Inside, the trained variables hold their exponential moving averages (an optimizer
    built with ``use_ema``); outside, their trained values again. Keras exports only the
    one-way ``finalize_variable_values``."""
    if not optimizer.use_ema:
        yield
        return
    variables = optimizer._trainable_variables
    averages = optimizer._model_variables_moving_average
    trained = [v.numpy() for v in variables]
    for var, average in zip(variables, averages):
        var.assign(average)
    try:
        yield
    finally:
        for var, value in zip(variables, trained):
            var.assign(value)


def set_op_determinism(enabled: bool) -> None:
    """Turns TensorFlow's process-wide op determinism on or off: a later run in the same
    process (tests) must not inherit it. TF exports only the 'on' switch."""
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config

    if enabled:
        tf.config.experimental.enable_op_determinism()
    else:
        tf_config.disable_op_determinism()
