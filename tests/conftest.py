"""Shared test set-up: quiet TensorFlow, two logical CPU devices, the session's datasets and
reference runs (made once, shared by the xdist workers: tests/shared.py), what a test
requires (tests/requires.py: a skip, a failure under ``make test``), and the two test tiers.

Tiers. Every test is either ``fast`` or ``slow`` (markers registered in setup.cfg, which also
sets ``--strict-markers``). ``make test-fast`` (``pytest -m fast``, tests/e2e/ left out) runs
the fast tier; ``make test`` and CI run both. A test is:

- what it is marked: ``@pytest.mark.slow`` / ``@pytest.mark.fast`` on the test, its class, or
  the module's ``pytestmark`` (a test marked both is an error: ``-m`` would select it twice);
- otherwise ``slow`` if its module holds a process helper (``subprocess``, ``multiprocessing``,
  ``tests/procs.py``, ``tests/multihost.py`` or ``tests/chaos.py``, imported as a module or by
  name) or a training helper (``tfgpu.train``, ``TrainStep``: every test here that trains
  took 5-40 s on 2 cores), or it uses a fixture that starts
  processes or trains (``PROCESS_FIXTURES``, ``TRAINING_FIXTURES``);
- otherwise ``fast``.

So a new test file is classified sensibly without anyone thinking about tiers: one that starts
processes (the usual reason a test takes 20-70 s here) or trains is slow, and one that does
neither is fast. The rule leans to slow (a training helper anywhere in a module makes all its
unmarked tests slow): a wrong guess costs the fast tier a test rather than its time budget.
What the rule cannot see is other in-process work that takes many seconds (building
densenet121- or resnet50-sized models, long tf.data runs): mark those ``slow`` by hand. The
fast tier prints, at its end, every fast test that took over ``FAST_TEST_BUDGET_S``, so that
shows up the first time it runs. In a module the rule makes slow, a test that starts no
process and trains nothing may be marked ``fast``; tests/test_tiers.py checks that no fast test
names a process helper, and that both tiers keep a sensible size.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Eigen's CPU kernels: oneDNN's (TensorFlow's default on x86) sum convolutions in an order
# that depends on the batch's shape, past the 1e-5 the equivalence tests hold runs to
# (docs/training-loop.md, "Not exact"; measured: 1.2e-5 after 24 updates of 2 workers).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
# Horovod's background thread negotiates with the other ranks every HOROVOD_CYCLE_TIME ms
# (default 1), whether or not a tensor waits: a rank that waits on a peer (tracing, or frozen
# in a hang test) burns CPU the shared cores lack (measured: a 60 s wait, 39 -> 20 CPU-s at
# 10 ms). It sets when fused all-reduces start, not what they sum.
os.environ.setdefault("HOROVOD_CYCLE_TIME", "10")
# The commands log to MLflow where these say (docs/reports.md): a developer's own server must
# not receive the tests' runs. tests/e2e/test_mlflow.py sets them where it means to.
for _name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
    os.environ.pop(_name, None)

import collections
import inspect
import json
import shutil
import sys

import hypothesis
import numpy as np
import pytest
import shared
from requires import require_all, requires
from weights import named as named_weights

# No per-example deadline for the property tests: on 2 cores shared with the tests that start
# processes, an example's time says nothing of the code (a 200 ms deadline failed them).
hypothesis.settings.register_profile("tfgpu", deadline=None)
hypothesis.settings.load_profile("tfgpu")


def is_xdist_controller(config) -> bool:
    """True in the process that hands tests to pytest-xdist's workers (``-n 2``): it collects
    and runs none itself. xdist's own test (its plugin's pytest_configure): a distribution
    mode and workers, unless the run only collects (then this process collects)."""
    if hasattr(config, "workerinput") or config.getoption("collectonly"):
        return False
    return config.getoption("dist", "no") != "no" and bool(config.getoption("tx", None))


def pytest_configure(config):
    """TensorFlow, as the commands import it (tfgpu's code traced as written, the import out
    of the cycle collector's reach: quiet._importing), with 2 logical CPU devices (mirrored
    tests get 2 replicas; default stays on /cpu:0), before any test module imports it. Not in
    xdist's controller, which runs no test: its import (~4 CPU-s) would delay the workers'
    start by as much."""
    if is_xdist_controller(config):
        return
    from tfgpu.cli import quiet  # noqa: PLC0415 (only where tests run)

    quiet.import_tensorflow()
    from tfgpu.distribute import devices  # noqa: PLC0415 (imports TensorFlow: after quiet's)

    devices.configure_devices(2)


# --- test tiers (see the module docstring) ---------------------------------------------

TIERS = ("fast", "slow")
PROCESS_MODULES = frozenset({"subprocess", "multiprocessing", "procs", "multihost", "chaos"})
PROCESS_FIXTURES = frozenset({"horovodrun_tfgpu"})
TRAINING_FIXTURES = frozenset({"reference_run", "faults_run"})  # train when a test first asks
TRAINING_HELPERS = frozenset(
    {
        "tfgpu.train",
        "tfgpu.train.loop",
        "tfgpu.step.train_step.TrainStep",
    }
)
FAST_TEST_BUDGET_S = 10.0
# The heavy tests (marker ``heavy``, always slow) widen a claim the default run already shows
# once: the rest of an optimizer x strategy matrix, the biggest models, the same contract under
# one more strategy. They run with HEAVY_ENV=1 only, so that the whole suite keeps CI's time.
HEAVY_ENV = "TFGPU_HEAVY_TESTS"


def _qualified_name(value):
    if inspect.ismodule(value):
        return value.__name__
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    return f"{module}.{name}" if isinstance(module, str) and isinstance(name, str) else None


def is_process_helper(value) -> bool:
    """True for one of PROCESS_MODULES (``import subprocess``) or a name taken from one
    (``from procs import popen``)."""
    name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
    return isinstance(name, str) and name.split(".")[0] in PROCESS_MODULES


def module_starts_processes(module) -> bool:
    """True if ``module`` holds a process helper."""
    return any(is_process_helper(value) for value in vars(module).values())


def module_trains(module) -> bool:
    """True if ``module`` holds one of TRAINING_HELPERS (``from tfgpu import train`` ...)."""
    return any(_qualified_name(value) in TRAINING_HELPERS for value in vars(module).values())


def tier(explicit: set, module, fixturenames) -> str:
    """The tier of a test: its explicit mark, else slow where processes start or training
    runs, else fast."""
    if len(explicit) > 1:
        raise pytest.UsageError(f"a test of {module.__name__} is marked both fast and slow")
    if explicit:
        return next(iter(explicit))
    slow = module_starts_processes(module) or module_trains(module)
    fixtures = (PROCESS_FIXTURES | TRAINING_FIXTURES) & set(fixturenames)
    return "slow" if slow or fixtures else "fast"


def heavy_enabled() -> bool:
    """True when the opt-in heavy tests run (``TFGPU_HEAVY_TESTS=1``, ``make test-heavy``)."""
    return os.environ.get(HEAVY_ENV, "") not in ("", "0")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    skip_heavy = pytest.mark.skip(reason=f"heavy: set {HEAVY_ENV}=1 (make test-heavy)")
    for item in items:
        explicit = {m.name for m in item.iter_markers() if m.name in TIERS}
        heavy = item.get_closest_marker("heavy") is not None
        if heavy and "fast" in explicit:
            raise pytest.UsageError(f"{item.nodeid} is marked both heavy and fast")
        name = "slow" if heavy else tier(explicit, item.module, item.fixturenames)
        if name not in explicit:
            item.add_marker(name)
        if heavy and not heavy_enabled():
            item.add_marker(skip_heavy)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (``make test``: -n 2)
        spread(items)


def pytest_runtest_setup(item):
    """``@pytest.mark.requires("name")``: tests/requires.py's check, before the test."""
    for mark in item.iter_markers("requires"):
        for dependency in mark.args:
            requires(dependency)


