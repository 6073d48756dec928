#!/usr/bin/env bash
# tools/install_horovod.sh - install Horovod 0.28.1 into the current Python
# environment, built from source against the TensorFlow that is installed
# there, with a wheel cache so the slow build (~3.5 min on 2 cores) happens
# only once per version combination.
#
# Usage:
#   bash tools/install_horovod.sh            # install (no-op if already working)
#   bash tools/install_horovod.sh --check    # ... then run a 2-rank Gloo allreduce
#
# What it does:
#   1. If `horovod` (version 0.28.1) is importable AND `horovod.tensorflow`
#      loads its compiled ops against the installed TF (hvd.init(); hvd.size()
#      works in a single process), exit 0 right away.
#   2. If a wheel for the cache key (below) is cached, `pip install --no-deps`
#      it plus Horovod's runtime deps (cloudpickle psutil pyyaml packaging).
#   3. Otherwise build it: make sure CMake 3.x is available (pip installs
#      "cmake<4" if `cmake` is missing or 4.x), `pip download` the 0.28.1
#      sdist, patch it (below), `pip wheel --no-build-isolation` it against the
#      installed TF with MAKEFLAGS=-j$(nproc), copy the wheel atomically into
#      the cache (temp name + mv), and install it.
#   4. With --check: `horovodrun --gloo -np 2 -H localhost:2` an allreduce of
#      a tensor, each rank printing the result.
#
# The patch and why:
#   Horovod 0.28.1 (the last release) lists horovod/tensorflow/xla_mpi_ops.cc
#   in TF_SOURCES in horovod/tensorflow/CMakeLists.txt. That file includes
#   TF/XLA headers that have since moved, so it no longer compiles against
#   current TF (2.21). It only provides the optional XLA custom-call ops
#   (HOROVOD_ENABLE_XLA_OPS), so the script deletes exactly the line
#       list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")
#   with sed, and fails loudly if that line is not found (i.e. the sdist
#   changed and the patch needs re-checking).
#
# Build settings: HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1, HOROVOD_WITH_MPI=1 where an
#   MPI compiler wrapper (mpicxx, from Debian's libopenmpi-dev) is found, else
#   HOROVOD_WITHOUT_MPI=1; HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1,
#   CMAKE_POLICY_VERSION_MINIMUM=3.5 (needed by CMake 4, harmless with 3.x),
#   HOROVOD_CMAKE=<the cmake found/installed>.
#
# Environment variables:
#   PYTHON              Python interpreter of the target env (default: python)
#   TFGPU_CACHE_DIR     cache root (default: $HOME/.cache/tfgpu); wheels go to
#                       $TFGPU_CACHE_DIR/wheels/<key>/
#   TFGPU_HOROVOD_GPU   "nccl" to build with HOROVOD_GPU_OPERATIONS=NCCL.
#                       Needs the CUDA toolkit (nvcc) and NCCL headers/libs
#                       present at build time; set HOROVOD_NCCL_HOME (and
#                       HOROVOD_CUDA_HOME if needed) when they are not in a
#                       standard location. This mode is UNTESTED: it cannot be
#                       built or run on the CPU-only dev/CI machines.
#                       Default (unset / "cpu"): CPU only, Gloo collectives.
#   TFGPU_HOROVOD_MPI   "auto" (default): build the MPI controller too where mpicxx is on
#                       PATH, so `mpirun -np N python -m tfgpu.main` (Kubeflow's MPIJob) is
#                       one Horovod job; "0": Gloo only; "1": MPI required.
#   TFGPU_HOROVOD_VERBOSE=1  stream the full build log instead of a summary.
#
# Cache key:
#   horovod-<hvd ver>_tf-<installed tf ver>_<python tag>_<os>_<machine>_<cpu|nccl>_<gloo|mpi-VER>
#   e.g. ~/.cache/tfgpu/wheels/horovod-0.28.1_tf-2.21.0_cp311_linux_x86_64_cpu_mpi-4.1.4/
#   Delete that directory to force a rebuild.
set -euo pipefail

HOROVOD_VERSION=0.28.1
PYTHON="${PYTHON:-python}"
CACHE_ROOT="${TFGPU_CACHE_DIR:-$HOME/.cache/tfgpu}"
GPU_MODE="${TFGPU_HOROVOD_GPU:-cpu}"
MPI_MODE="${TFGPU_HOROVOD_MPI:-auto}"

log() { echo "[install_horovod] $*"; }
die() { echo "[install_horovod] ERROR: $*" >&2; exit 1; }

DO_CHECK=0
for arg in "$@"; do
  case "$arg" in
    --check) DO_CHECK=1 ;;
    -h|--help) sed -n '2,/^set -euo pipefail/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $arg (usage: $0 [--check])" ;;
  esac
done

case "$GPU_MODE" in
  cpu|"") GPU_MODE=cpu ;;
  nccl) export HOROVOD_GPU_OPERATIONS=NCCL ;;
  *) die "TFGPU_HOROVOD_GPU must be 'nccl' or unset/'cpu', got '$GPU_MODE'" ;;
