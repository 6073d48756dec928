"""Every private Keras/TensorFlow name tfgpu touches (tfgpu/compat.py) still exists, and the
wrappers around them still do what tfgpu relies on."""

import importlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from requires import requires

from tfgpu import compat


@pytest.mark.parametrize("module, path", compat.PRIVATE_NAMES)
def test_every_private_name_still_exists(module, path):
    if module.startswith("horovod."):
        requires("horovod")  # the fast tier may run without it; `make test` builds it
    owner = importlib.import_module(module)
    for part in path.split("."):
        if isinstance(owner, type) and part not in dir(owner):
            # Instance attributes (set in __init__) are checked on a built optimizer below.
            assert part in _instance_attributes(), f"{module}.{path} is gone"
            return
        owner = getattr(owner, part)


def _instance_attributes() -> set:
    optimizer = keras.optimizers.SGD(0.1, use_ema=True)
    optimizer.build([keras.Variable(np.zeros(3, np.float32))])
    return set(vars(optimizer))


def test_the_implicit_all_reduce_is_turned_off_once():
    optimizer = compat.without_implicit_all_reduce(keras.optimizers.SGD(0.1))
    again = compat.without_implicit_all_reduce(optimizer)
    grads_and_vars = [(tf.ones(2), tf.Variable(tf.zeros(2)))]
    assert again._all_reduce_sum_gradients(grads_and_vars) == grads_and_vars
    assert type(again).__mro__.count(compat._OwnAllReduceMixin) == 1


def test_ema_weights_swap_in_and_back():
    var = keras.Variable(np.array([1.0, 2.0], np.float32))
    optimizer = keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5)
    optimizer.build([var])
    for _ in range(3):  # var moves, its average lags behind
        optimizer.apply([tf.constant([1.0, 1.0])], [var])
    trained = var.numpy().copy()
    with compat.ema_weights(optimizer):
        assert not np.allclose(var.numpy(), trained)
    np.testing.assert_array_equal(var.numpy(), trained)


def test_coordination_service_config_has_the_fields_we_set():
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2

    fields = set(coordination_config_pb2.CoordinationServiceConfig.DESCRIPTOR.fields_by_name)
    wanted = {"cluster_register_timeout_in_ms", "cluster_register_with_barrier"}
    assert wanted | {"heartbeat_timeout_in_ms", "coordinated_job_list"} <= fields


def test_the_ops_a_gpu_refuses_under_determinism_are_still_registered_ops():
    """A renamed op would make ``ops_refused_under_gpu_determinism`` silently miss it."""
    from tensorflow.python.framework import op_def_registry

    for op in compat.GPU_DETERMINISM_REFUSED:
        assert op_def_registry.get(op) is not None, op


def _clip_negative(x):
    if x < 0:  # a Python `if` on a tensor: graph code only once autograph rewrites it
        return tf.zeros_like(x)
    return x


@pytest.mark.fast
def test_tfgpu_code_is_traced_as_written_and_other_code_is_converted():
    compat.trace_tfgpu_as_written()  # conftest did it already: idempotent
    from tensorflow.python.autograph.core import config

    assert [str(r) for r in config.CONVERSION_RULES].count("DoNotConvert rule for tfgpu") == 1
    numbers = tf.data.Dataset.from_tensor_slices([-1, 2])
    assert list(numbers.map(_clip_negative).as_numpy_iterator()) == [0, 2]  # rewritten
    as_tfgpu = type(_clip_negative)(_clip_negative.__code__, _clip_negative.__globals__)
    as_tfgpu.__module__ = "tfgpu.compat"  # the same function, as if it were tfgpu's
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        numbers.map(as_tfgpu)


@pytest.mark.fast
def test_numpy_small_pages_turns_the_advice_off_and_restores_it():
    from numpy._core import multiarray

    before = multiarray._set_madvise_hugepage(True)  # returns the setting it replaces
    try:
        with compat.numpy_small_pages():
            assert multiarray._set_madvise_hugepage(False) is False  # off inside the block
        assert multiarray._set_madvise_hugepage(True) is True  # restored after it
        with pytest.raises(ValueError), compat.numpy_small_pages():
            raise ValueError("an error in the block")
        assert multiarray._set_madvise_hugepage(True) is True  # restored after an error too
    finally:
        multiarray._set_madvise_hugepage(before)
