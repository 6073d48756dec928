"""The test tiers stay honest: no fast test starts a process, and both tiers keep a sensible
size (the rule and its reasons are in conftest.py's docstring); a missing dependency skips
through ``requires`` alone, and fails under ``make test``."""

import dis
import importlib
import inspect
import pathlib
import re
import sys
import types

import conftest
import pytest
import requires

TESTS = pathlib.Path(__file__).parent
PATHS = sorted(TESTS.rglob("test_*.py"))  # tests/, tests/<package>/, tests/e2e/
MODULES = sorted(p.stem for p in PATHS)
# As pytest's default (prepend) import mode does for each test module: its folder on sys.path,
# the module imported by its basename (basenames are unique: see below).
for _folder in sorted({str(p.parent) for p in PATHS} - set(sys.path)):
    sys.path.append(_folder)
# Names a test's own code may not use in the fast tier, whatever its module imports.
PROCESS_NAMES = {"Popen", "executable", *conftest.PROCESS_FIXTURES}


def _marks(obj) -> list:
    marks = getattr(obj, "pytestmark", [])
    return marks if isinstance(marks, list) else [marks]


def _tests(module) -> list:
    """(name, function, tier) of every test function of ``module``."""
    out = []
    module_marks = {m.name for m in _marks(module)}
    for name, func in vars(module).items():
        if name.startswith("test_") and inspect.isfunction(func):
            explicit = (module_marks | {m.name for m in _marks(func)}) & set(conftest.TIERS)
            fixtures = inspect.signature(func).parameters
            out.append((name, func, conftest.tier(explicit, module, fixtures)))
    return out


