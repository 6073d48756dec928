"""``python -m tfgpu.distribute.hvdrun``: the ``tfgpu-horovodrun`` command
(tfgpu/cli/horovodrun.py), kept at the module path the docs give. It runs the command as
``__main__`` instead of importing it, so that distribute/, below cli/, imports nothing from
above."""

import runpy

if __name__ == "__main__":
    runpy.run_module("tfgpu.cli.horovodrun", run_name="__main__", alter_sys=True)