esac

case "$MPI_MODE" in
  auto) if command -v mpicxx >/dev/null 2>&1; then WITH_MPI=1; else WITH_MPI=0; fi ;;
  1) command -v mpicxx >/dev/null 2>&1 || die "TFGPU_HOROVOD_MPI=1 but mpicxx is not on PATH (apt-get install libopenmpi-dev)"; WITH_MPI=1 ;;
  0) WITH_MPI=0 ;;
  *) die "TFGPU_HOROVOD_MPI must be auto, 0 or 1, got '$MPI_MODE'" ;;
esac
if [[ "$WITH_MPI" == 1 ]]; then
  # The MPI version is part of the cache key: Horovod links against that libmpi.
  MPI_TAG="mpi-$(mpirun --version 2>/dev/null | sed -n '1s/.* \([0-9][0-9.]*\)$/\1/p')"
  [[ "$MPI_TAG" != "mpi-" ]] || MPI_TAG="mpi-unknown"
else
  MPI_TAG=gloo
fi

command -v "$PYTHON" >/dev/null 2>&1 || die "python interpreter '$PYTHON' not found"
# Absolute interpreter path + its bin dir (for horovodrun / pip-installed cmake).
PY_EXE="$("$PYTHON" -c 'import sys; print(sys.executable)')"
PY_BIN="$(dirname "$PY_EXE")"
PIP=("$PY_EXE" -m pip --disable-pip-version-check)

# Quiet TF's C++ logging in the checks below.
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

horovod_works() {
  # Version matches and the TF op library loads against the installed TF.
  # timeout: hvd.init() must not hang if e.g. stale HOROVOD_* env is around.
  # With MPI built in, it must be the MPI this script would build against (the mpi_built
  # check makes an older Gloo-only install rebuild once Open MPI is installed).
  timeout 180 "$PY_EXE" - "$HOROVOD_VERSION" "$WITH_MPI" >/dev/null 2>&1 <<'EOF'
import sys
import horovod
assert horovod.__version__ == sys.argv[1], horovod.__version__
import horovod.tensorflow as hvd
assert int(hvd.mpi_built()) == int(sys.argv[2]), "mpi_built differs"
hvd.init()
assert hvd.size() >= 1
EOF
}

run_check() {
  [[ "$DO_CHECK" == 1 ]] || return 0
  local hvdrun="$PY_BIN/horovodrun"
  [[ -x "$hvdrun" ]] || hvdrun="$(command -v horovodrun || true)"
  [[ -n "$hvdrun" ]] || die "horovodrun not found"
  log "check: horovodrun --gloo -np 2 -H localhost:2 (allreduce)"
  local t0=$SECONDS
  "$hvdrun" --gloo -np 2 -H localhost:2 "$PY_EXE" -c '
import horovod.tensorflow as hvd, tensorflow as tf
hvd.init()
x = tf.constant([1.0, 2.0]) * float(hvd.rank() + 1)
s = hvd.allreduce(x, op=hvd.Sum)
print("rank %d/%d: allreduce(sum)=%s" % (hvd.rank(), hvd.size(), s.numpy().tolist()), flush=True)
assert s.numpy().tolist() == [3.0, 6.0], s
'
  log "check OK ($((SECONDS - t0))s)"
}

# ---- 1. already installed and working? --------------------------------------
if horovod_works; then
  log "horovod $HOROVOD_VERSION already installed and working in $PY_EXE"
  run_check
  exit 0
fi

# ---- cache key ---------------------------------------------------------------
TF_VERSION="$("$PY_EXE" -c 'import importlib.metadata as m
for d in ("tensorflow", "tensorflow-cpu", "tf-nightly"):
    try:
        print(m.version(d)); break
    except m.PackageNotFoundError:
        pass' 2>/dev/null || true)"
[[ -n "$TF_VERSION" ]] || die "tensorflow is not installed in $PY_EXE (pip install it first)"
PY_TAG="$("$PY_EXE" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
PLAT="$("$PY_EXE" -c 'import platform; print(platform.system().lower() + "_" + platform.machine())')"
KEY="horovod-${HOROVOD_VERSION}_tf-${TF_VERSION}_${PY_TAG}_${PLAT}_${GPU_MODE}_${MPI_TAG}"
CACHE_DIR="$CACHE_ROOT/wheels/$KEY"
RUNTIME_DEPS=(cloudpickle psutil pyyaml packaging)

install_wheel() {
  log "installing $(basename "$1")"
  "${PIP[@]}" install -q "${RUNTIME_DEPS[@]}"
  "${PIP[@]}" install -q --no-deps --force-reinstall "$1"
}

cached_wheel() {
  compgen -G "$CACHE_DIR/horovod-${HOROVOD_VERSION}-*.whl" | head -n 1 || true
}