def _code_names(code: types.CodeType) -> tuple[set, set]:
    """The global names and the attribute names ``code`` (and code nested in it) loads."""
    globals_, attributes = set(), set()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            globals_.add(ins.argval)
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "IMPORT_FROM"):
            attributes.add(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            more = _code_names(const)
            globals_ |= more[0]
            attributes |= more[1]
    return globals_, attributes


def _names_used(func, module) -> set:
    """The names ``func`` uses, following the module's own helpers and the fixtures it
    requests."""
    seen, todo, names = set(), [func], set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        globals_, attributes = _code_names(f.__code__)
        follow = globals_ | set(inspect.signature(f).parameters)
        names |= follow | attributes
        for name in follow:
            value = vars(module).get(name)
            value = getattr(value, "_get_wrapped_function", lambda v=value: v)()  # a fixture
            if inspect.isfunction(value) and value.__module__ == module.__name__:
                todo.append(value)
    return names


def _process_names(module) -> set:
    """The module's names that are process helpers (``subprocess``, ``popen`` ...)."""
    helpers = {name for name, value in vars(module).items() if conftest.is_process_helper(value)}
    return helpers | PROCESS_NAMES


@pytest.mark.parametrize("module_name", MODULES)
def test_no_fast_test_starts_a_process(module_name):
    module = importlib.import_module(module_name)
    process_names = _process_names(module)
    for name, func, tier in _tests(module):
        if tier == "fast":
            used = _names_used(func, module) & process_names
            assert not used, f"{module_name}::{name} is fast but uses {sorted(used)}: mark it slow"


def test_test_modules_mirror_the_packages_with_unique_basenames():
    """Every test module is in tests/ (the suite's own rules and tfgpu's top-level modules),
    tests/<package>/ for a package of tfgpu (tests/docs/ for the documentation), or
    tests/e2e/ (real processes and clusters). pytest imports tests/<package>/test_x.py as
    module ``test_x`` (no __init__.py): two of one name would clash."""
    assert len(MODULES) == len(set(MODULES)), sorted(m for m in MODULES if MODULES.count(m) > 1)
    root = pathlib.Path(conftest.__file__).parents[1] / "tfgpu"
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    for path in PATHS:
        folder = path.parent.relative_to(TESTS).parts
        assert folder in ((), ("e2e",), ("docs",)) or folder[0] in packages, path


def test_the_rule_sees_the_modules_that_start_processes_or_train():
    modules = {m: importlib.import_module(m) for m in MODULES}
    starts = {m for m, module in modules.items() if conftest.module_starts_processes(module)}
    trains = {m for m, module in modules.items() if conftest.module_trains(module)}
    for name in "test_cluster test_distribute test_hangs test_multihost test_slurm_job".split():
        assert name in starts
    for name in ["test_train", "test_input_diagnosis", "test_step", "test_mirrored_equals_default"]:
        assert name in trains
    for name in ["test_records", "test_preprocess", "test_models", "test_tiers"]:
        assert name not in starts | trains


def test_every_training_helper_the_rule_names_exists():
    """The rule names its training helpers by where they live: when one moves, this fails
    instead of the tests that use it silently turning fast."""
    for qualified in conftest.TRAINING_HELPERS:
        module_name, _, attribute = qualified.rpartition(".")
        try:
            module = importlib.import_module(qualified)
        except ImportError:
            module = getattr(importlib.import_module(module_name), attribute)
        assert conftest._qualified_name(module) == qualified, qualified


def test_both_tiers_keep_a_sensible_size():
    tiers = [t for m in MODULES for _, _, t in _tests(importlib.import_module(m))]
    fast, slow = tiers.count("fast"), tiers.count("slow")
    # Today 107 fast and 74 slow test functions: the fast tier is most of what needs no process,
    # and is not everything.
    assert fast >= 60 and slow >= 60, (fast, slow)
    assert fast < len(tiers) and slow < len(tiers)


# --- requires: a missing dependency skips, and fails where every one is installed ----------


@pytest.fixture
def absent(monkeypatch):
    """A dependency that is never there."""
    monkeypatch.setitem(requires.DEPENDENCIES, "absent", lambda: "no absent: apt-get it")
    requires.missing.cache_clear()
    yield "absent"
    requires.missing.cache_clear()


def test_a_missing_dependency_skips_saying_how_to_get_it(absent, monkeypatch):
    monkeypatch.delenv(requires.REQUIRE_ALL_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="requires absent: no absent: apt-get it"):
        requires.requires(absent)


def test_a_missing_dependency_fails_where_all_are_required(absent, monkeypatch):
    monkeypatch.setenv(requires.REQUIRE_ALL_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="requires absent: no absent"):
        requires.requires(absent)
    with pytest.raises(KeyError, match="not one of"):
        requires.requires("no_such_dependency")


class _Report:
    def __init__(self, skipped=True, **attributes):
        self.skipped = skipped
        vars(self).update(attributes)


class _Item:
    def __init__(self, heavy):
        self.heavy = heavy

    def get_closest_marker(self, name):
        return object() if name == "heavy" and self.heavy else None


def test_under_make_test_any_skip_but_the_heavy_tiers_is_a_failure(monkeypatch):
    monkeypatch.delenv(conftest.HEAVY_ENV, raising=False)
    monkeypatch.setenv(requires.REQUIRE_ALL_ENV, "1")
    assert conftest._skip_is_a_gap(_Report(), _Item(heavy=False))
    assert conftest._skip_is_a_gap(_Report())  # a module that skipped itself
    assert not conftest._skip_is_a_gap(_Report(), _Item(heavy=True))
    assert not conftest._skip_is_a_gap(_Report(wasxfail=""), _Item(heavy=False))
    assert not conftest._skip_is_a_gap(_Report(skipped=False), _Item(heavy=False))
    monkeypatch.setenv(conftest.HEAVY_ENV, "1")  # make test-heavy: nothing may skip
    assert conftest._skip_is_a_gap(_Report(), _Item(heavy=True))
    monkeypatch.setenv(requires.REQUIRE_ALL_ENV, "0")  # make test-fast, plain pytest
    assert not conftest._skip_is_a_gap(_Report(), _Item(heavy=False))


SKIPS = re.compile(r"pytest\.skip\(|importorskip\(|mark\.skipif\(|mark\.skip\(")


def test_every_skip_goes_through_requires():
    """One place says what a test needs (tests/requires.py); a skip written elsewhere would
    be invisible to ``make test``'s rule."""
    for path in sorted(TESTS.rglob("*.py")):
        if path.name not in ("requires.py", "conftest.py", "test_tiers.py"):
            found = SKIPS.findall(path.read_text(encoding="utf-8"))
            assert not found, f"{path.relative_to(TESTS)}: {found}: use requires(...)"
