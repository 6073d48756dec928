"""``python -m tfgpu.report``: the documented module path of ``tfgpu-report``
(``tfgpu.cli.report``)."""

from tfgpu.cli.report import run

if __name__ == "__main__":
    run()
