"""``tfgpu-horovodrun`` (``python -m tfgpu.distribute.hvdrun``): horovodrun itself, same
arguments, but a failing rank ends the job with one line naming it, and its exit code
(horovodrun prints a traceback of its own and always exits 1), and the other ranks get 2 s
instead of 5 to stop after one fails.

    tfgpu-horovodrun --gloo -np 16 -H node1:8,node2:8 python -m tfgpu.main --strategy=horovod ...
"""

import re
import sys

from tfgpu import compat

# At import, not in main: horovodrun starts its helper processes with multiprocessing's
# "spawn", which imports this module again in each of them.
compat.set_horovod_termination_grace(2.0)


def main() -> int:
    """Runs horovodrun on sys.argv; returns the exit code of the first failing rank."""
    from horovod.runner.launch import run_commandline

    try:
        run_commandline()
    except RuntimeError as err:
        found = re.search(r"Process name: (\S+)\s+Exit code: (-?\d+)", str(err))
        if not found:
            raise
        rank, code = found.group(1), int(found.group(2))
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        print(
            f"tfgpu-horovodrun: rank {rank} failed first ({how}); the job stopped", file=sys.stderr
        )
        return 128 - code if code < 0 else code
    return 0


def run() -> None:
    """Console-script entry point (``tfgpu-horovodrun``)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
