"""``python -m tfgpu.report``: the ``tfgpu-report`` command (tfgpu/cli/report.py), kept at the
module path the docs give. It runs the command as ``__main__`` instead of importing it, so that
report/, below cli/, imports nothing from above."""

import runpy

if __name__ == "__main__":
    runpy.run_module("tfgpu.cli.report", run_name="__main__", alter_sys=True)
