"""What is wrong with one command of the pages (``problems``), checked as far as it can be
without training: a tfgpu command's flags through the command's own parsing and the checks it
runs before TensorFlow starts (``CHECKS``: tfgpu-train's Config and its launcher check, the
converter's flag checks, ...), under the launcher's environment (mpirun's, horovodrun's,
srun's, a TF_CONFIG the page exported); files of the repository and flagfiles that do not
exist, make targets that are not there, extras setup.cfg lacks. A command that leaves a value
to the reader (``...``, ``N``, ``DIR``, ``<tfgpu flags>``) gets its flag names checked only.

Paths a user picks (``--data_dir=/data/imagenet-tfr``, ``--model_dir=runs/r50``) are replaced
by empty stand-ins (``StandIns``): no check reads or writes a user's folders.
"""

import contextlib
import dataclasses
import os
import re
from unittest import mock

from absl import flags
from doc_commands import (
    LAUNCHER_ENV,
    LAUNCHER_VARIABLES,
    PLACEHOLDER,
    REPO_DIRS,
    ROOT,
    Command,
    console_scripts,
    extras,
    make_targets,
    words,
)

from tfgpu.errors import TfgpuError

# The documented module paths -> the command they run (the others: tfgpu-<name>).
MODULES = {
    "tfgpu.main": "tfgpu-train",
    "tfgpu.launch": "tfgpu-launch",
    "tfgpu.ray": "tfgpu-ray",
    "tfgpu.evaluate": "tfgpu-evaluate",
    "tfgpu.predict": "tfgpu-predict",
    "tfgpu.export": "tfgpu-export",
    "tfgpu.average": "tfgpu-average",
    "tfgpu.report": "tfgpu-report",
    "tfgpu.distribute.hvdrun": "tfgpu-horovodrun",
    "tfgpu.data.service_server": "tfgpu-data-service",
}
SCRIPTS = {"tools/to_tfrecord.py": "tfgpu-to-tfrecord"}
# Flags whose value is a folder or file the user picks: replaced by stand-ins.
USER_PATHS = (
    "data_dir",
    "model_dir",
    "output_dir",
    "output",
    "work_dir",
    "tfds_data_dir",
    "tensorboard_dir",
)
PYTHON = re.compile(r"^(?:python3?|\S*/python3?)$")


@dataclasses.dataclass(frozen=True)
class StandIns:
    """What a user's paths are replaced by: ``folder`` (an empty folder, for the ones that must
    exist) and ``fresh`` (a path that does not exist yet, under which nothing is written)."""

    folder: str
    fresh: str


class Partial(Exception):
    """The command leaves something to the reader: only its flag names can be checked."""


def problems(command: Command, stand_ins: StandIns) -> list[str]:
    """What is wrong with ``command`` (checked as far as it can be without training), each
    as one line; [] when nothing is."""
    try:
        argv = words(command)
    except ValueError as err:
        return [f"not shell words: {err}"]
    environ = dict(command.environ)
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        name, _, value = argv.pop(0).partition("=")
        environ[name] = value
    found = [f"{p} does not exist" for p in _repo_paths(argv) if not (ROOT / p).exists()]
    return found + _check(argv, environ, command.inline, stand_ins)


def _repo_paths(argv: list) -> list:
    paths = []
    for word in argv:
        value = word.partition("=")[2] if word.startswith("-") else word
        if value.startswith(tuple(f"{d}/" for d in REPO_DIRS)) and not PLACEHOLDER.match(value):
            paths.append(value.rstrip(","))
    return paths


