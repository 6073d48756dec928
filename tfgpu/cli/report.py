"""``tfgpu-report`` (``python -m tfgpu.report``): runs as one self-contained HTML page.

    tfgpu-report runs/a runs/b --output=report.html [--gallery=16] [--noevaluate]
        [--checkpoint=latest|best|PATH] [--split=validation]

``tfgpu.report`` says what the page holds and how each part is read.
"""

from tfgpu.cli import quiet
from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import command_settings, define_flags
from tfgpu.cli import head
from tfgpu.errors import UsageError, install_extra
from tfgpu.report.runs import read_runs
from tfgpu.train.op_errors import translate

PROG = "tfgpu-report"  # its flags: cli/settings.py ReportSettings


def main(argv):
    return run_command(lambda: _command(argv[1:]), prog=PROG, translate=translate)


def require_matplotlib() -> None:
    """Returns when matplotlib (the [report] extra) imports; else the UsageError saying how
    to install it."""
    try:
        import matplotlib  # noqa: F401, PLC0415 (the [report] extra: said in one line)
    except ImportError:
        raise UsageError(f"tfgpu-report draws with matplotlib: {install_extra('report')}") from None


def _command(paths) -> None:
    s, _ = command_settings(PROG)
    if not paths:
        raise UsageError("name one or more run folders (a training run's --model_dir)")
    if s.gallery < 0 or s.batch_size < 1:
        raise UsageError("--gallery must be 0 or more and --batch_size positive")
    require_matplotlib()
    runs = read_runs(paths)  # a folder that is no run: one line before TensorFlow starts
    if s.evaluate:
        quiet.import_tensorflow()
    from tfgpu.report.write import write_report  # noqa: PLC0415 (matplotlib: checked above)

    how = (s.checkpoint, s.split, s.gallery, s.batch_size)
    write_report(runs, s.output, s.evaluate, *how, open_run=head.open_run)


def run():
    """Console-script entry point (``tfgpu-report``)."""
    define_flags(command=PROG)
    run_app(main, prog=PROG, doc=__doc__)


if __name__ == "__main__":
    run()
