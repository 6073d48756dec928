"""What may be imported before TensorFlow starts: ``--help``, a bad flag and the converter
never wait for TensorFlow (checked in fresh interpreters, through ``sys.modules``)."""

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

import tfgpu

HEAVY = ("tensorflow", "keras", "tensorflow_datasets", "horovod")


def _modules_after(code: str, names: tuple = HEAVY) -> set:
    """Those of ``names`` (the heavy modules) a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {names!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(out.stdout.split())


def _main(*argv: str, env: dict | None = None):
    """Runs ``tfgpu.main`` with ``argv`` in a fresh interpreter (``env`` added to the
    environment); (exit code, stderr, heavy)."""
    code = (
        "import sys\n"
        "from absl import app\n"
        "import tfgpu.cli.train as m\n"
        f"sys.argv = ['tfgpu', *{list(argv)!r}]\n"
        "try:\n"
        "    app.run(m.main)\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "print('exit', code, file=sys.stderr)\n"
        f"print('heavy', *[m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, **(env or {})),
    )
    lines = out.stderr.splitlines()
    code_line = next(line for line in reversed(lines) if line.startswith("exit "))
    heavy = next(line for line in reversed(lines) if line.startswith("heavy")).split()[1:]
    return int(code_line.split()[1] or 0), out.stderr + out.stdout, set(heavy)


@pytest.mark.parametrize(
    "flag, shown", [("--help", "USAGE"), ("--helpfull", "--global_batch_size")]
)
def test_help_returns_without_tensorflow(flag, shown):
    code, output, heavy = _main(flag)
    assert code == 1 and shown in output  # absl exits 1 after printing help
    assert heavy == set()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model=resnet5"], "--model='resnet5' is unknown"),
        (["--optimizer=adamm"], "--optimizer='adamm' is unknown"),
        (["--global_batch_size=10", "--grad_accum_steps=3"], "does not divide"),
        (["--global_batch_size=abc"], "global_batch_size"),
        (["--no_such_flag"], "no_such_flag"),
        (["--model=densenet121", "--layer_lr_decay=0"], "--layer_lr_decay=0.0 must be in (0, 1]"),
    ],
)
def test_a_bad_flag_is_reported_without_tensorflow(argv, message):
    code, output, heavy = _main(*argv)
    assert code != 0 and message in output, output[-2000:]
    assert heavy == set()


@pytest.mark.parametrize(
    "strategy, env, message",
    [
        ("horovod", {}, "--strategy=horovod must run under horovodrun or mpirun"),
        ("multi_worker_mirrored", {"TF_CONFIG": "{not json"}, "TF_CONFIG is malformed"),
        ("mirrored", {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, "2 separate"),
        ("auto", {"HOROVOD_RANK": "one", "HOROVOD_SIZE": "2"}, "HOROVOD_RANK='one' is not"),
    ],
)
def test_a_launch_that_cannot_be_one_job_is_reported_without_tensorflow(
    strategy, env, message, tmp_path
):
    """What the environment alone decides (env.check_launch) is said before TensorFlow's
    import, and before anything is written."""
    run = tmp_path / "run"
    code, output, heavy = _main(
        f"--strategy={strategy}", "--synthetic_data", f"--model_dir={run}", env=env
    )
    assert code == 2 and message in output and "Traceback" not in output, output[-2000:]
    assert heavy == set() and not run.exists()


LIGHT_MODULES = [
    "tfgpu.config",
    "tfgpu.train.config",
    "tfgpu.models.config",
    "tfgpu.data.curriculum",
    "tfgpu.cli.flags",
    "tfgpu.settings",
    "tfgpu.imagenet",
    "tfgpu.batches",
    "tfgpu.metrics",
    "tfgpu.data.recordformat",
    "tfgpu.errors",
    "tfgpu.data.service_server",
    "tfgpu.cli.data_service",
    "tfgpu.models",
    "tfgpu.optim",
    "tfgpu.checkpoint",
    "tfgpu.checkpoint.best",
    "tfgpu.results",
    "tfgpu.results.tracking",
    "tfgpu.results.runlock",
    "tfgpu.distribute",
    "tfgpu.distribute.env",
    "tfgpu.main",
    "tfgpu.cli.train",
    "tfgpu.launch",
    "tfgpu.cli.launch",
    "tfgpu.ray",
    "tfgpu.cli.ray",
    "tfgpu.distribute.ray_train",
    "tfgpu.config.rundir",
    "tfgpu.inference",
    "tfgpu.inference.export",  # says what can be exported before TensorFlow starts
    "tfgpu.cli.head",
    "tfgpu.cli.evaluate",
    "tfgpu.cli.sidecar",
    "tfgpu.cli.predict",
    "tfgpu.cli.average",
    "tfgpu.cli.export",
    "tfgpu.evaluate",
    "tfgpu.average",
    "tfgpu.predict",
    "tfgpu.export",
    "tfgpu.export.__main__",
    "tfgpu.cli.report",
    "tfgpu.report",
    "tfgpu.report.write",  # TensorFlow only once a run is evaluated
    "tfgpu.cli.convert",
    "tfgpu.convert.plan",
    "tfgpu.convert.worker",
    "tfgpu.convert.encode",
    "tfgpu.convert.inputs.folders",
    "tfgpu.convert.inputs.hdf5",
    "tfgpu.convert.inputs.tfds_input",
    "tfgpu.convert.inputs.lmdb_input",
    "tfgpu.convert.inputs.caffe_datum",
]


def test_light_modules_import_no_tensorflow():
    """Each light module imported in turn in one fresh interpreter, the heavy modules looked for
    after each: the first that brings one is named. A module's import only adds to
    sys.modules, and none is heavy before it, so one that brings none here brings none
    alone."""
    code = (
        "import importlib, sys\n"
        "for module in " + repr(LIGHT_MODULES) + ":\n"
        "    importlib.import_module(module)\n"
        "    heavy = [m for m in " + repr(HEAVY) + " if m in sys.modules]\n"
        "    if heavy:\n"
        "        print(module, 'imports', *heavy)\n"
        "        break\n"
    )
    assert _modules_after(code, ()) == set()


def test_a_training_run_imports_no_scipy():
    """The train command, TensorFlow as it imports it and the loop leave scipy out (~0.3
    CPU-s of each process the suite starts): the converter, which the command imports for the
    demo dataset, imports it where it searches, and TensorFlow's own legacy tf.keras, which
    tries it, finds it hidden (quiet.HIDDEN_WHILE_IMPORTING)."""
    code = "import tfgpu.cli.train\nfrom tfgpu.cli import quiet\nquiet.import_tensorflow()\n"
    code += "import tfgpu.train.loop"
    assert _modules_after(code, ("tensorflow", "scipy")) == {"tensorflow"}


def _imported(path: pathlib.Path) -> set:
    """Every module ``path`` imports (at its top or inside a function), as dotted names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"  # tfgpu imports absolutely
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


