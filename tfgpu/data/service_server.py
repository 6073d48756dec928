"""``python -m tfgpu.data.service_server``: the ``tfgpu-data-service`` command
(tfgpu/cli/data_service.py), kept at the module path the docs give. It runs the command as
``__main__`` instead of importing it, so that data/, below cli/, imports nothing from above."""

import runpy

if __name__ == "__main__":
    runpy.run_module("tfgpu.cli.data_service", run_name="__main__", alter_sys=True)
