"""The conductor: ``run(config)`` takes a run through its phases, top to bottom. This module
is the one place that holds the whole Config (``run``; ``_start``, one start of the run, and
its phases ``_set_up``, ``_build``, ``_train``; ``input_of``, data/'s door for a run;
``assemble`` and ``scratch_update``, which build a run's parts for the run itself, the
micro-batch search, the benchmarks and the tests): every package below gets its own section
and plain values.

  set up       the settings this machine decides, the process seeded, the backend
               (``distribute``), --model_dir checked and locked (``results``)
  data         data/'s one door, ``data.run_input.prepare``: the data settings in, a
               ``RunInput`` out (the spec, the class weights, the start-up lines, the
               step's input functions, the train stream), agreed on by every worker; its
               later uses take no settings (the train batches, a scratch copy)
  files        config.json and the run's other files (``results.writer``: data.json too)
  micro-batch  --micro_batch_size=auto (``micro_batch``: scratch runs of one update, on
               the input's scratch copy)
  network      the model from its settings and what the data gives it, the optimizer from
               its settings and the model (``checkpoint.network``), the model as the step
               runs it (``models``: --remat), the train step and what saves them
               (``build``: the ``TrainState``), the initial weights (``models``)
  restore      the newest checkpoint; the metrics and the best cut back to its step
  train        ``fit`` (``fitting.py``): the compiled loop until the next step some action
               is due, then the actions (``actions``: log, evaluate, best, checkpoint, ...)
  finish       the final evaluation, checkpoint, weights and export; the summary

What ``fit`` calls compiled is ``step.loops``' ``make_train_loop``; evaluation is
``inference.evaluate.Evaluator``.
"""

import functools
import time
from collections.abc import Sequence

import keras
import tensorflow as tf

from tfgpu import compat, models, optim
from tfgpu.checkpoint import network as networks
from tfgpu.data import run_input
from tfgpu.distribute import backends, consensus, devices, heartbeats
from tfgpu.errors import ConfigError, DataError
from tfgpu.inference.evaluate import Evaluator
from tfgpu.models import prepare
from tfgpu.optim import finetune
from tfgpu.results import folder, runlock
from tfgpu.results.writer import RunWriter, eval_context
from tfgpu.train import build, finish, micro_batch
from tfgpu.train.actions import Action, default_actions
from tfgpu.train.config import check_average_plan
from tfgpu.train.fitting import fit
from tfgpu.train.progressive import Staged
from tfgpu.train.signals import PreemptionGuard


def run(config, actions: Sequence[Action] = ()) -> dict:
    """Trains, evaluates and exports as ``config`` (a validated ``tfgpu.config.Config``) says;
    returns the summary (also written). ``actions``: the run's own periodic actions
    (``actions.Action`` subclasses, as Keras' ``fit(callbacks=...)``), asked after the
    default ones at each loop boundary, before a preempted run's last checkpoint.
    A --model_dir that holds something other than a tfgpu run is refused first
    (``results.folder``). The chief holds its lock (``runlock``) from before it writes
    anything there to the end: a second run into the same directory stops, on every one of
    its workers. An out-of-memory error with --micro_batch_size=auto starts the run again
    from its last checkpoint at a smaller size (``micro_batch.Sizing``)."""
    compat.trace_tfgpu_as_written()  # as the commands do (cli/quiet.import_tensorflow)
    folder.check(config.model_dir)
    backend = backends.setup(config.dist)
    with runlock.held(config.model_dir, backend.is_chief) as in_use:
        if in_use and backend.num_workers == 1:
            raise ConfigError(in_use)
        sizing = micro_batch.Sizing(config.train)
        return sizing.backing_off(
            lambda: _start(config, backend, in_use, actions, sizing), backend.num_workers
        )


