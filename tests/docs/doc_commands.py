"""The shell commands README.md, CONTRIBUTING.md and docs/ give, read as a new user would type
them (tests/docs/test_doc_commands.py checks them with ``doc_checks.problems``).

``commands()`` extracts them: every line of a ``bash``/``sh``/unlabelled code block (its
continuation lines and multi-line quotations joined) that starts with a program tfgpu's pages
mean (python, tfgpu-*, make, bash, pip, the launchers), and every inline code span that does;
with what the block exported before it (TF_CONFIG). Also what the checks compare with: the
console scripts, the extras and the Makefile's rules.
"""

import configparser
import dataclasses
import pathlib
import re
import shlex


ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_BLOCKS = ("bash", "sh", "shell", "")
# The first word of a line that is a command tfgpu's pages mean (not an output line).
PROGRAMS = re.compile(
    r"^(?:[A-Z_]+=\S+\s+)*(?:python3?|\.venv/bin/python|tfgpu-[a-z-]+|make|bash|pip|mpirun|"
    r"horovodrun|srun)(?=\s|$)"
)
INLINE = re.compile(
    r"`((?:python3? |\.venv/bin/python |tfgpu-[a-z-]+(?=[ `])|make |mpirun |horovodrun |srun )"
    r"[^`]*)`"
)
# Top-level folders of the repository: a path that starts with one must exist.
REPO_DIRS = ("flags", "tools", "bench", "docs", "tests", "tfgpu", ".ci")
# A value a page leaves to the reader: N, DIR, HOST:PORT, FILE.weights.h5, RUN/..., ...
PLACEHOLDER = re.compile(r"^(?:\.\.\.|…|[A-Z][A-Z0-9_]*(?:[:./|][\w.*/|]*)*)$")
# The launchers that start a tfgpu command, and the variables each sets for a process of 2.
LAUNCHER_ENV = {
    "mpirun": {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"},
    "horovodrun": {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"},
    "tfgpu-horovodrun": {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"},
    "srun": {
        "SLURM_PROCID": "0",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    },
}
LAUNCHER_VARIABLES = (
    "TF_CONFIG",
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "PMI_SIZE",
    "PMI_RANK",
    "MV2_COMM_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS",
)


@dataclasses.dataclass(frozen=True)
class Command:
    where: str  # page:line
    text: str  # as the page gives it (continuations joined)
    environ: tuple = ()  # (name, value) the block exported before it (TF_CONFIG)
    inline: bool = False  # an inline code span: often a fragment


def commands() -> list[Command]:
    """Every command of the pages, in page order."""
    found = []
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        text = page.read_text(encoding="utf-8")
        found += _block_commands(name, text)
        for number, line in enumerate(text.splitlines(), 1):
            if not line.startswith(("    ", "```")):
                found += [Command(f"{name}:{number}", m, inline=True) for m in INLINE.findall(line)]
    return found


def _block_commands(name: str, text: str) -> list[Command]:
    out, lang, lines, environ = [], None, [], {}
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.fullmatch(r"\s*```(\w*)\s*", line)
        if fence:
            lang, environ = (fence.group(1), {}) if lang is None else (None, {})
            continue
        if lang not in SHELL_BLOCKS:
            continue
        lines.append((number, line))
        start, joined = lines[0][0], " ".join(part.rstrip().rstrip("\\") for _, part in lines)
        if line.rstrip().endswith("\\") or _open_quote(joined):
            continue
        lines = []
        exported = re.match(r"^export (\w+)=(.*)$", joined.strip())
        if exported:
            environ[exported.group(1)] = _unquote(exported.group(2))
        elif PROGRAMS.match(joined.strip()):
            out.append(Command(f"{name}:{start}", joined.strip(), tuple(environ.items())))
    return out


def _open_quote(text: str) -> bool:
    """Whether ``text`` ends inside a quotation (a value that goes on on the next line)."""
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return True
    return False


def _unquote(text: str) -> str:
    words = shlex.split(text, comments=True)
    return " ".join(words)


def words(command: Command) -> list[str]:
    """The command's words, comments dropped, ``<a placeholder of words>`` one ``...``."""
    text = re.sub(r"<[^<>]*>", "...", command.text)
    return shlex.split(text, comments=True)


def console_scripts() -> dict:
    """{script: "module:function"} of setup.cfg."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    lines = setup["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict(tuple(part.strip() for part in line.split("=")) for line in lines)


def extras() -> set:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return set(setup["options.extras_require"])


def make_targets() -> dict:
    """{target: its recipe lines and prerequisites, as text} of the Makefile's rules."""
    rules, current = {}, None
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        rule = re.match(r"^([\w.-]+(?:\s+[\w.-]+)*)\s*:(?!=)\s*(.*)$", line)
        if rule and not line.startswith("\t"):
            current = rule.group(1).split()
            for target in current:
                rules.setdefault(target, rule.group(2).strip())
        elif line.startswith("\t") and current:
            for target in current:
                rules[target] += "\n" + line.strip()
        elif not line.strip().startswith("#"):
            current = None if line.strip() == "" else current
    return rules


def phony_targets() -> list:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split()
