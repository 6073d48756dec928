"""``tfgpu-horovodrun`` (``python -m tfgpu.distribute.hvdrun``): horovodrun itself, same
arguments, but a failing rank ends the job with one line naming it, and its exit code
(horovodrun prints a traceback of its own and always exits 1), the other ranks get 2 s
instead of 5 to stop after one fails, and it starts ~3 s sooner: whether Horovod was built with
Gloo or MPI is asked of its library, not of a process that imports TensorFlow
(tfgpu/distribute/horovod_build.py).

    tfgpu-horovodrun --gloo -np 16 -H node1:8,node2:8 python -m tfgpu.main --strategy=horovod ...

Horovod is built separately against the installed TensorFlow (bash tools/install_horovod.sh);
without it, --help says so and any other use stops with one line saying what to install.
"""

import importlib.util
import re
import sys

from tfgpu import compat
from tfgpu.cli.app import asked_for_help, report
from tfgpu.distribute import horovod_build
from tfgpu.errors import INSTALL_HOROVOD, UsageError

PROG = "tfgpu-horovodrun"
USAGE = f"usage: {PROG} [horovodrun's options: -np NUM_PROC -H HOSTS --gloo ...] COMMAND ..."


def horovod_installed() -> bool:
    return importlib.util.find_spec("horovod") is not None


# At import, not in main: horovodrun starts its helper processes with multiprocessing's
# "spawn", which imports this module again in each of them.
if horovod_installed():
    compat.set_horovod_termination_grace(2.0)


def main(argv: list[str]) -> int:
    """Runs horovodrun on ``argv``; returns the exit code of the first failing rank (without
    Horovod: 0 for --help, which says what to install, else the usage error's)."""
    if not horovod_installed():
        if asked_for_help(argv):
            print(
                f"{USAGE}\n\n{__doc__.strip()}\n\nHorovod is not installed here: {INSTALL_HOROVOD}"
            )
            return 0
        missing = f"Horovod is not installed: `{INSTALL_HOROVOD}` builds it for this TensorFlow"
        return report(UsageError(missing), PROG)
    from horovod.runner.launch import run_commandline  # noqa: PLC0415 (an optional part)

    compat.replace_horovod_build_checks(horovod_build.built_check)
    try:
        run_commandline()
    except RuntimeError as err:
        found = re.search(r"Process name: (\S+)\s+Exit code: (-?\d+)", str(err))
        if not found:
            raise
        rank, code = found.group(1), int(found.group(2))
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        print(f"{PROG}: rank {rank} failed first ({how}); the job stopped", file=sys.stderr)
        return 128 - code if code < 0 else code
    return 0


def run() -> None:
    """Console-script entry point (``tfgpu-horovodrun``)."""
    sys.exit(main(sys.argv))


if __name__ == "__main__":
    run()
