"""``python -m tfgpu.launch``: the ``tfgpu-launch`` command (tfgpu/cli/launch.py), kept at the
module path the docs give."""

from tfgpu.cli.launch import run

if __name__ == "__main__":
    run()
