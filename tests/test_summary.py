"""`paddle-mlops summary`'s line about the search: what train used and why."""

from __future__ import annotations

import pytest
import yaml

from components.summary import _hpo_lines

pytestmark = pytest.mark.unit


def _overlay(tmp_path, **doc):
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path


def test_the_summary_says_what_the_search_decided(tmp_path):
    assert _hpo_lines(tmp_path / "absent") == []  # an older run: no hpo step yet
    off = {"adopted": False, "params": {}, "reason": "hpo.enabled is false"}
    assert _hpo_lines(_overlay(tmp_path, **off)) == []  # off: nothing to say
    kept = "hpo: kept current params: winner trial 4 val_accuracy +0.002 mean, lower bound -0.01"
    doc = {"adopted": False, "params": {}, "study": "hpo-digits-abc", "trial": 4, "reason": kept}
    assert _hpo_lines(_overlay(tmp_path, **doc)) == [kept]
    doc |= {"adopted": True, "params": {"train.learning_rate": 0.003}, "reason": "adopted"}
    assert _hpo_lines(_overlay(tmp_path, **doc)) == [
        "hpo: train used trial 4 of hpo-digits-abc: train.learning_rate=0.003"
    ]
