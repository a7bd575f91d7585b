"""README.md and docs/ tell the truth: every number marked as coming from a committed output
agrees with that file (tests/docs_numbers.py), and the gate error-rate table is what the
calibration simulation gives for the shipped params. The README is a front door: short, its
DAG drawn from the step declarations, its links and the docs index complete, and every command
in it and in docs/ runs from a fresh clone without activating the venv."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.kernel import dag
from components.kernel.step import STEPS, In, Out, Step, load
from tests import docs_numbers
from tests.conftest import REPO
from tests.test_gates import SEEN_FLIP_RATE, failure_rate, shipped_limits

README = REPO / "README.md"
DOCS = REPO / "docs"
INDEX = DOCS / "README.md"
README_MAX_LINES = 200


def test_marked_numbers_agree_with_their_committed_files():
    marked = sum(len(docs_numbers.MARKER.findall(p.read_text())) for p in docs_numbers.DOCS)
    assert marked >= 20, f"only {marked} marked numbers: were the markers dropped?"
    # as committed: a make run before make test rewrites metrics/ with this machine's timings
    problems = docs_numbers.mismatches(docs_numbers.committed())
    assert not problems, (
        "numbers in the docs differ from the committed outputs; after make run, rewrite "
        "them with .venv/bin/python -m tests.docs_numbers --write\n" + "\n".join(problems)
    )


def test_a_make_run_before_the_tests_leaves_the_committed_numbers_checked(tmp_path, monkeypatch):
    """A user's make run rewrites metrics/ (this CPU's timings): the docs are checked against
    the committed files, not the rewritten ones; the working tree still says what differs."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "metrics").mkdir()
    metrics, doc = tmp_path / "metrics" / "m.json", tmp_path / "README.md"
    metrics.write_text(json.dumps({"ratio": 0.79}))
    doc.write_text("latency ratio <!--= metrics/m.json ratio -->0.79\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "c"], cwd=tmp_path, check=True)
    metrics.write_text(json.dumps({"ratio": 0.89}))  # the user's run
    monkeypatch.setattr(docs_numbers, "REPO", tmp_path)
    monkeypatch.setattr(docs_numbers, "DOCS", [doc])
    assert docs_numbers.mismatches(docs_numbers.committed()) == []
    assert docs_numbers.mismatches() == ["README.md:1: 0.79 but metrics/m.json ratio gives 0.89"]


def test_a_stale_number_is_reported_and_rewritten(tmp_path, monkeypatch):
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "m.json").write_text(json.dumps({"a": {"acc": 0.98765}, "n": 1234}))
    doc = tmp_path / "README.md"
    doc.write_text(
        "accuracy <!--= metrics/m.json a.acc -->0.9926 on <!--= metrics/m.json n -->1,000 "
        "images, <!--= metrics/m.json a.acc x100 -->98.8 %\n"
    )
    monkeypatch.setattr(docs_numbers, "REPO", tmp_path)
    monkeypatch.setattr(docs_numbers, "DOCS", [doc])
    problems = docs_numbers.mismatches()
    assert problems == [
        "README.md:1: 0.9926 but metrics/m.json a.acc gives 0.9877",
        "README.md:1: 1,000 but metrics/m.json n gives 1,234",
    ]
    assert docs_numbers.write() == [doc]
    assert doc.read_text().startswith("accuracy <!--= metrics/m.json a.acc -->0.9877 on ")
    assert "-->1,234 images" in doc.read_text()
    assert docs_numbers.mismatches() == []


ROW = re.compile(r"^\| (?P<rate>[^|]+?) \| (?P<passes>[\d.]+) % \| (?P<fails>[\d.]+) % \|$")