# What one package may import of another at most (tests below): the converter writes the
# reader's record format and takes nothing else of it; the reader takes nothing of the converter.
SHARED = {("convert", "data"): ("tfgpu.data.recordformat",), ("data", "convert"): ()}


@pytest.mark.parametrize("package, other", sorted(SHARED))
def test_the_converter_and_the_reader_share_only_the_record_format(package, other):
    root = pathlib.Path(tfgpu.__file__).parent
    allowed = SHARED[package, other]
    wrong = {
        f"{path.relative_to(root.parent)}: {name}"
        for path in (root / package).rglob("*.py")
        for name in _imported(path)
        if (name == f"tfgpu.{other}" or name.startswith(f"tfgpu.{other}."))
        and not any(name == a or name.startswith(f"{a}.") for a in allowed)
    }
    assert not wrong, f"tfgpu.{package} imports more of tfgpu.{other}: {sorted(wrong)}"


# The house's layers, top to bottom: a module may import its own layer's or lower ones', never
# a higher one's (at its top or inside a function). CONTRIBUTING.md draws the same picture.
LAYERS = (
    ("cli", "main", "evaluate", "average", "predict", "export", "ray", "launch"),  # commands
    ("report",),  # runs as an HTML page: their files, and their checkpoints evaluated
    ("config",),  # every package's section composed; a run's config.json read back
    ("train",),  # the conductor (loop.run, handed the Config) and the run's parts
    ("inference",),  # uses of a trained model: evaluator, predict, export, side-car
    ("checkpoint", "results"),  # a run's checkpoints and its network; a run's files
    ("step",),  # one update and what runs compiled
    ("optim",),  # optimizers, schedules, fine-tuning groups
    ("models", "convert", "demo"),  # the registry and the nets; the converter; the demo dataset
    ("data",),  # the reader, and the record format it reads (which the converter writes)
    ("distribute",),  # launchers, strategies, backends
    ("errors", "settings", "imagenet", "batches", "metrics", "compat", "files"),
)


