"""``python -m tfgpu.data.service_server``: the ``tfgpu-data-service`` command
(tfgpu/cli/data_service.py), kept at the module path the docs give."""

from tfgpu.cli.data_service import run

if __name__ == "__main__":
    run()