@pytest.mark.parametrize("gate", ["qat", "register"])
def test_the_gate_error_rate_table_is_the_simulation_of_the_shipped_params(gate):
    """docs/gates.md's table: seeded, so the same on every CPU."""
    rows = [m for line in (REPO / "docs" / "gates.md").read_text().splitlines()
            if (m := ROW.match(line))]  # fmt: skip
    assert len(rows) == 3
    limits = shipped_limits()[gate]
    for row, flip in zip(rows, (SEEN_FLIP_RATE, 0.01, 0.02), strict=True):
        passes = 100 * (1 - failure_rate(limits, flip, 0.0))
        fails = 100 * failure_rate(limits, flip, 0.03)
        decimals = len(row["passes"].split(".")[1]) if "." in row["passes"] else 0
        assert f"{passes:.{decimals}f}" == row["passes"], (row["rate"], passes)
        decimals = len(row["fails"].split(".")[1]) if "." in row["fails"] else 0
        assert f"{fails:.{decimals}f}" == row["fails"], (row["rate"], fails)


# --------------------------------------------------------------------------- the front door


def test_the_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move some to docs/"
    top = "\n".join(lines[:5])
    assert re.search(r"^\s+make run\b", top, re.M) and re.search(r"^\s+make test\b", top, re.M), top
    assert "(docs/README.md)" in README.read_text(), "the README links the docs index"


def _edges(block: str) -> set[tuple[str, str, str, bool]]:
    """(from, port, to, dashed) of every arrow in a Mermaid block dag.mermaid wrote."""
    out = set()
    for m in re.finditer(r"^  (\w+) (-->|-\.->)\|([^|]*)\| (.+)$", block, re.M):
        for port in m[3].split(", "):
            for target in m[4].split(" & "):
                out.add((m[1], port, target.strip(), m[2] == "-.->"))
    return out


def test_the_readme_dag_is_drawn_from_the_step_declarations():
    text = README.read_text()
    block = dag.BLOCK.search(text)
    assert block, "README.md lost its <!-- dag ... --> ... <!-- /dag --> markers"
    assert block["body"] == dag.mermaid(), (
        "README.md's DAG differs from the STEP declarations; rewrite it with "
        ".venv/bin/python -m components.kernel.dag --write README.md"
    )
    # read back, the picture has an arrow for every declared input of every pipeline step
    drawn = _edges(block["body"])
    for name in STEPS:
        for port in load(name).inputs:
            assert port.source, f"{name}.{port.name} has no source"
            step, _, output = port.source.partition(".")
            assert (step, output, name, port.order_only) in drawn, (name, port.source)
    assert {d[2] for d in drawn} >= set(STEPS[1:]), "a step is missing from the picture"


def _noop() -> None:
    return None


def test_the_dag_draws_sources_waits_grouped_ports_and_files():
    a = Step("a", "", None, (), _noop, outputs=(Out("x", "out/a", "x"), Out("m", "m.json", "m")))
    b = Step(
        "b", "", None, (), _noop,
        inputs=(In("x", "out/a", "x", source="a.x"), In("m", "m.json", "m", source="a.m")),
        outputs=(Out("y", "out/b", "y"),),
    )  # fmt: skip
    c = Step(
        "c", "", None, (), _noop, inputs=(In("y", "out/b", "y", source="b.y", order_only=True),)
    )
    live = Step(
        "live", "", None, (), _noop,
        inputs=(In("x", "out/a", "x"), In("log", "var/log", "log", help="the log")),
    )  # fmt: skip
    block = dag.mermaid([a, b, c], [live])
    assert block.startswith("```mermaid\nflowchart TD\n") and block.endswith("```\n")
    assert "  a -->|x, m| b\n" in block  # one arrow per pair of steps, its ports as the label
    assert "  b -.->|y| c\n" in block  # waits without reading: dashed
    assert "  a -->|x| live\n" in block  # no source: found by its path
    assert '    f_var_log[("var/log: the log")]\n' in block
    assert "  f_var_log -->|log| live\n" in block
    assert "  c -.->|the served model writes| f_var_log\n" in block