def _start(config, backend, in_use: str, actions: Sequence[Action], sizing) -> dict:
    """One start of the run on ``backend`` (again after an out-of-memory back-off): set up,
    train, finish. ``in_use``: the chief's lock error, which every worker stops with at the
    start-up agreement; ``sizing``: the run's ``micro_batch.Sizing``."""
    config, dtype_line = _resolved(config)
    started = time.time()
    watch = heartbeats.Watch.open(backend)
    # Seeded, deterministic as the run says, and rid of an earlier run's broken records.
    keras.utils.set_random_seed(config.seed)
    run_input.forget_broken()
    compat.set_op_determinism(config.deterministic)
    set_up = _set_up(config, backend, watch, in_use, sizing, dtype_line)
    config, inputs, plan, state, writer = set_up
    t = config.train
    evaluate = Evaluator(
        state.model,
        backend,
        inputs.spec,
        inputs.data,
        plan.eval_global_batch,
        state.optimizer,
        tta=t.eval_tta,
    )
    context = eval_context(t.global_batch_size, inputs.spec.num_train, state.optimizer)
    evaluated = evaluate, context
    throughput = _train(config, backend, inputs, plan, state, writer, evaluated, actions)
    final_eval = finish.finish(state, backend, t, evaluated, writer, inputs, throughput)
    throughput["broken"] = finish.broken_records(backend)  # the last collective
    wall_s = time.time() - started
    summary = finish.summary(
        state, backend, plan, t.global_batch_size, final_eval, throughput, wall_s
    )
    return finish.end(backend, watch, writer, summary)


def _resolved(config) -> tuple:
    """(``config`` with the settings that depend on this machine decided, ``Config.resolved``;
    the start-up line of what --dtype=auto chose and why, or ""). A run resumed with
    --dtype=auto keeps its own choice: its config.json's (``folder.check``), made where it
    started."""
    auto = config.model.dtype == "auto"
    stored = folder.check(config.model_dir) if auto else None
    bfloat16 = devices.fast_bfloat16() if auto else ""
    has_gpu = bool(tf.config.list_logical_devices("GPU"))
    config = config.resolved(has_gpu, bfloat16, stored)
    if not auto:
        return config, ""
    dtype = config.model.dtype
    if stored and stored.get("dtype", "auto") != "auto":
        return config, f"--dtype=auto: {dtype}, the run's own choice (config.json)"
    why = f"this {bfloat16} computes bfloat16 fast" if bfloat16 else "no fast bfloat16 here"
    return config, f"--dtype=auto: {dtype} ({why})"


def _set_up(config, backend, watch, in_use: str, sizing, dtype_line: str = "") -> tuple:
    """(the run's Config with its micro-batch decided, its ``run_input.RunInput``, its
    ``build.Plan``, its ``build.TrainState``, its ``RunWriter``): the data agreed on with every
    worker and what the run takes from it, config.json and the data's record written, the
    micro-batch sized, the run built, its start lines (``dtype_line``: --dtype=auto's choice)
    said and the heartbeats (``watch``) started."""
    inputs, fingerprints = agreed_input(config, backend, watch.announced, in_use)
    writer = RunWriter(config.model_dir, backend.is_chief)
    writer.write_config(config.flat(), backend, config.train)
    writer.write_files(inputs.recorded)
    scratch = scratch_update(config, inputs)
    size = sizing.choose(config.train, backend, writer, scratch, config.seed)
    if size:
        config = config.with_settings(micro_batch_size=str(size))
    t = config.train
    _, plan, state, lines = assemble(config, backend, inputs)
    check_average_plan(t, plan.total_steps)
    writer.info(_start_line(backend, plan, t.global_batch_size, config.model.name, inputs.words))
    listening = watch.start(fingerprints, backend, state.global_step, config.dist.stall_timeout_s)
    for line in (dtype_line, listening, inputs.lines, *lines):
        if line:
            writer.info(line)
    return config, inputs, plan, state, writer