def _skip_is_a_gap(report, item=None) -> bool:
    """Under ``make test`` (tests/requires.py's REQUIRE_ALL_ENV) a skip is a failure, but the
    opt-in heavy tier's and an expected failure's."""
    if not (report.skipped and require_all()) or hasattr(report, "wasxfail"):
        return False
    return item is None or item.get_closest_marker("heavy") is None or heavy_enabled()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if _skip_is_a_gap(report, item):
        report.outcome = "failed"
        report.longrepr = f"skipped where every dependency is installed: {report.longrepr}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if _skip_is_a_gap(report):  # a module that skips itself at its top
        report.outcome = "failed"
        report.longrepr = f"skipped where every dependency is installed: {report.longrepr}"
    return report


def spread(items) -> None:
    """For pytest-xdist's ``--dist loadfile --no-loadscope-reorder`` (``make test``), which
    keeps a module's tests on one worker (a module-scoped fixture, one run shared by several
    tests, runs once) and hands out modules in collection order: reorders ``items`` (in
    place, stably) so that the modules that start processes come first, most slow tests
    first, then those that train in-process, then the fast ones, which fill in at the end."""
    slow = collections.Counter()
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("skip"):
            slow[item.module.__name__] += 1

    def order(item):
        return (not module_starts_processes(item.module), -slow[item.module.__name__])

    items.sort(key=order)