def test_a_stale_dag_block_is_reported_and_rewritten(tmp_path, capsys):
    doc = tmp_path / "README.md"
    doc.write_text("# x\n<!-- dag: here -->\n```mermaid\nflowchart TD\n```\n<!-- /dag -->\ntail\n")
    assert dag.main(["--check", str(doc)]) == 1
    assert "differs from the step declarations" in capsys.readouterr().err
    assert dag.main(["--write", str(doc)]) == 0
    assert dag.main(["--check", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# x\n<!-- dag: here -->\n```mermaid\n") and text.endswith("tail\n")
    assert dag.BLOCK.search(text)["body"] == dag.mermaid()
    (tmp_path / "bare.md").write_text("no markers\n")
    assert dag.main(["--check", str(tmp_path / "bare.md")]) == 1
    assert "no '<!-- dag ... -->'" in capsys.readouterr().err


# --------------------------------------------------------------------------- links and index

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m[1]) for m in re.finditer(r"^#+ (.+)$", _prose(path.read_text()), re.M)}


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_every_link_in_the_readme_and_docs_resolves():
    broken = []
    for page in _pages():
        for target in LINK.findall(_prose(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target}: no such heading")
    assert not broken, "\n".join(broken)


def test_the_docs_index_lists_every_page():
    linked = {(DOCS / t.partition("#")[0]).resolve() for t in LINK.findall(INDEX.read_text())}
    missing = [
        p.name for p in sorted(DOCS.glob("*.md")) if p != INDEX and p.resolve() not in linked
    ]
    assert not missing, f"docs/README.md does not link {missing}"


# --------------------------------------------------------------------------- commands

# tools that live in .venv/bin: a command that calls one bare needs an activated venv
VENV_TOOLS = {"python", "python3", "pip", "pip3", "dvc", "paddle-mlops", "mlflow", "pytest", "ruff"}


def _code_lines(text: str) -> Iterator[tuple[int, str, str]]:
    """(line number, line, info string) of each line of a fenced or indented code block."""
    lines = text.splitlines()
    fence, in_block, blank = None, False, True
    for number, line in enumerate(lines, 1):
        if fence is not None:
            if line.strip().startswith("```"):
                fence = None
            else:
                yield number, line, fence
            continue
        if line.strip().startswith("```"):
            fence = line.strip()[3:].strip() or "text"
        elif line.startswith("    ") and (blank or in_block):
            in_block = True
            yield number, line, "indented"
        elif line.strip():
            in_block = False
        blank = not line.strip()


def _command(line: str) -> list[str]:
    """The words of a shell line without its leading VAR=value assignments."""
    words = line.split("#", 1)[0].split() if not line.lstrip().startswith("#") else []
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    return words


def _make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))


def test_every_command_runs_from_a_fresh_clone_without_the_venv():
    bare, unknown = [], []
    targets = _make_targets()
    for page in _pages():
        text = page.read_text()
        where = page.relative_to(REPO)
        for number, line, info in _code_lines(text):
            if info in ("python", "toml", "yaml", "json", "mermaid"):
                continue
            words = _command(line)
            # `python3 -m components` finds the repository's venv itself (components/__main__.py)
            if words and words[0] in VENV_TOOLS and words[:3] != ["python3", "-m", "components"]:
                bare.append(f"{where}:{number}: {line.strip()}")
            if words[:1] == ["make"] and len(words) > 1:
                target = re.match(r"[\w-]*", words[1])[0]  # "make kfp-local)," in a layout
                if target not in targets and not target.startswith("-"):
                    unknown.append(f"{where}:{number}: make {target}")
        for span in re.findall(r"`make ([a-z][\w-]*)[^`]*`", _prose(text)):
            if span not in targets:
                unknown.append(f"{where}: `make {span}`")
    assert not bare, "call .venv/bin/<tool> (the venv is not activated):\n" + "\n".join(bare)
    assert not unknown, "no such Makefile target:\n" + "\n".join(unknown)
    # the README's inline commands too: there, `dvc repro` in prose is a command to copy
    tools = "|".join(map(re.escape, VENV_TOOLS))
    inline = re.findall(rf"`((?:{tools}) [^`]*)`", _prose(README.read_text()))
    assert not inline, f"README.md names bare venv commands: {inline}"
