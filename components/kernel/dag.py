"""The pipeline's DAG drawn from the step declarations, as a Mermaid flowchart.

Every edge comes from a declaration: an input port whose ``source`` names another step's
output (``"ingest.data"``), dashed when the step only waits for it (``order_only``). The steps
that run after deploy, on live traffic (:data:`~components.kernel.step.AFTER_DEPLOY`), have no
``source``; an input of theirs at the path of a pipeline step's output is drawn from that
step, any other input (the server's prediction log) as a file node that the last pipeline step
(deploy, which starts the server) feeds with a dashed arrow: the running server writes it.

``python -m components.kernel.dag`` prints the block; ``--write README.md`` replaces the block
between the ``<!-- dag`` and ``<!-- /dag -->`` markers of that file, and ``--check README.md``
exits 1 when it differs (``tests/test_docs.py`` does the same).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from components.core.artifacts import StepError, write_text
from components.kernel.step import AFTER_DEPLOY, STEPS, In, Step, load

BEGIN = "<!-- dag"
END = "<!-- /dag -->"
BLOCK = re.compile(r"(?P<head><!-- dag[^\n]*-->\n)(?P<body>.*?)(?P<tail><!-- /dag -->)", re.S)


def _node(path: str) -> str:
    return "f_" + re.sub(r"\W", "_", path).strip("_")


def mermaid(pipeline: Sequence[Step] | None = None, after: Sequence[Step] | None = None) -> str:
    """The fenced ```` ```mermaid ```` block of ``pipeline`` (default: :data:`STEPS`) and the
    steps that run ``after`` deploy (default: :data:`AFTER_DEPLOY`)."""
    pipeline = list(pipeline if pipeline is not None else map(load, STEPS))
    after = list(after if after is not None else map(load, AFTER_DEPLOY))
    produced = {out.path: f"{step.name}.{out.name}" for step in pipeline for out in step.outputs}
    # (from, to) -> (port names, dashed): one arrow per pair of steps, its ports as the label
    edges: dict[tuple[str, str], tuple[list[str], bool]] = {}
    files: dict[str, str] = {}

    def add(source: str, target: str, port: In) -> None:
        step, _, name = source.partition(".")
        names, dashed = edges.setdefault((step, target), ([], True))
        if name not in names:
            names.append(name)
        edges[(step, target)] = (names, dashed and port.order_only)

    for step in (*pipeline, *after):
        for port in step.inputs:
            source = port.source or produced.get(port.path)
            if source is not None:
                add(source, step.name, port)
            else:
                files[port.path] = port.help or port.name
                add(f"{_node(port.path)}.{port.name}", step.name, port)
    # one line per source and label: "ingest -->|data| validate & train & ..."
    grouped: dict[tuple[str, str, bool], list[str]] = {}
    for (source, target), (names, dashed) in edges.items():
        grouped.setdefault((source, ", ".join(names), dashed), []).append(target)
    lines = ["```mermaid", "flowchart TD"]
    lines.append('  subgraph live["after deploy, on live traffic: no dvc.yaml stage"]')
    lines += [f"    {s.name}" for s in after]
    lines += [f'    {_node(path)}[("{path}: {what}")]' for path, what in files.items()]
    lines.append("  end")
    for (source, label, dashed), targets in grouped.items():
        arrow = "-.->" if dashed else "-->"
        lines.append(f"  {source} {arrow}|{label}| {' & '.join(targets)}")
    if pipeline and files:
        nodes = " & ".join(_node(path) for path in files)
        lines.append(f"  {pipeline[-1].name} -.->|the served model writes| {nodes}")
    lines.append("```")
    return "\n".join(lines) + "\n"


def replaced(text: str, block: str, where: str = "the file") -> str:
    """``text`` with its dag block (between the markers) replaced by ``block``."""
    match = BLOCK.search(text)
    if match is None:
        raise StepError(f"{where}: no '{BEGIN} ... -->' ... '{END}' markers to write the DAG in")
    return text[: match.start("body")] + block + text[match.end("body") :]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m components.kernel.dag [--write FILE | --check FILE]``."""
    parser = argparse.ArgumentParser(
        prog="python -m components.kernel.dag",
        description=__doc__.splitlines()[0],
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", metavar="FILE", help="replace FILE's dag block")
    mode.add_argument("--check", metavar="FILE", help="exit 1 when FILE's dag block differs")
    args = parser.parse_args(argv)
    block = mermaid()
    if not (args.write or args.check):
        sys.stdout.write(block)
        return 0
    path = Path(args.write or args.check)
    try:
        text = path.read_text()
        new = replaced(text, block, str(path))
    except (OSError, StepError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    if args.check:
        if new != text:
            sys.stderr.write(
                f"error: {path}: the DAG block differs from the step declarations; rewrite it "
                f"with .venv/bin/python -m components.kernel.dag --write {path}\n"
            )
            return 1
        return 0
    if new != text:
        write_text(path, new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