def _build(config, backend, inputs, plan) -> tuple:
    """(the run's ``build.TrainState``, its start lines): the network (the model from its
    settings and what the data gives it: its classes and image side; the optimizer from its
    settings, the model and the plan's updates; a whitening layer from the first training
    images: ``checkpoint.network.build``, the recipe the uses of the run rebuild it by), the
    model as the step runs it (--remat: ``models.prepare.rematerialized``) and the train
    step, in the backend's scope; then what saves them; then the model's initial
    weights (``models.set_initial_weights``: --init_weights) and what each package says of
    its part: the network's initialisation, the weights, the optimizer's groups and
    learning rate."""
    m, o, t = config.model, config.optim, config.train
    any_size = config.curriculum.progressive_stages > 1  # its stages train at smaller sides
    batch, total = t.global_batch_size, plan.total_steps
    optimizer = lambda model: finetune.run_optimizer(o, m, model, batch, total)  # noqa: E731
    classes, side = inputs.spec.num_classes, inputs.data.image_size
    images = functools.partial(run_input.first_images, inputs)  # read by a whitening layer
    with backend.scope():
        network = networks.build(m, classes, side, any_size, optimizer, images)
        model = network.model
        # --remat: the step runs the blocks rematerialized; the checkpoints hold ``model``.
        stepped = prepare.rematerialized(model, m.name, any_size) if m.remat else model
        fns = dict(step_fns=inputs.step_fns, class_weights=inputs.class_weights)
        step = build.build_step(stepped, network.optimizer, backend, m, o, t, **fns)
    state = build.build_state(model, step, backend, t, config.model_dir)
    tuning = finetune.describe(step.optimizer, o, m, total)
    rate = optim.describe_learning_rate(o, batch)
    # Outside the backend's scope: a .keras source needs no mirrored copies.
    init = models.set_initial_weights(model, m, network.frozen)
    return state, [line for line in (*network.initialized, init, tuning, rate) if line]


def assemble(config, backend, inputs=None) -> tuple:
    """(the ``run_input.RunInput``, the ``build.Plan``, the ``build.TrainState``, its start
    lines) of the run of ``config`` on ``backend``, built as ``run`` builds them, fresh:
    nothing restored, agreed or trained (``inputs``: its RunInput, the run's or a scratch
    copy's; None: data/'s, from ``config``, with nothing compared or recorded). The
    micro-batch search's scratch runs, the benchmarks and the tests take it;
    ``run_input.train_batches`` then gives its batches."""
    inputs = inputs or input_of(config, backend)
    plan = build.make_plan(config.train, inputs.spec.num_train, backend.num_replicas)
    state, lines = _build(config, backend, inputs, plan)
    return inputs, plan, state, lines


def scratch_update(config, inputs):
    """``one_update(replica_batch, size, scratch)`` for ``micro_batch.search``: one update of a
    scratch copy of the run of ``config`` on ``inputs`` (its ``run_input.RunInput``): one
    replica's batch at micro-batch ``size`` (``micro_batch.scratch_settings``) on synthetic
    batches of the run's shape (``run_input.scratch_copy``), built and compiled as the run's,
    on this process' first device, its files in folder ``scratch``."""

    def one_update(replica_batch: int, size: int, scratch: str) -> None:
        settings = micro_batch.scratch_settings(config.model, replica_batch, size, scratch)
        backend = backends.build_backend("default")
        fed, batches = run_input.scratch_copy(inputs, backend, replica_batch)
        _, _, state, _ = assemble(config.with_settings(**settings), backend, fed)
        micro_batch.update_once(state, batches)

    return one_update


def _train(config, backend, inputs, plan, state, writer, evaluated, actions) -> dict:
    """From the newest checkpoint to the plan's last update: ``fit``, handing each loop
    boundary to the actions (``actions.default_actions``, then the run's own ``actions``;
    ``evaluated``: (the run's evaluation, what its rows are logged with:
    ``results.writer.eval_context``)); returns ``fit``'s throughput, with the input's own
    images/s."""
    t = config.train
    evaluate, context = evaluated
    start_step = _restore(state, writer)
    staged, batches, input_ips = _train_input(
        config.curriculum,
        inputs,
        state,
        plan.total_steps,
        backend,
        writer,
        start_step,
        model_name=config.model.name,
    )
    with PreemptionGuard() as guard:
        loop_actions = default_actions(
            t,
            state,
            backend,
            evaluate,
            context,
            eval_every=plan.eval_every,
            model_dir=config.model_dir,
            model_settings=config.model,
            clips=bool(config.optim.clip_norm),
            deterministic=config.deterministic,
            guard=guard,
            extra=actions,
        )
        throughput = fit(
            state,
            backend,
            batches,
            loop_actions,
            writer,
            plan=plan,
            steps_per_loop=t.steps_per_loop,
            max_skipped=config.optim.max_skipped_updates,
            input_ips=input_ips,
            staged=staged,
        )
    throughput["input_images_per_sec"] = input_ips
    return throughput


