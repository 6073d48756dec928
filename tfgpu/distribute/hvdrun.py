"""``python -m tfgpu.distribute.hvdrun``: the ``tfgpu-horovodrun`` command
(tfgpu/cli/horovodrun.py), kept at the module path the docs give."""

from tfgpu.cli.horovodrun import run

if __name__ == "__main__":
    run()
