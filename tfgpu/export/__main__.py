"""``python -m tfgpu.export``: ``tfgpu-export`` (``tfgpu.cli.export``)."""

from tfgpu.cli.export import run

if __name__ == "__main__":
    run()