def _check(argv: list, environ: dict, partial: bool, stand_ins: StandIns) -> list[str]:
    """Problems of ``argv`` (the program first) run with ``environ``."""
    if not argv:
        return []
    program, args = argv[0], argv[1:]
    if program == "make":
        rules = make_targets()
        wanted = [a for a in args if not a.startswith("-") and "=" not in a] or ["demo"]
        return [f"make {t}: no such target" for t in wanted if not rules.get(t, "").strip()]
    if program == "pip":
        named = {m for a in args for m in re.findall(r"^\.\[([\w,-]+)\]$", a)}
        return [f"setup.cfg has no extra [{e}]" for e in named if e not in extras()]
    if program in LAUNCHER_ENV:
        return _launched(program, args, environ, partial, stand_ins)
    if PYTHON.match(program):
        return _python(args, environ, partial, stand_ins)
    if program.startswith("tfgpu-"):
        if program not in console_scripts():
            return [f"{program} is not a console script of setup.cfg"]
        return _tfgpu(program, args, environ, partial, stand_ins)
    return []


def _launched(program, args, environ, partial, stand_ins) -> list[str]:
    """A launcher's command line: the tfgpu command in it, in the environment it gets."""
    inner = next((i for i, a in enumerate(args) if PYTHON.match(a) or a.startswith("tfgpu-")), None)
    problems_ = []
    if program == "tfgpu-horovodrun" and program not in console_scripts():
        problems_.append(f"{program} is not a console script of setup.cfg")
    if inner is None:
        return problems_
    launched = dict(environ, **LAUNCHER_ENV[program])
    if "-np" in args[:inner]:
        size = args[args.index("-np") + 1]
        launched = {k: size if k.endswith("SIZE") else v for k, v in launched.items()}
    return problems_ + _check(args[inner:], launched, partial, stand_ins)


def _python(args, environ, partial, stand_ins) -> list[str]:
    if args[:1] == ["-m"] and len(args) > 1:
        module, rest = args[1], args[2:]
        if module == "pytest":
            tests = [a.split("::")[0] for a in rest if a.startswith("tests/")]
            return [f"{t} does not exist" for t in tests if not (ROOT / t).exists()]
        if module in MODULES:
            return _tfgpu(MODULES[module], rest, environ, partial, stand_ins)
        if module.startswith("tfgpu"):
            return [f"python -m {module}: no such command"]
        return []
    if args and args[0] in SCRIPTS:
        return _tfgpu(SCRIPTS[args[0]], args[1:], environ, partial, stand_ins)
    return []


def _tfgpu(command: str, args: list, environ: dict, partial: bool, stand_ins) -> list[str]:
    """A tfgpu command's problems: its flag names when ``partial`` or when the command leaves
    something open, else its flags through its own checks (``CHECKS``)."""
    fv = command_flags(command)
    unknown = [n for n in _flag_names(args) if not _is_flag(fv, n)]
    if unknown:
        return [f"{command}: no flag --{', --'.join(unknown)}"]
    if partial or command not in CHECKS or any(a.lstrip("-").startswith("help") for a in args):
        return []
    try:
        given = _stand_in(args, stand_ins)
        with _environment(environ):
            CHECKS[command](given, stand_ins)
    except Partial:
        return []
    except (flags.Error, TfgpuError, ValueError, OSError) as err:
        line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "pip install '.[" in line:  # an optional part the page installs first
            return []
        return [f"{command}: {line}"]
    return []


ABSL_FLAGS = {"flagfile", "help", "helpfull", "helpshort", "helpxml", "undefok"}


def _is_flag(fv: flags.FlagValues, name: str) -> bool:
    """Whether ``--name`` is a flag of ``fv`` (``--noNAME`` for a boolean NAME) or absl's."""
    if name in fv or name in ABSL_FLAGS:
        return True
    return name.startswith("no") and name[2:] in fv and fv[name[2:]].boolean


def _flag_names(args: list) -> list:
    """The flags ``args`` name (``--name``, ``--name=value``, ``[--name]``, ``--noname``), up
    to a ``--`` that ends them."""
    names = []
    for arg in args[: args.index("--")] if "--" in args else args:
        arg = arg.strip("[]")
        if arg.startswith("--") and len(arg) > 2:
            names.append(arg[2:].split("=")[0])
    return names


