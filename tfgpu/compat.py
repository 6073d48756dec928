"""Every touch of a private Keras or TensorFlow name, in one place.

tfgpu needs a few things neither library exports. Each is wrapped here, and
``tests/test_compat.py`` asserts that every name in ``PRIVATE_NAMES`` still exists in the
installed versions, so an upgrade that renames one fails a test instead of, say, silently
reducing gradients twice. setup.cfg pins Keras and TensorFlow to the minor versions tested.
"""

import contextlib

# (module, attribute path) of every private name used below.
PRIVATE_NAMES = (
    ("tensorflow.python.data.experimental.service.server_lib", "WorkerServer._address"),
    ("keras.src.backend.tensorflow.optimizer", "TFOptimizer._all_reduce_sum_gradients"),
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer._trainable_variables"),
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer._model_variables_moving_average"),
    (
        "keras.src.optimizers.base_optimizer",
        "BaseOptimizer._update_model_variables_moving_average",
    ),
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer._get_variable_index"),
    ("tensorflow.python.framework.config", "disable_op_determinism"),
    ("tensorflow.python.framework.config", "is_op_determinism_enabled"),
    ("tensorflow.python.eager.context", "Context.configure_coordination_service"),
    ("tensorflow.python.distribute.multi_worker_util", "coordination_leader"),
    ("tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2", "CoordinatedJob"),
    ("horovod.runner.common.util.safe_shell_exec", "GRACEFUL_TERMINATION_TIME_S"),
    ("horovod.runner.launch", "gloo_built"),
    ("horovod.runner.launch", "mpi_built"),
    ("keras.src.layers.normalization.batch_normalization", "BatchNormalization._moments"),
    ("tensorflow.python.distribute.cross_device_ops", "CollectiveAllReduce._all_reduce"),
    ("tensorflow.python.distribute.distribute_lib", "ReplicaContext._replica_id"),
    ("tensorflow.python.framework.kernels", "get_registered_kernels_for_op"),
    ("tensorflow.python.autograph.core.config", "CONVERSION_RULES"),
    ("tensorflow.python.autograph.core.config", "DoNotConvert"),
    ("keras.src.layers.layer", "Layer._flatten_layers"),
    ("numpy._core.multiarray", "_set_madvise_hugepage"),
)


def trace_tfgpu_as_written() -> None:
    """Autograph rewrites the body of each tfgpu tf.function (the train loop's ``for`` over
    ``tf.range``, its ``break``) but no longer the tfgpu functions that body calls, nor those
    tf.data traces: they run as written, as TensorFlow treats Keras (its own
    ``DoNotConvert("keras")`` rule). Rewriting them (~65 functions' source parsed and
    transformed in every process) took about a third of a short run's CPU and changed
    nothing in their graphs: their tensor control flow is ``tf.where``/``tf.cond`` already.
    Idempotent; takes and returns nothing."""
    from tensorflow.python.autograph.core import config

    rule = config.DoNotConvert("tfgpu")
    if str(rule) not in map(str, config.CONVERSION_RULES):
        config.CONVERSION_RULES = (rule, *config.CONVERSION_RULES)


class _OwnAllReduceMixin:
    """Keras' TF optimizer all-reduces gradients itself when applied inside a replica
    context (``TFOptimizer._all_reduce_sum_gradients``); tfgpu's step has already done that,
    once, so the second reduction is turned off."""

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)


def _members(optimizer) -> list:
    """The Keras optimizers of ``optimizer``: itself, or a ``finetune.GroupedOptimizer``'s."""
    return list(getattr(optimizer, "optimizers", [optimizer]))


def without_implicit_all_reduce(optimizer):
    """Returns ``optimizer`` re-classed (each of a group's) so that ``apply`` does not
    all-reduce again."""
    for member in _members(optimizer):
        cls = type(member)
        if not issubclass(cls, _OwnAllReduceMixin):
            member.__class__ = type(cls.__name__, (_OwnAllReduceMixin, cls), {})
    return optimizer


def variable_index(optimizer, variable) -> int:
    """The place of ``variable`` (a Keras variable, or a replica's component of one inside
    ``update_step``) among the variables ``optimizer`` was built on: where its slots are."""
    return optimizer._get_variable_index(variable)