def _unit(path: pathlib.Path, root: pathlib.Path) -> str:
    """The layer's unit of a module: its package under tfgpu/, or the module itself."""
    dotted = ".".join(path.relative_to(root).with_suffix("").parts)
    return _unit_of(dotted)


def _unit_of(dotted: str) -> str:
    """The layer's unit of module ``dotted`` (under tfgpu, without the ``tfgpu.``)."""
    return dotted.split(".")[0]


def _layout_names() -> tuple[set, str]:
    """(the names in the second column of CONTRIBUTING.md's layout picture, the whole picture)."""
    text = (pathlib.Path(tfgpu.__file__).parents[1] / "CONTRIBUTING.md").read_text()
    picture = text.split("## Layout", 1)[1].split("```")[1]
    names = {
        line[13:29].split()[0].rstrip("/") for line in picture.splitlines() if line[13:29].strip()
    }
    return names, picture


def _is_alias(path: pathlib.Path) -> bool:
    """A ``python -m`` alias: a few lines that import one command from tfgpu.cli."""
    source = path.read_text()
    return "from tfgpu.cli." in source and len(source.splitlines()) <= 10


def test_the_layout_picture_names_every_top_level_package_and_nothing_else():
    """CONTRIBUTING's picture and README's: every package and module under tfgpu/ is named (an
    alias anywhere in the picture), and every name there is a package or module that exists."""
    root = pathlib.Path(tfgpu.__file__).parent
    names, picture = _layout_names()
    units = {
        p.name.removesuffix(".py")
        for p in root.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    units -= {"__init__"}
    aliases = {u for u in units if (root / f"{u}.py").exists() and _is_alias(root / f"{u}.py")}
    aliases |= {
        u
        for u in units
        if (root / u / "__main__.py").exists() and _is_alias(root / u / "__main__.py")
    }
    assert names <= units, f"CONTRIBUTING names what is not there: {sorted(names - units)}"
    assert units - aliases <= names, f"CONTRIBUTING leaves out {sorted(units - aliases - names)}"
    unnamed = [a for a in aliases if not re.search(rf"\b{a}\b", picture)]
    assert not unnamed, f"CONTRIBUTING leaves out the aliases {unnamed}"
    readme = (root.parent / "README.md").read_text()
    shown = set(re.findall(r"(?<![\w/.])tfgpu/([a-z_]+)/", readme))
    packages = {u for u in units - aliases if (root / u).is_dir()}
    assert shown <= units, f"README names what is not there: {sorted(shown - units)}"
    assert packages <= shown, f"README leaves out {sorted(packages - shown)}"


def test_every_import_runs_down_the_layers():
    root = pathlib.Path(tfgpu.__file__).parent
    layer = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}
    units = {_unit(p, root) for p in root.rglob("*.py")} - {"__init__"}
    assert units == set(layer), f"put {sorted(units ^ set(layer))} in a layer"
    up = []
    for path in root.rglob("*.py"):
        unit = _unit(path, root)
        for name in _imported(path):
            parts = name.split(".")
            target = _unit_of(".".join(parts[1:])) if parts[0] == "tfgpu" else ""
            if target in layer and unit in layer:
                if layer[target] < layer[unit]:
                    up.append(f"{path.relative_to(root.parent)} imports {name}")
    assert not up, "imports that run up the layers:\n" + "\n".join(sorted(up))


