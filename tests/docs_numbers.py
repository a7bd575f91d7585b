"""Numbers in README.md and docs/ that come from committed outputs, tied to them.

A number taken from a committed JSON (or YAML) file is written after a marker naming the file
and the key: ``<!--= metrics/evaluate.json accuracy -->0.9875`` (dotted keys reach into nested
objects; an optional third word scales it: ``x100`` for a percentage, ``x-100`` for a drop
in points). The number keeps the
decimals it is written with. ``tests/test_docs.py`` fails when a number differs from its file;
after ``make run`` regenerated the files, rewrite the numbers with

    .venv/bin/python -m tests.docs_numbers --write

The test compares the docs and the files as committed (``git show HEAD:...``): a user's own
``make run`` rewrites ``metrics/`` with this machine's timings, and ``make test`` after it must
still pass. Without ``--write``, this module checks the working tree (after ``--write``, before
a commit).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(
    r"<!--= (?P<file>\S+) (?P<key>\S+)(?: (?P<scale>x-?\d+))? -->(?P<num>-?\d[\d,]*(?:\.\d+)?)"
)


Reader = Callable[[str], str]  # a file's text by its path relative to the repo


def worktree(rel: str) -> str:
    return (REPO / rel).read_text()


def committed() -> Reader:
    """The files as committed (HEAD); the working tree's outside a git checkout or for a file
    git does not track."""
    cache: dict[str, str] = {}

    def read(rel: str) -> str:
        if rel not in cache:
            proc = subprocess.run(
                ["git", "show", f"HEAD:{rel}"], cwd=REPO, capture_output=True, text=True
            )
            cache[rel] = proc.stdout if proc.returncode == 0 else worktree(rel)
        return cache[rel]

    return read


def value(file: str, key: str, read: Reader = worktree) -> float:
    """The number at dotted ``key`` of the JSON or YAML ``file`` (relative to the repo); a
    mapping or list there counts its entries (``dvc.yaml stages``: the stages)."""
    text = read(file)
    doc: Any = json.loads(text) if file.endswith(".json") else yaml.safe_load(text)
    for part in key.split("."):
        doc = doc[part]
    return float(len(doc)) if isinstance(doc, dict | list) else float(doc)


def formatted(match: re.Match[str], read: Reader = worktree) -> str:
    """The file's number written as the doc writes it (same decimals, thousands commas)."""
    written = match["num"]
    decimals = len(written.split(".")[1]) if "." in written else 0
    scale = int(match["scale"][1:]) if match["scale"] else 1
    number = value(match["file"], match["key"], read) * scale
    text = f"{number:,.{decimals}f}" if "," in written else f"{number:.{decimals}f}"
    return text


def mismatches(read: Reader = worktree) -> list[str]:
    """One line per marked number that differs from its file: doc, line, written, file's
    (the docs and the files as ``read`` gives them)."""
    out = []
    for path in DOCS:
        for lineno, line in enumerate(read(path.relative_to(REPO).as_posix()).splitlines(), 1):
            for m in MARKER.finditer(line):
                want = formatted(m, read)
                if want != m["num"]:
                    out.append(
                        f"{path.relative_to(REPO)}:{lineno}: {m['num']} but "
                        f"{m['file']} {m['key']} gives {want}"
                    )
    return out


def write() -> list[Path]:
    """Rewrite every marked number from its file; the docs changed."""
    changed = []
    for path in DOCS:
        text = path.read_text()
        new = MARKER.sub(lambda m: m[0][: -len(m["num"])] + formatted(m), text)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the numbers from the files")
    args = parser.parse_args(argv)
    if args.write:
        for path in write():
            sys.stdout.write(f"rewrote {path.relative_to(REPO)}\n")
        return 0
    problems = mismatches()
    sys.stdout.write("\n".join(problems) + ("\n" if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