def pytest_terminal_summary(terminalreporter, config):
    """Names the fast tests whose set-up and call took longer than FAST_TEST_BUDGET_S."""
    seconds = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call") and "fast" in report.keywords:
                seconds[report.nodeid] = seconds.get(report.nodeid, 0.0) + report.duration
    over = sorted((s, nodeid) for nodeid, s in seconds.items() if s > FAST_TEST_BUDGET_S)
    if over:
        title = f"fast tests over {FAST_TEST_BUDGET_S:.0f} s: mark them slow?"
        terminalreporter.write_sep("-", title)
        for duration, nodeid in reversed(over):
            terminalreporter.write_line(f"{duration:6.1f} s  {nodeid}")


def make_image_arrays(n: int, size: int = 40, num_classes: int = 4, seed: int = 0):
    """Images whose class is visible (a bright quadrant), so short runs can learn them."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % num_classes
    images = rng.integers(0, 60, size=(n, size, size, 3), dtype=np.uint8)
    half = size // 2
    for i, label in enumerate(labels):
        y, x = divmod(int(label), 2)
        images[i, y * half : (y + 1) * half, x * half : (x + 1) * half] += 150
    return images, labels


@pytest.fixture(autouse=True)
def _op_determinism_off_after_each_test():
    """enable_op_determinism is process-wide; a deterministic test must not leak it."""
    yield
    from tfgpu.compat import set_op_determinism

    set_op_determinism(False)


def write_small_dataset(out: str, source: str = "tests") -> str:
    """Converts 96 train and 24 validation 40x40 images in 4 classes into ``out``; returns it."""
    from tfgpu.convert import plan  # noqa: PLC0415 (TensorFlow's: not in xdist's controller)
    from tfgpu.convert.manifest import items_from_arrays  # noqa: PLC0415

    images, labels = make_image_arrays(120)
    items = items_from_arrays(images, labels, prefix="synthetic")
    plan.write_dataset(
        {"train": items[:96], "validation": items[96:]},
        class_names=["a", "b", "c", "d"],
        output_dir=out,
        source=source,
        num_shards={"train": 4, "validation": 2},
    )
    return out


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory, pytestconfig) -> str:
    """A converted dataset of 96 train and 24 validation 40x40 images in 4 classes, written
    once per session (the xdist workers share it): a test that changes it works on a copy."""
    root = shared.shared_root(tmp_path_factory, pytestconfig)
    return str(shared.made_once(root / "small-data", lambda p: write_small_dataset(str(p))))


TRAIN_COUNTS = (60, 24, 8, 4)  # the imbalanced dataset's classes a, b, c, d


def write_imbalanced_dataset(out: str) -> str:
    """Like ``write_small_dataset``, its train split imbalanced (TRAIN_COUNTS), its
    validation split balanced (8 each); returns ``out``."""
    from tfgpu.convert import plan  # noqa: PLC0415 (TensorFlow's: not in xdist's controller)
    from tfgpu.convert.manifest import items_from_arrays  # noqa: PLC0415

    images, labels = make_image_arrays(400, seed=5)
    train_idx, val_idx = [], []
    for c, n in enumerate(TRAIN_COUNTS):
        of_c = np.flatnonzero(labels == c)
        train_idx += list(of_c[:n])
        val_idx += list(of_c[n : n + 8])
    items = items_from_arrays(images, labels, prefix="imbalanced")
    plan.write_dataset(
        {"train": [items[i] for i in train_idx], "validation": [items[i] for i in val_idx]},
        class_names=["a", "b", "c", "d"],
        output_dir=out,
        source="tests",
        num_shards={"train": 2, "validation": 1},
    )
    return out


@pytest.fixture(scope="session")
def imbalanced(tmp_path_factory, pytestconfig) -> str:
    """A converted dataset of 4 classes, its train split imbalanced (60/24/8/4 examples of
    classes a-d), its validation split balanced (8 each); once per session, shared."""
    root = shared.shared_root(tmp_path_factory, pytestconfig)
    return str(shared.made_once(root / "imbalanced", lambda p: write_imbalanced_dataset(str(p))))


# A short deterministic tiny_cnn run: the base of the equivalence tests.
TINY_RUN = {
    "model": "tiny_cnn",
    "image_size": 32,
    "global_batch_size": 16,
    "train_steps": 6,
    "optimizer": "sgd",
    "learning_rate": 0.01,
    "momentum": 0.9,
    "weight_decay": 0.0,
    "lr_schedule": "constant",
    "crop_min_area": 0.5,
    "deterministic": True,
    "seed": 3,
    "steps_per_loop": 3,
    "log_every_steps": 3,
    "checkpoint_every_steps": 100,
    "export": False,
    # No start-up probe of the input alone (default 1 s, up to 100 batches: ~0.6 CPU-s of a
    # 6-update run's ~5.6, measured). tests/data/test_input_diagnosis.py checks its line and
    # figure; tests/e2e/test_faults.py's and test_data_faults.py's uninterrupted run and their
    # resumes keep it (each resumed run, which probes again, ends with the uninterrupted run's
    # weights); the processes they interrupt do without it.
    "input_probe_s": 0.0,
}
# TINY_RUN with every per-example draw and the step's options that must not depend on how a
# batch is split: RandAugment, random erasing, repeated augmentation (2 copies, 8 apart in
# each batch of 16: on different replicas), --remat (the forward recomputed per block, inside
# the accumulation loop too), two progressive stages (24x24 at magnitude 3, then 32x32 at 9:
# every backend takes the second stage's dataset and traces its step at the same update).
SPREAD_RUN = dict(
    TINY_RUN,
    augment_policy="randaugment",
    random_erasing=0.25,
    repeated_augment=2,
    remat=True,
    progressive_stages=2,
    progressive_min_image_size=24,
    progressive_min_magnitude=3,
)
# SPREAD_RUN with the large-batch settings: LARS at a rate (2.5 per 8 images, scaled linearly
# to 16) that moves each layer by ~0.5% of its norm per update, BCE with a target threshold on
# mixed targets, poly decay, EMA warm-up. Its two-process runs: tests/e2e/test_equivalence.py
# (Horovod) and test_heartbeat_flood.py (multi_worker_mirrored, under a flood).
LARGE_BATCH_RUN = dict(
    SPREAD_RUN,
    optimizer="lars",
    learning_rate=2.5,
    lr_scaling="linear",
    base_batch_size=8,
    lr_schedule="poly",
    warmup_steps=2,
    weight_decay=1e-4,
    loss="bce",
    label_smoothing=0.1,
    bce_target_threshold=0.2,
    mixup_alpha=0.2,
    cutmix_alpha=1.0,
    ema_decay=0.9,
    ema_warmup=True,
)


# Class weights from the data's counts with balanced sampling (in memory, as it needs) and
# MixUp/CutMix: tests/data/test_balance.py's accumulation and resume and the mirrored row of
# tests/distribute/test_mirrored_equals_default.py share its one-device run on ``imbalanced``.
BALANCE_RUN = dict(
    class_weights="auto",
    balanced_sampling=True,
    sampling_power=0.5,
    mixup_alpha=0.4,
    cutmix_alpha=1.0,
)

# airbench's methods on TINY_RUN (tests/train/test_airbench_methods.py; its mirrored = default
# row in tests/distribute/test_mirrored_equals_default.py shares the one-device run): the
# data's whitening, identity initialisation, lookahead, BatchNorm's own learning rate,
# alternating flips, six-view TTA, synchronized BatchNorm.
AIRBENCH_RUN = dict(
    model="airbench_s_gray",
    dirac_init=True,
    lookahead_steps=2,
    batchnorm_lr_multiplier=8.0,
    alternating_flips=True,
    crop_padding=0,
    in_memory="on",
    eval_tta="flip_translate",
    optimizer="nesterov",
    learning_rate=0.05,
    sync_batchnorm=True,
)


@pytest.fixture(scope="session")
def reference_run(small_dataset, tmp_path_factory, pytestconfig):
    """``reference_run(data_dir=None, **settings)``: the model_dir of TINY_RUN with
    ``settings`` trained on ``data_dir`` (``small_dataset``) by one default process, once per
    session for all the tests that compare with it (the xdist workers share it too). Read it;
    copy it to go on with it."""
    root = shared.shared_root(tmp_path_factory, pytestconfig)

    def run(data_dir=None, **settings) -> str:
        values = dict(TINY_RUN, **dict(settings, strategy="default"))
        data_dir = data_dir or small_dataset

        def train_it(model_dir):
            from tfgpu import train  # noqa: PLC0415 (TensorFlow's work: only when asked)
            from tfgpu.config import config_from, validate  # noqa: PLC0415

            summary = train.run(
                validate(config_from(data_dir=data_dir, model_dir=str(model_dir), **values))
            )
            assert summary["num_replicas"] == 1 and np.isfinite(summary["final_eval"]["loss"])

        name = f"reference-{shared.key(dict(values, data_dir=data_dir))}"
        return str(shared.made_once(root / name, train_it))

    return run


# A short run on 16x16 crops read from the shards all along, a policy's per-epoch draws in it,
# a checkpoint every 4 updates: the run tests/e2e/test_faults.py and test_data_faults.py
# interrupt (a signal, damaged checkpoints, a shard gone, the data rewritten) and resume.
FAULTS_RUN = dict(
    model="tiny_cnn",
    image_size=16,  # ~25 ms of CPU an update instead of ~65 at 32 (bench/README.md)
    global_batch_size=16,
    train_steps=36,  # 6 epochs of the 96 images: a resume lands mid-way
    optimizer="adam",
    learning_rate=0.001,
    weight_decay=0.0,
    deterministic=True,
    seed=7,
    steps_per_loop=2,
    log_every_steps=2,
    checkpoint_every_steps=4,
    export=False,
    crop_min_area=0.5,
    augment_policy="trivialaugment",  # its draws depend on the epoch too
    random_erasing=0.25,
    shuffle_buffer=32,
    in_memory="off",  # the shards read all along (a small set is otherwise read once)
)


@pytest.fixture(scope="session")
def faults_run(small_dataset, tmp_path_factory, pytestconfig) -> str:
    """The model_dir of FAULTS_RUN trained uninterrupted on ``small_dataset`` by one default
    process (its checkpoints at 28, 32 and 36), once per session for test_faults and
    test_data_faults: read it, copy it to go on with it."""
    root = shared.shared_root(tmp_path_factory, pytestconfig)

    def train_it(model_dir):
        from tfgpu import train  # noqa: PLC0415 (TensorFlow's work: only when asked)
        from tfgpu.config import config_from, validate  # noqa: PLC0415

        values = dict(FAULTS_RUN, data_dir=small_dataset, model_dir=str(model_dir))
        train.run(validate(config_from(strategy="default", **values)))

    return str(shared.made_once(root / "faults-run", train_it))


def final_weights(model_dir) -> dict[str, np.ndarray]:
    """Every array of ``model_dir/final.weights.h5`` by its path in the file, in file order
    (compare two with ``weights.assert_same_weights``)."""
    return named_weights(model_dir)


def run_summary(model_dir) -> dict:
    """``model_dir/summary.json``, the finished run's summary (what ``train.run`` returns)."""
    with open(os.path.join(model_dir, "summary.json"), encoding="utf-8") as f:
        return json.load(f)


