"""``python -m tfgpu.average``: the documented module path of ``tfgpu-average``
(``tfgpu.cli.average``)."""

from tfgpu.cli.average import run

if __name__ == "__main__":
    run()
