"""``python -m tfgpu.predict``: the documented module path of ``tfgpu-predict``
(``tfgpu.cli.predict``)."""

from tfgpu.cli.predict import run

if __name__ == "__main__":
    run()
