"""``python -m tfgpu.evaluate``: the documented module path of ``tfgpu-evaluate``
(``tfgpu.cli.evaluate``)."""

from tfgpu.cli.evaluate import run

if __name__ == "__main__":
    run()