# ---- 2. cached wheel? --------------------------------------------------------
WHEEL="$(cached_wheel)"
if [[ -n "$WHEEL" ]]; then
  log "using cached wheel ($CACHE_DIR)"
  install_wheel "$WHEEL"
  horovod_works || die "cached wheel installed but horovod.tensorflow does not work; delete $CACHE_DIR to rebuild"
  log "done"
  run_check
  exit 0
fi

# ---- 3. build ------------------------------------------------------------------
log "no cached wheel for $KEY; building from source (takes a few minutes)"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/install_horovod.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# CMake 3.x (prefer the one next to the interpreter, e.g. a pip-installed one).
find_cmake() {
  if [[ -x "$PY_BIN/cmake" ]]; then echo "$PY_BIN/cmake"; else command -v cmake || true; fi
}
CMAKE_BIN="$(find_cmake)"
CMAKE_VER=""
[[ -n "$CMAKE_BIN" ]] && CMAKE_VER="$("$CMAKE_BIN" --version 2>/dev/null | sed -n 's/^cmake version \([0-9.]*\).*/\1/p' || true)"
if [[ -z "$CMAKE_VER" || "${CMAKE_VER%%.*}" != 3 ]]; then
  log "cmake ${CMAKE_VER:-missing}; installing cmake<4 with pip"
  "${PIP[@]}" install -q "cmake>=3.13,<4"
  CMAKE_BIN="$(find_cmake)"
  CMAKE_VER="$("$CMAKE_BIN" --version | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')"
  [[ "${CMAKE_VER%%.*}" == 3 ]] || die "still no CMake 3.x (found '${CMAKE_VER}' at '$CMAKE_BIN')"
fi
log "cmake $CMAKE_VER ($CMAKE_BIN)"

log "downloading horovod==$HOROVOD_VERSION sdist"
"${PIP[@]}" download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$WORK/sdist" 2>&1 \
  | grep -v "is neither a file nor a directory" || true
SDIST="$(compgen -G "$WORK/sdist/horovod-${HOROVOD_VERSION}.tar.gz" | head -n 1 || true)"
[[ -n "$SDIST" ]] || die "pip download did not produce horovod-${HOROVOD_VERSION}.tar.gz"
mkdir -p "$WORK/src"
tar -xzf "$SDIST" -C "$WORK/src"
SRC="$WORK/src/horovod-$HOROVOD_VERSION"

log "patching horovod/tensorflow/CMakeLists.txt (drop xla_mpi_ops.cc)"
CML="$SRC/horovod/tensorflow/CMakeLists.txt"
XLA_LINE='list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")'
grep -Fxq "$XLA_LINE" "$CML" || die "patch failed: line not found in $CML: $XLA_LINE"
sed -i '/^list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}\/horovod\/tensorflow\/xla_mpi_ops\.cc")$/d' "$CML"
! grep -q 'xla_mpi_ops\.cc' "$CML" || die "patch failed: xla_mpi_ops.cc still referenced in $CML"

if [[ "$WITH_MPI" == 1 ]]; then
  export HOROVOD_WITH_MPI=1
else
  export HOROVOD_WITHOUT_MPI=1
fi
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 \
       HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
       CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_CMAKE="$CMAKE_BIN" \
       MAKEFLAGS="-j$(nproc)"
export PATH="$(dirname "$CMAKE_BIN"):$PATH"

log "building wheel against tensorflow $TF_VERSION (gpu mode: $GPU_MODE, $MPI_TAG, MAKEFLAGS=$MAKEFLAGS)"
BUILD_LOG="$WORK/build.log"
t0=$SECONDS
wheel_cmd=("${PIP[@]}" wheel -v --no-deps --no-build-isolation -w "$WORK/wheelhouse" "$SRC")
if [[ "${TFGPU_HOROVOD_VERBOSE:-0}" == 1 ]]; then
  "${wheel_cmd[@]}" 2>&1 | tee "$BUILD_LOG"
else
  if ! "${wheel_cmd[@]}" >"$BUILD_LOG" 2>&1; then
    echo "[install_horovod] build failed; last 80 lines of the log:" >&2
    tail -n 80 "$BUILD_LOG" >&2
    die "horovod wheel build failed"
  fi
fi
BUILT="$(compgen -G "$WORK/wheelhouse/horovod-${HOROVOD_VERSION}-*.whl" | head -n 1 || true)"
[[ -n "$BUILT" ]] || die "build finished but no wheel in $WORK/wheelhouse"
log "built $(basename "$BUILT") in $((SECONDS - t0))s"

mkdir -p "$CACHE_DIR"
tmp_whl="$CACHE_DIR/.tmp.$$.$(basename "$BUILT")"
cp "$BUILT" "$tmp_whl"
mv -f "$tmp_whl" "$CACHE_DIR/$(basename "$BUILT")"
log "cached in $CACHE_DIR/"

install_wheel "$CACHE_DIR/$(basename "$BUILT")"
horovod_works || die "horovod installed but 'import horovod.tensorflow; hvd.init()' fails"
log "done"
run_check
