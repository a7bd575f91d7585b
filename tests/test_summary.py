"""`paddle-mlops summary`'s line about the search: what train used and why."""

from __future__ import annotations

import pytest
import yaml

from components.summary import _hpo_lines

pytestmark = pytest.mark.unit


def _search(tmp_path, overlay, **decision):
    """The hpo step's output directory: the overlay train applied and the decision beside it."""
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump(overlay))
    (tmp_path / "decision.yaml").write_text(yaml.safe_dump(decision))
    return tmp_path


NOTHING = {"adopted": False, "params": {}}  # the overlay when nothing is adopted, or off


def test_the_summary_says_what_the_search_decided(tmp_path):
    assert _hpo_lines(tmp_path / "absent") == []  # an older run: no hpo step yet
    off = {"adopted": False, "reason": "hpo.enabled is false", "study": None, "trial": None}
    assert _hpo_lines(_search(tmp_path, NOTHING, **off)) == []  # off: nothing to say
    kept = "hpo: kept current params: winner trial 4 val_accuracy +0.002 mean, lower bound -0.01"
    doc = {"adopted": False, "study": "hpo-digits-abc", "trial": 4, "reason": kept}
    doc["winner_params"] = {"train.learning_rate": 0.003}
    assert _hpo_lines(_search(tmp_path, NOTHING, **doc)) == [kept]  # the why: decision.yaml
    doc |= {"adopted": True, "reason": "adopted"}
    overlay = {"adopted": True, "params": doc["winner_params"], "study": "hpo-digits-abc"}
    assert _hpo_lines(_search(tmp_path, overlay | {"trial": 4}, **doc)) == [
        "hpo: train used trial 4 of hpo-digits-abc: train.learning_rate=0.003"
    ]
