#!/usr/bin/env bash
# tools/install_system_packages.sh - the system packages the whole test suite uses, from
# Debian's packages: Open MPI (mpirun, and mpicxx so that tools/install_horovod.sh builds
# Horovod's MPI controller), sshd/ssh and iproute2 (tests/e2e/test_multihost.py's two hosts), and
# Zalando's Fashion-MNIST (dataset-fashion-mnist: real data with a public results table), and
# Chromium (tests/report/test_report.py opens tfgpu-report's page in it, headless), and
# jemalloc (the Makefile preloads it into the tests' processes: bench/malloc.py).
#
# Installs only what is missing, with apt-get as root or through password-less sudo. Without
# either it says so and exits 0: the tests that need a missing tool then fail under `make test`
# (which requires every dependency: tests/requires.py) and skip, saying why, under
# `make test REQUIRE_ALL=0` or plain pytest.
set -uo pipefail

have() { command -v "$1" >/dev/null 2>&1 || [[ -x "/usr/sbin/$1" ]]; }
missing=()
have mpirun || missing+=(openmpi-bin)
have mpicxx || missing+=(libopenmpi-dev)
have sshd || missing+=(openssh-server)
have ssh && have ssh-keygen || missing+=(openssh-client)
have ip || missing+=(iproute2)
# Fashion-MNIST's four IDX files (tests/e2e/test_fashion_mnist.py; the recipes in flags/).
[[ -d /usr/share/datasets/fashion-mnist ]] || missing+=(dataset-fashion-mnist)
have chromium || missing+=(chromium)
compgen -G '/usr/lib/*/libjemalloc.so.2' >/dev/null || missing+=(libjemalloc2)
[[ ${#missing[@]} -eq 0 ]] && exit 0

sudo=""
[[ "$(id -u)" == 0 ]] || sudo="sudo -n"
if command -v apt-get >/dev/null 2>&1 &&
  $sudo apt-get update -qq &&
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null; then
  echo "[system packages] installed ${missing[*]}"
else
  echo "[system packages] could not install ${missing[*]} (needs apt-get as root or" \
    "password-less sudo); the mpirun, multi-host, Fashion-MNIST and browser tests will fail" \
    "(make test REQUIRE_ALL=0 skips them)" >&2
fi
exit 0
