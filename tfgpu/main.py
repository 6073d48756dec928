"""``python -m tfgpu.main``: the ``tfgpu-train`` command (tfgpu/cli/train.py), kept at the
module path the docs give."""

from tfgpu.cli.train import run

if __name__ == "__main__":
    run()
