"""README.md and docs/ tell the truth: every number marked as coming from a committed output
agrees with that file (tests/docs_numbers.py), and the gate error-rate table is what the
calibration simulation gives for the shipped params."""

from __future__ import annotations

import json
import re

import pytest

from tests import docs_numbers
from tests.conftest import REPO
from tests.test_gates import SEEN_FLIP_RATE, failure_rate, shipped_limits


def test_marked_numbers_agree_with_their_committed_files():
    marked = sum(len(docs_numbers.MARKER.findall(p.read_text())) for p in docs_numbers.DOCS)
    assert marked >= 20, f"only {marked} marked numbers: were the markers dropped?"
    problems = docs_numbers.mismatches()
    assert not problems, (
        "numbers in the docs differ from the committed outputs; after make run, rewrite "
        "them with .venv/bin/python -m tests.docs_numbers --write\n" + "\n".join(problems)
    )


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
