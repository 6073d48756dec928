"""How every tfgpu command starts and ends: absl parses its flags (flagfiles read ahead first),
``--help`` exits 0 as command-line tools do, and a TfgpuError (or an error the command knows
how to translate) becomes one line on stderr and its exit code (docs/faults.md: the table).
"""

import sys

from absl import app, flags

from tfgpu.errors import TfgpuError, UsageError, say
from tfgpu.files import check_flagfiles

# absl prints usage for these and exits 1; command-line tools exit 0 when asked for help.
HELP_FLAGS = ("-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml")


def report(err: TfgpuError, prog: str = "tfgpu") -> int:
    """Prints ``err`` as its one line on stderr (``say``); returns its exit code."""
    say(err.line(prog))
    return err.exit_code


def run_command(command, *args, prog: str = "tfgpu", translate=None) -> int:
    """``command(*args)``'s exit code (None is 0), with a TfgpuError (or an error that
    ``translate(err)`` turns into one; None: not ours) reported as its one line and code.
    absl's flag errors are usage errors."""
    try:
        return command(*args) or 0
    except TfgpuError as err:
        return report(err, prog)
    except flags.Error as err:
        return report(UsageError((str(err).strip().splitlines() or [""])[0]), prog)
    except Exception as err:
        known = translate(err) if translate else None
        if known is None:
            raise
        return report(known, prog)


def asked_for_help(argv) -> bool:
    """Whether ``argv`` asks for help (before a ``--`` that ends the flags)."""
    flags_part = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
    return any(a in HELP_FLAGS or a.startswith("--helpxml=") for a in flags_part)


def show_key_flags(*modules: str) -> None:
    """Makes --help list the key flags of ``modules`` (the command's module, the group its
    settings' flags are defined in): absl lists those of the program as started
    (sys.argv[0]), which for a console script or a ``python -m`` alias is neither."""
    for module in modules:
        for flag in flags.FLAGS.get_key_flags_for_module(module):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def run_app(main, prog: str, doc: str | None = None, group: str = "") -> None:
    """absl's ``app.run(main)`` for a command called ``prog``, after reading ahead the
    ``--flagfile``s absl will read: absl would hang on a FIFO there and end in a traceback on
    bytes that are not UTF-8; this exits with one line instead (files.check_flagfiles).
    Help exits 0 (absl's own convention is 1), begins with ``doc``, the command's usage, and
    lists its flags (``show_key_flags``: those of ``group``, its settings' flags, ``prog``
    when empty)."""
    if doc:
        # absl's help prints the __main__ module's docstring: a console script's has none,
        # and `python -m tfgpu.main` runs an alias; the command's own usage either way.
        sys.modules["__main__"].__doc__ = doc
    show_key_flags(main.__module__, group or prog)
    code = run_command(check_flagfiles, sys.argv, prog=prog)
    if code:
        sys.exit(code)
    try:
        app.run(main)
    except SystemExit as stop:
        if stop.code == 1 and asked_for_help(sys.argv):
            sys.exit(0)
        raise