def ema_decay_at(iterations, decay: float, warmup: bool):
    """The float64 decay of the weight average at the update after ``iterations`` updates:
    0 at the first (Keras' average starts as a copy of the weights), then ``decay``, or with
    ``warmup`` TF Model Garden's min(decay, (1 + n) / (10 + n)), n counting this update."""
    import tensorflow as tf

    done = tf.cast(iterations, tf.float64)
    n = done + 1.0  # Model Garden reads its step after the update has counted it
    value = tf.constant(decay, tf.float64)
    if warmup:
        value = tf.minimum(value, (1.0 + n) / (10.0 + n))
    return tf.where(done > 0, value, tf.zeros_like(value))


class _AverageMoreMixin:
    """Keras' weight average (``use_ema``) with a warm-up of its decay and more variables
    averaged beside the trained ones (BatchNorm's moving statistics), ``average_more``'s.
    Keras has no hook for either: its ``_update_model_variables_moving_average`` is replaced
    (the same arithmetic, with ``ema_decay_at``'s decay)."""

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        extra = self._tfgpu_average["extra"]
        # Added last: the optimizer's checkpointed variables keep their places before them.
        self._tfgpu_average["averages"] = (
            self.add_optimizer_variables(extra, "average") if extra else []
        )

    def _update_model_variables_moving_average(self, trainable_variables):
        if not self.use_ema:
            return
        import tensorflow as tf

        state = self._tfgpu_average
        decay = ema_decay_at(self.iterations, self.ema_momentum, state["warmup"])
        pairs = list(zip(trainable_variables, self._model_variables_moving_average))
        for var, average in pairs + list(zip(state["extra"], state["averages"])):
            if average is not None:
                d = tf.cast(decay, var.dtype)
                average.assign(d * tf_variable(average) + (1 - d) * tf_variable(var))


def average_more(optimizer, *, warmup: bool, extra: list):
    """Re-classes the Keras ``optimizer`` (built with ``use_ema``, not built yet) so that its
    weight average warms up (``warmup``) and covers ``extra`` variables too, which
    ``ema_weights`` then swaps in with the weights. Returns it."""
    cls = type(optimizer)
    optimizer.__class__ = type(cls.__name__, (_AverageMoreMixin, cls), {})
    # Set past Keras' attribute tracking: the averages are tracked as optimizer variables.
    object.__setattr__(optimizer, "_tfgpu_average", {"warmup": warmup, "extra": extra})
    return optimizer


def _averaged(member) -> tuple[list, list]:
    """(variables, their averages) of the Keras optimizer ``member``'s weight average."""
    state = getattr(member, "_tfgpu_average", None) or {"extra": [], "averages": []}
    variables = member._trainable_variables + list(state["extra"])
    return variables, member._model_variables_moving_average + list(state["averages"])


@contextlib.contextmanager
def ema_weights(optimizer):
    """Inside, the trained variables hold their exponential moving averages (an optimizer
    built with ``use_ema``; with ``average_more``'s extra variables, those too); outside,
    their trained values again. Keras exports only the one-way ``finalize_variable_values``.
    An optimizer never applied (a group of a backbone still frozen) has no average yet: its
    variables stay as they are."""
    variables, averages = [], []
    for member in _members(optimizer):
        if member.use_ema and int(member.iterations.numpy()) > 0:
            mine, theirs = _averaged(member)
            variables += mine
            averages += theirs
    if not variables:
        yield
        return
    trained = [v.numpy() for v in variables]
    for var, average in zip(variables, averages):
        var.assign(average)
    try:
        yield
    finally:
        for var, value in zip(variables, trained):
            var.assign(value)


def tf_variable(variable):
    """The tf.Variable (or its replica's component) behind a Keras variable; a tf.Variable as
    it is. The train step and the BatchNorm bookkeeping read and sum these inside replicas."""
    return variable.value if hasattr(variable, "value") else variable


def sublayers(layer) -> list:
    """The layers ``layer`` holds directly, in the order it tracked them: a Model's
    ``layers``, and those of a plain Layer too (a user's block holding a BatchNorm), which
    Keras lists only privately."""
    return list(layer._flatten_layers(include_self=False, recursive=False))


