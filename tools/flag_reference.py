#!/usr/bin/env python3
"""Writes docs/flags.md, the reference of every flag of ``python -m tfgpu.main``, from the
settings table (``tfgpu.cli.flags.reference_markdown``). Run it after adding or changing a
setting; tests/cli/test_flags.py fails while docs/flags.md is stale.

    python tools/flag_reference.py [--check]
"""

import pathlib
import sys

from tfgpu.cli.flags import reference_markdown

PATH = pathlib.Path(__file__).resolve().parents[1] / "docs" / "flags.md"


def main(argv: list[str]) -> int:
    text = reference_markdown()
    if "--check" in argv:
        current = PATH.read_text(encoding="utf-8") if PATH.exists() else ""
        if current != text:
            print(f"{PATH} is stale: run python tools/flag_reference.py", file=sys.stderr)
            return 1
        return 0
    PATH.parent.mkdir(exist_ok=True)
    PATH.write_text(text, encoding="utf-8")
    print(f"wrote {PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
