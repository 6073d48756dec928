"""The documentation's relative links resolve: every ``](path)`` and ``](path#anchor)`` in
README.md, CONTRIBUTING.md, docs/**/*.md and bench/README.md names a file that exists, and an
anchor names a heading of that file (GitHub's rule: lowercase, punctuation dropped, spaces to
'-', a repeated heading gets -1, -2, ...). Reads files only: no process, no TensorFlow."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def doc_files() -> list[pathlib.Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "bench" / "README.md"]
    return files + sorted((ROOT / "docs").rglob("*.md"))


def prose_lines(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            seen.setdefault(f"{base}-{count}" if count else base, 1)
    return set(seen)


def links(path: pathlib.Path) -> list[tuple[int, str]]:
    out = []
    for number, line in prose_lines(path):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        for target in LINK.findall(line):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                out.append((number, target))
    return out


def test_slug_follows_github():
    assert slug("What a run leaves in `--model_dir`") == "what-a-run-leaves-in---model_dir"
    assert slug("Converting a dataset: `tools/to_tfrecord.py`") == (
        "converting-a-dataset-toolsto_tfrecordpy"
    )
    assert slug("Is the run input-bound?") == "is-the-run-input-bound"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
    broken = []
    for number, target in links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where}: no heading with that anchor")
    assert not broken, "\n".join(broken)