def set_batchnorm_moments(layer, moments) -> None:
    """Makes the BatchNormalization ``layer`` take its batch moments (in training) from
    ``moments(x, axes) -> (mean, variance)``, ``axes`` being every axis but the channels'.
    Keras has no public hook: its ``synchronized=True`` is tied to tf.distribute and makes
    three all-reduces per layer. Masked calls keep Keras' own computation."""
    keras_moments = layer._moments

    def hooked(inputs, mask):
        if mask is not None:
            return keras_moments(inputs, mask)
        rank = len(inputs.shape)
        channel_axes = {
            a % rank for a in (layer.axis if isinstance(layer.axis, list) else [layer.axis])
        }
        return moments(inputs, [a for a in range(rank) if a not in channel_axes])

    layer._moments = hooked


_LOCAL_GROUPS: list = []  # the strategies local_replica_sum has made collectives for


def local_replica_sum(strategy):
    """``sum(tensor)`` over the replicas of a one-process MirroredStrategy, inside its replica
    function and differentiable, through collective ops that each replica launches itself (as
    MultiWorkerMirroredStrategy does). MirroredStrategy's own ``ReplicaContext.all_reduce``
    goes through ``merge_call``, whose tracing cost grows with the graph: efficientnet_b0 with
    one all-reduce per BatchNorm layer traced in 402 s against 42 s without them (2 CPU
    devices, measured)."""
    from tensorflow.python.distribute import collective_util, cross_device_utils
    from tensorflow.python.distribute import cross_device_ops as cdo

    import tensorflow as tf

    devices = strategy.extended.worker_devices
    # A group key of its own per strategy, clear of TF's: TensorFlow remembers a group's
    # instances for the life of the process, and a second strategy (tests) must not reuse them.
    _LOCAL_GROUPS.append(strategy)
    keys = cross_device_utils.CollectiveKeys(group_key_start=(1 << 20) + 1000 * len(_LOCAL_GROUPS))
    collectives = cdo.CollectiveAllReduce(devices, len(devices), collective_util.Options(), keys)

    def reduce(tensor):
        replica = tf.distribute.get_replica_context()._replica_id
        options = collective_util.Options()
        return collectives._all_reduce(tf.distribute.ReduceOp.SUM, tensor, replica, options)

    @tf.custom_gradient
    def summed(tensor):
        return reduce(tensor), reduce  # the gradient of a sum over replicas is the same sum

    return summed


def set_op_determinism(enabled: bool) -> None:
    """Turns TensorFlow's process-wide op determinism on or off: a later run in the same
    process (tests) must not inherit it. TF exports only the 'on' switch."""
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config

    if enabled:
        tf.config.experimental.enable_op_determinism()
    else:
        tf_config.disable_op_determinism()


def op_determinism_enabled() -> bool:
    """Whether ``set_op_determinism(True)`` is in force (TF exports no reader)."""
    from tensorflow.python.framework import config as tf_config

    return tf_config.is_op_determinism_enabled()


def configure_coordination_service(
    cluster_spec, register_timeout_s: float, heartbeat_timeout_s: float
) -> None:
    """Sets up TensorFlow's coordination service for MultiWorkerMirroredStrategy before it
    does (it keeps a configuration it finds): a worker that never joins fails the others
    after ``register_timeout_s`` (TensorFlow's own default is an hour), and one that stops
    sending heartbeats is declared dead after ``heartbeat_timeout_s``.

    The register timeout binds the leader (worker 0) only together with
    ``cluster_register_with_barrier``, a field the Python call does not expose: it is set on
    the configuration the call leaves behind.
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    ctx = context.context()
    if ctx.coordination_service is not None:
        return
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
        for job in ("chief", "worker")
        if job in cluster_spec.jobs
    ]
    ctx.configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs,
        cluster_register_timeout_in_ms=int(register_timeout_s * 1000),
        heartbeat_timeout_in_ms=int(heartbeat_timeout_s * 1000),
    )
    ctx.coordination_service.cluster_register_with_barrier = True


def set_horovod_termination_grace(seconds: float) -> None:
    """How long horovodrun lets the other ranks stop after one failed (its default: 5 s, then
    SIGKILL); a module constant of Horovod's process runner."""
    import horovod.runner.common.util.safe_shell_exec as safe_shell_exec

    safe_shell_exec.GRACEFUL_TERMINATION_TIME_S = seconds