def assert_one_all_reduce_per_update(model_dir, updates: int) -> None:
    """The run in ``model_dir`` all-reduced its gradients once per update: ``updates`` in all,
    however many micro-batches, replicas or processes."""
    assert run_summary(model_dir)["gradient_all_reduces"] == updates, "one per update"


def as_train_command(config, actions=()) -> int:
    """tfgpu-train's exit code for ``config`` (with the run's ``actions``), in this process:
    ``train.run`` ended as the command ends it (``run_command`` with its translation: a
    TfgpuError or a translated TensorFlow error becomes one line on stderr and its code)."""
    from tfgpu import train  # noqa: PLC0415 (TensorFlow's work: only when asked)
    from tfgpu.cli.app import run_command  # noqa: PLC0415
    from tfgpu.train import op_errors  # noqa: PLC0415

    def command() -> None:  # as tfgpu-train's: the summary is not an exit code
        train.run(config, actions)

    return run_command(command, prog="tfgpu", translate=op_errors.translate)


def cli_flags(values: dict, **paths) -> list[str]:
    """Config-style values (and paths such as data_dir=...) as tfgpu.main flags."""
    out = [f"--{key}={value}" for key, value in paths.items()]
    for key, value in values.items():
        out.append(
            f"--{key}" if value is True else f"--no{key}" if value is False else f"--{key}={value}"
        )
    return out