# A line TensorFlow wrote: its C++ and Python (absl) logs' "W1205 04:10:04.76 ..." heads, and
# the places its lines name.
TF_LOG_LINE = re.compile(r"^[IWE]\d{4} .*$|^.*(?:dataset\.cc|tensorflow/).*$", re.M)


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory):
    """The demo dataset's folder, shared by the module's demo runs: the first (auto) writes
    the dataset (~1.4 CPU-s, its lines checked there), the next reads it."""
    return tmp_path_factory.mktemp("demo-cache")


@pytest.mark.parametrize("strategy", ["auto", "one_device"])
def test_a_demo_run_with_evaluations_prints_no_tensorflow_line(tmp_path, demo_cache, strategy):
    """The demo as a user starts it (no TF_CPP_MIN_LOG_LEVEL, no dataset flag), cut to 4
    updates with an evaluation after every 2: every line is tfgpu's. Under one_device,
    tf.distribute used to feed each iterator through a MultiDeviceIterator, and tf.data
    logged "dataset.cc: Input of GeneratorDatasetOp::Dataset will not be optimized" for the
    train batches and evaluations (``StrategyBackend.distribute_dataset``)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["TFGPU_CACHE_DIR"] = str(demo_cache)
    argv = [sys.executable, "-m", "tfgpu.main", f"--model_dir={tmp_path / 'run'}"]
    argv += ["--train_steps=4", "--eval_every_steps=2", "--log_every_steps=2", "--export=false"]
    argv += [f"--strategy={strategy}"]
    out = subprocess.run(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-3000:]
    assert len(re.findall(r"^eval  step [24]: top1", out.stdout, re.M)) == 2, out.stdout[-3000:]
    assert not TF_LOG_LINE.findall(out.stdout), out.stdout[-3000:]


def test_only_tensorflows_start_up_notices_are_dropped():
    from tfgpu.cli import quiet

    notices = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1796156518.651110   13822 cudart_stub.cc:31] Could not find cuda drivers",
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow "
        "with the appropriate compiler flags.",
    ]
    cuinit = "E0000 00:00:17.64 13822 cuda_platform.cc:52] failed call to cuInit: INTERNAL: (303)"
    assert all(quiet._is_noise(line, has_driver=True) for line in notices)
    assert quiet._is_noise(cuinit, has_driver=False)
    assert not quiet._is_noise(cuinit, has_driver=True)  # a GPU machine: that is news
    for line in ["W0000 00:00:17.1 1 x.cc:1] a warning", "tfgpu: error: x", "Traceback (most"]:
        assert not quiet._is_noise(line, has_driver=False)


@pytest.mark.fast  # in-process
def test_a_module_hidden_while_tensorflow_imports_is_importable_after(tmp_path, monkeypatch):
    from tfgpu.cli import quiet

    (tmp_path / "tfgpu_hidden_probe.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with quiet._hidden(("tfgpu_hidden_probe", "os")):
        with pytest.raises(ImportError):
            import tfgpu_hidden_probe  # noqa: F401
        import os as still_there  # imported before: untouched

        assert still_there is os
    import tfgpu_hidden_probe

    assert tfgpu_hidden_probe.VALUE == 7
    del sys.modules["tfgpu_hidden_probe"]


@pytest.mark.fast  # in-process
def test_tensorflows_import_runs_without_the_cycle_collector_and_is_frozen_after(monkeypatch):
    import gc

    from tfgpu.cli import quiet

    monkeypatch.delitem(sys.modules, "tensorflow")  # as before the first import
    before = gc.get_freeze_count()
    with quiet._importing():
        assert not gc.isenabled()
        built = [[] for _ in range(100)]  # what an import leaves behind
    assert gc.isenabled() and gc.get_freeze_count() >= before + len(built)