def replace_horovod_build_checks(make_check) -> None:
    """horovodrun's ``gloo_built`` and ``mpi_built`` (names horovod.runner.launch imported)
    replaced by ``make_check(feature, horovods_own)`` for "gloo" and "mpi"."""
    import horovod.runner.launch as launch

    for feature in ("gloo", "mpi"):
        name = f"{feature}_built"
        setattr(launch, name, make_check(feature, getattr(launch, name)))


_GPU_KERNELS: dict = {}  # op type -> its GPU (and device-independent) kernel definitions


def gpu_kernels(op_type: str) -> list:
    """The kernels registered for ``op_type`` that can run on a GPU ("GPU" or "DEFAULT"
    device type). The Linux TensorFlow wheel registers its GPU kernels whether or not a GPU
    is present, so this answers exactly on a CPU-only machine too; TF exports no reader."""
    if op_type not in _GPU_KERNELS:
        from tensorflow.python.framework import kernels

        listed = kernels.get_registered_kernels_for_op(op_type).kernel
        _GPU_KERNELS[op_type] = [k for k in listed if k.device_type in ("GPU", "DEFAULT")]
    return _GPU_KERNELS[op_type]


def _has_gpu_kernel(node) -> bool:
    """Whether some GPU kernel of ``node`` (a NodeDef) accepts its dtype attributes."""

    def allows(constraint):
        types = constraint.allowed_values.list.type
        return (
            constraint.name not in node.attr
            or not types
            or node.attr[constraint.name].type in types
        )

    return any(all(allows(c) for c in k.constraint) for k in gpu_kernels(node.op))


def _graph_nodes(fn, *args) -> list:
    """The NodeDefs of ``fn``'s graph (a tf.function, traced for ``args``) and of its
    functions (loop and cond bodies, XLA-compiled parts)."""
    graph_def = fn.get_concrete_function(*args).graph.as_graph_def()
    return list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]


def ops_without_gpu_kernel(fn, *args) -> set:
    """{"OpType['dtype', ...]"} of the nodes of ``fn``'s graph and functions (``_graph_nodes``)
    that have no GPU kernel for their dtypes: TensorFlow would quietly run those on the CPU."""
    import tensorflow as tf

    return {
        f"{n.op}{sorted(tf.dtypes.as_dtype(v.type).name for v in n.attr.values() if v.type)}"
        for n in _graph_nodes(fn, *args)
        if not _has_gpu_kernel(n)
    }


# Ops whose GPU kernel raises "Determinism is not yet supported" under op determinism, as the
# TensorFlow 2.21 library's own messages name them (read from its shared objects; the Python
# side exports no list). Segment reductions and depthwise/crop-resize gradients raise only for
# some dtypes or cuDNN versions and are left out.
GPU_DETERMINISM_REFUSED = frozenset(
    {
        "Bincount",
        "DenseBincount",
        "Dilation2DBackpropFilter",
        "Dilation2DBackpropInput",
        "MaxPoolGradWithArgmax",
        "FakeQuantWithMinMaxVarsGradient",
        "FakeQuantWithMinMaxVarsPerChannelGradient",
    }
)


def ops_refused_under_gpu_determinism(fn, *args) -> set:
    """The op types of ``fn``'s graph and functions that a GPU refuses to run under op
    determinism (``--deterministic``): GPU_DETERMINISM_REFUSED."""
    return {n.op for n in _graph_nodes(fn, *args)} & GPU_DETERMINISM_REFUSED


def data_service_worker_address(worker) -> str:
    """``host:port`` a tf.data service WorkerServer serves on (its port chosen by the OS when
    asked for 0): TensorFlow keeps it only in a private property."""
    return worker._address


@contextlib.contextmanager
def numpy_small_pages():
    """For the block, numpy's new arrays are not advised into 2 MB pages (numpy asks for
    them, madvise, for every array of 4 MB and more; restored after). Where the kernel must
    compact memory to find such pages (a converter's process, its page cache full of the
    data), the first touches of short-lived arrays cost more than the work on them: the
    duplicate check's grouping of Fashion-MNIST spent 0.18-0.20 s in the kernel in a
    conversion, 0.05-0.07 s with ordinary pages (``bench/convert.py``'s in-process runs)."""
    from numpy._core import multiarray

    before = multiarray._set_madvise_hugepage(False)
    try:
        yield
    finally:
        multiarray._set_madvise_hugepage(before)