def agreed_input(config, backend, announced: dict, in_use: str = "") -> tuple:
    """(this worker's ``run_input.RunInput``, every worker's fingerprint), once every worker
    has its input and all agree on it (its spec and class weights: ``RunInput.fingerprint``),
    on the settings (``Config.shared``) and on the tfgpu version (``consensus.agree``): the
    run trains with these class weights, --class_weights is not read again. A worker that
    cannot prepare its input still takes part, so that every worker stops with the same
    line, naming it. ``announced``: what this worker's fingerprint says of its heartbeats
    (``heartbeats.Watch``); ``in_use``: the chief found --model_dir held by another run."""
    inputs, error = None, in_use
    try:
        inputs = input_of(config, backend, config.model_dir)
    except (DataError, ConfigError) as err:
        if backend.num_workers == 1:
            raise
        error = error or str(err)
    summary, weights = inputs.fingerprint if inputs else (None, None)
    mine = consensus.fingerprint(config.shared(), summary, error, weights)
    return inputs, consensus.agree(backend, dict(mine, **announced))


def input_of(config, backend, model_dir: str = ""):
    """data/'s ``run_input.RunInput`` of the run of ``config`` over ``backend``'s replicas:
    its data settings, its class weights setting and how its train stream is cut (the
    batch, the seed, the order, --repeated_augment); ``model_dir``: the run's, its data
    compared with what a resumed run recorded and recorded on the chief ("": neither)."""
    t = config.train
    return run_input.prepare(
        config.data,
        config.optim.class_weights,
        batch_size=t.global_batch_size // backend.num_replicas,  # the plan checks it divides
        global_batch_size=t.global_batch_size,
        seed=config.seed,
        deterministic=config.deterministic,
        repeats=config.curriculum.repeated_augment,
        model_dir=model_dir,
        is_chief=backend.is_chief,
    )


def _start_line(backend, plan, global_batch: int, model: str, words: str) -> str:
    """The run's first line: where it runs, how many updates of how many examples, the
    model, and the input (``words``: ``run_input.RunInput.words``)."""
    micro = plan.replica_batch // plan.grad_accum_steps
    return (
        f"{backend.name}: {backend.num_replicas} replica(s), {plan.total_steps} updates "
        f"of {global_batch} ({plan.grad_accum_steps} micro-batch(es) of "
        f"{micro} per replica), model {model}, " + words
    )


def _restore(state, writer: RunWriter) -> int:
    """The step the run goes on from: its newest checkpoint's (0 for none), which the
    metrics and the best-so-far are cut back to."""
    start_step = state.checkpoints.restore(writer.info)
    writer.resume(start_step)
    if state.best is not None:
        state.best.resume(start_step)
    return start_step


def _train_input(
    curriculum, inputs, state, total_steps: int, backend, writer, start_step: int, model_name=""
):
    """(the run's ``progressive.Staged`` or None for one stage, the train batches from
    ``start_step``, the input's own images/s or None); the input alone is probed first
    (--input_probe_s) and said. ``model_name``: --model, whose model the stages check."""
    probe_s = inputs.data.input_probe_s
    info = writer.info
    staged = Staged.of(curriculum, total_steps, inputs, state.step, backend, info, model_name)
    if staged:
        batches, input_ips = staged.enter(start_step, probe_s)
    else:
        batches, _, input_ips = run_input.train_batches(inputs, backend, start_step, None, probe_s)
    if input_ips:
        writer.info(
            f"input alone: {input_ips:,.0f} img/s on this worker (read for "
            f"--input_probe_s={probe_s:g} s)"
        )
    return staged, batches, input_ips