@pytest.fixture
def horovodrun_tfgpu() -> list[str]:
    """The command prefix that runs tfgpu.main as 2 Horovod ranks on localhost (Gloo)."""
    requires("horovod")
    return [
        shutil.which("horovodrun", path=os.path.dirname(sys.executable)),
        "--gloo",
        "-np",
        "2",
        "-H",
        "localhost:2",
        sys.executable,
        "-m",
        "tfgpu.main",
    ]


def train_ds(spec, data, shard, batch, global_batch, *, seed=0, deterministic=False, **kw):
    """``pipeline.make_train_dataset`` with the positional arguments tests like (``kw``: the
    ``Stream``'s start_index and repeats, and name_broken)."""
    from tfgpu.data import pipeline  # noqa: PLC0415
    from tfgpu.data.stream import Stream  # noqa: PLC0415

    name_broken = kw.pop("name_broken", True)
    stream = Stream(batch, global_batch, seed, deterministic, **kw)
    return pipeline.make_train_dataset(spec, data, shard, stream, name_broken=name_broken)


def eval_ds(spec, data, shard, batch, global_batch):
    """``pipeline.make_eval_dataset`` with positional batch sizes."""
    from tfgpu.data import pipeline  # noqa: PLC0415

    return pipeline.make_eval_dataset(
        spec, data, shard, batch_size=batch, global_batch_size=global_batch
    )