def command_flags(command: str) -> flags.FlagValues:
    """A FlagValues of ``command``'s own flags (tfgpu-train's: every trainer flag and the
    side-car's), as the command defines them."""
    from tfgpu.cli import sidecar
    from tfgpu.cli.flags import define_flags

    fv = flags.FlagValues()
    if command == "tfgpu-train":
        define_flags(fv)
        sidecar.define_flags(fv)
    elif command != "tfgpu-horovodrun":
        define_flags(fv, command)
    return fv


def _stand_in(args: list, stand_ins: StandIns) -> list:
    """``args`` with a user's paths replaced by stand-ins; Partial when a value is left to the
    reader (a placeholder that is not such a path)."""
    out = []
    for arg in args:
        name, equals, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if name in USER_PATHS and equals:
            kind = stand_ins.folder if name == "data_dir" else stand_ins.fresh
            out.append(f"--{name}={kind}")
        elif PLACEHOLDER.match(value if equals else arg) or arg.startswith("["):
            raise Partial(arg)
        else:
            out.append(arg)
    return out


@contextlib.contextmanager
def _environment(environ: dict):
    """os.environ with no launcher's variables but ``environ``'s."""
    kept = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    with mock.patch.dict(os.environ, dict(kept, **environ), clear=True):
        yield


def _parsed(command: str, args: list) -> flags.FlagValues:
    """``args`` parsed into ``command``'s flags; positional arguments are not its."""
    fv = command_flags(command)
    rest = fv([command, *args])[1:]
    if rest:
        raise flags.Error(f"unexpected arguments: {' '.join(rest)}")
    return fv


def _train(args: list, stand_ins: StandIns) -> None:
    """What tfgpu-train checks before TensorFlow starts: its Config, and whether the strategy
    joins the processes the launcher started (``env.check_launch``)."""
    from tfgpu.cli.train import make_config
    from tfgpu.distribute import env

    fv = _parsed("tfgpu-train", args)
    if env.is_evaluator():
        return  # the side-car evaluator: its --model_dir is all it reads
    with mock.patch("tfgpu.demo.build_demo_dataset", return_value=stand_ins.folder):
        config = make_config(fv, argv=["tfgpu", *args])
    env.check_launch(config.dist.strategy)


def _launch(args: list, stand_ins: StandIns) -> None:
    from tfgpu.cli import launch
    from tfgpu.cli.flags import command_settings

    split = args.index("--") if "--" in args else len(args)
    settings, _ = command_settings("tfgpu-launch", _parsed("tfgpu-launch", args[:split]))
    tf_config = launch.tf_configs(settings.num_workers)[0]
    with mock.patch.dict(os.environ, {"TF_CONFIG": tf_config}):
        _train(args[split + 1 :], stand_ins)


def _ray(args: list, stand_ins: StandIns) -> None:
    from tfgpu.cli import ray

    _, tfgpu_args = ray.parse(args)
    with mock.patch("tfgpu.demo.build_demo_dataset", return_value=stand_ins.folder):
        ray.make_config(tfgpu_args)


def _convert(args: list, stand_ins: StandIns) -> None:
    from tfgpu.cli import convert
    from tfgpu.cli.flags import command_settings

    settings, _ = command_settings("tfgpu-to-tfrecord", _parsed("tfgpu-to-tfrecord", args))
    convert._check_flags(settings)


def _positional(command: str):
    """A command whose arguments are its flags and its positional inputs (folders, files)."""

    def check(args: list, stand_ins: StandIns) -> None:
        command_flags(command)([command, *args])

    return check


CHECKS = {
    "tfgpu-train": _train,
    "tfgpu-launch": _launch,
    "tfgpu-ray": _ray,
    "tfgpu-to-tfrecord": _convert,
    "tfgpu-evaluate": lambda args, _: _parsed("tfgpu-evaluate", args),
    "tfgpu-export": lambda args, _: _parsed("tfgpu-export", args),
    "tfgpu-average": lambda args, _: _parsed("tfgpu-average", args),
    "tfgpu-data-service": lambda args, _: _parsed("tfgpu-data-service", args),
    "tfgpu-predict": _positional("tfgpu-predict"),
    "tfgpu-report": _positional("tfgpu-report"),
}
