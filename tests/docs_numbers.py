"""Numbers in README.md and docs/ that come from committed outputs, tied to them.

A number taken from a committed JSON (or YAML) file is written after a marker naming the file
and the key: ``<!--= metrics/evaluate.json accuracy -->0.9875`` (dotted keys reach into nested
objects; an optional third word scales it: ``x100`` for a percentage, ``x-100`` for a drop
in points). The number keeps the
decimals it is written with. ``tests/test_docs.py`` fails when a number differs from its file;
after ``make run`` regenerated the files, rewrite the numbers with

    .venv/bin/python -m tests.docs_numbers --write
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(
    r"<!--= (?P<file>\S+) (?P<key>\S+)(?: (?P<scale>x-?\d+))? -->(?P<num>-?\d[\d,]*(?:\.\d+)?)"
)


def value(file: str, key: str) -> float:
    """The number at dotted ``key`` of the committed JSON or YAML ``file`` (relative to the
    repo); a mapping or list there counts its entries (``dvc.yaml stages``: the stages)."""
    text = (REPO / file).read_text()
    doc: Any = json.loads(text) if file.endswith(".json") else yaml.safe_load(text)
    for part in key.split("."):
        doc = doc[part]
    return float(len(doc)) if isinstance(doc, dict | list) else float(doc)


def formatted(match: re.Match[str]) -> str:
    """The file's number written as the doc writes it (same decimals, thousands commas)."""
    written = match["num"]
    decimals = len(written.split(".")[1]) if "." in written else 0
    number = value(match["file"], match["key"]) * (int(match["scale"][1:]) if match["scale"] else 1)
    text = f"{number:,.{decimals}f}" if "," in written else f"{number:.{decimals}f}"
    return text


def mismatches() -> list[str]:
    """One line per marked number that differs from its file: doc, line, written, file's."""
    out = []
    for path in DOCS:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for m in MARKER.finditer(line):
                want = formatted(m)
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
