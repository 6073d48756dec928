"""``python -m tfgpu.ray``: the ``tfgpu-ray`` command (tfgpu/cli/ray.py), kept at the
module path the docs give."""

from tfgpu.cli.ray import run

if __name__ == "__main__":
    run()
