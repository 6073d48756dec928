# The two commands of the README. Both set everything up on a fresh machine (a virtualenv in
# .venv with tfgpu and TensorFlow; `make test` also Open MPI, sshd and iproute2 from the
# system's packages, then Horovod with MPI and Gloo, built once and cached).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Re-install when the dependencies change.
STAMP := $(VENV)/.tfgpu-$(shell cat setup.cfg setup.py | cksum | cut -d' ' -f1)

# Python's bytecode caches (__pycache__, ignored by git) are written when the tests run: where
# the environment sets PYTHONDONTWRITEBYTECODE, each process the suite starts compiled tfgpu
# again and pytest rewrote every test module's asserts again (measured: 8.2 -> 6.2 CPU-s to
# collect the fast tier, per xdist worker; 4.6 -> 4.2 CPU-s per tfgpu process a test starts).
unexport PYTHONDONTWRITEBYTECODE

# jemalloc, where the system has it (Debian's libjemalloc2; `make system` installs it), preloaded
# into every process of the tests: TensorFlow's import and tracing allocate millions of small
# short-lived blocks, which it serves with less CPU than glibc's malloc (bench/malloc.py, quiet:
# a 6-update run 1.10x less CPU, on two workers 1.08x), and the suite's processes are mostly
# such short runs (make test's figures with and without: bench/README.md). Not for the demo:
# the steps of a longer run are no faster (0.99x). Looked up when a recipe runs, after
# `system`. `make test JEMALLOC=`: without.
JEMALLOC ?= $(firstword $(shell ls /usr/lib/*/libjemalloc.so.2 /usr/lib/libjemalloc.so.2 \
	/usr/local/lib/libjemalloc.so.2 2>/dev/null))
PRELOAD = $(if $(JEMALLOC),LD_PRELOAD=$(JEMALLOC)$${LD_PRELOAD:+:$$LD_PRELOAD})

.PHONY: demo test test-serial test-heavy test-fast test-fast-bare install horovod system ray export report hub mlflow mlflow-server
demo: install
	$(PY) -m tfgpu.main --strategy=mirrored

# On three pytest-xdist workers for 2 cores: many tests wait on processes they started (the hang
# scenarios wait out their 60-s bounds, Ray's cluster starts), and a third worker fills those
# waits (measured on 2 quiet cores, 2026-12-07: 665.5 s of pytest on two workers, 628.7 s on
# three, 1,100 and 1,138 CPU-s). A module's tests stay on one worker (its shared runs happen
# once); tests/conftest.py's spread hands out the modules that start processes first.
XDIST := -n 3 --dist loadfile --no-loadscope-reorder
# The fast tier is CPU-bound in-process work: a third worker would only collect once more.
XDIST_FAST := -n 2 --dist loadfile --no-loadscope-reorder
# These targets install every dependency the tests use (tests/requires.py), so a test that
# finds one missing fails instead of skipping; `make test REQUIRE_ALL=0` where the system
# packages cannot be installed (no root). Only the opt-in heavy tier skips.
REQUIRE_ALL ?= 1
ALL := TFGPU_REQUIRE_ALL=$(REQUIRE_ALL)
test: system install horovod ray export report hub mlflow mlflow-server
	$(ALL) $(PRELOAD) $(PY) -m pytest -q $(XDIST) --durations=25 tests

# The same in one process (a failure's output reads in order).
test-serial: system install horovod ray export report hub mlflow mlflow-server
	$(ALL) $(PRELOAD) $(PY) -m pytest -q --durations=25 tests

# Everything, with the opt-in heavy tests too (tests/conftest.py: HEAVY_ENV).
test-heavy: system install horovod ray export report hub mlflow mlflow-server
	$(ALL) TFGPU_HEAVY_TESTS=1 $(PRELOAD) $(PY) -m pytest -q $(XDIST) --durations=25 tests

# The fast tier (tests/conftest.py): the package tests that start no process and train for no
# seconds (tests/e2e/, the runs of real processes, is left out); no Horovod or Ray needed. On
# two workers (each module's fixtures once, on one of them).
test-fast: install
	$(PRELOAD) $(PY) -m pytest -q -m fast --ignore=tests/e2e $(XDIST_FAST) tests

# The fast tier in a virtualenv of its own that never had Horovod, Ray, MLflow, matplotlib or
# the export runtimes: what a user has after `pip install .` (CI runs it before `make test`).
BARE_VENV ?= .venv-bare
test-fast-bare:
	$(MAKE) test-fast VENV=$(BARE_VENV)

install: $(STAMP)

$(STAMP): setup.cfg setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# Before Horovod: with Open MPI present, Horovod is built with its MPI controller too.
system:
	bash tools/install_system_packages.sh

horovod: install
	PYTHON=$(PY) bash tools/install_horovod.sh

# Ray Train, the [ray] extra: tests/e2e/test_ray.py runs tfgpu-ray on a local Ray cluster.
ray: $(STAMP)-ray

# LiteRT and ONNX for tfgpu-export, the [export] extra: tests/inference/test_export_formats.py runs them.
export: $(STAMP)-export

# matplotlib for tfgpu-report, the [report] extra: tests/report/test_report.py draws its pages.
report: $(STAMP)-report

# KerasHub, the [hub] extra: --model=hub:... (tests/models/test_own_models.py builds its ViT).
hub: $(STAMP)-hub

# MLflow's client, the [mlflow] extra: --mlflow_tracking_uri (docs/reports.md).
mlflow: $(STAMP)-mlflow

# Each extra above, installed once per set of dependencies (its stamp beside $(STAMP)).
$(addprefix $(STAMP)-,ray export report hub mlflow): $(STAMP)-%: $(STAMP)
	$(PY) -m pip install -q -e '.[$*]'
	touch $@

# A real `mlflow server` for tests/e2e/test_mlflow.py, in a venv of its own: the full mlflow
# package (Flask, SQLAlchemy, scikit-learn, matplotlib, pyarrow, ...) stays out of tfgpu's.
MLFLOW_VENV ?= .venv-mlflow
mlflow-server: $(MLFLOW_VENV)/.installed

$(MLFLOW_VENV)/.installed:
	test -x $(MLFLOW_VENV)/bin/python || $(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/python -m pip install -q 'mlflow>=3.1,<4'
	touch $@
