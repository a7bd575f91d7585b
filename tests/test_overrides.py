"""`--set`/`--set-if` on a step's command line and a search's params overlay
(components/core/overrides.py): a key the params lack is one line naming the closest one; the
command line wins over the overlay, which wins over the params file."""

from __future__ import annotations

import logging
import re

import pytest
import yaml

from components.core import overrides as ov
from components.core.artifacts import StepError
from components.core.config import load_params
from components.kernel import cli
from tests.conftest import REPO

pytestmark = pytest.mark.unit


def _params():
    return load_params(REPO / "params.yaml")


def test_set_and_set_if_change_the_merged_params_and_keep_their_source():
    params = _params()
    out = ov.override(
        params,
        {"train.learning_rate": 0.003, "task.options.hidden": [64, 32]},
        [
            ov.parse_set_if("--set-if=train.learning_rate=0.003:train.batch_size=64"),
            ov.parse_set_if("--set-if=train.learning_rate=0.1:train.epochs=2"),
        ],
    )
    assert out["train"]["learning_rate"] == 0.003 and out["task"]["options"]["hidden"] == [64, 32]
    assert out["train"]["batch_size"] == 64  # its condition holds after the --set
    assert out["train"]["epochs"] == params["train"]["epochs"]  # its condition does not
    assert out.source == params.source and params["train"]["learning_rate"] == 0.001
    # a mapping is a key too: set whole (e.g. the digests of a source's files)
    assert ov.override(params, {"ingest.sha256": {}})["ingest"]["sha256"] == {}


@pytest.mark.parametrize(
    ("sets", "set_ifs", "line"),
    [
        ({"train.lerning_rate": 1}, [], "--set train.lerning_rate: no such key (did you mean "
         "train.learning_rate?)"),
        ({}, [(("train.sed", 1), ("train.epochs", 2))], "--set train.sed: no such key"),
    ],
)  # fmt: skip
def test_an_unknown_key_is_one_line_naming_the_closest(sets, set_ifs, line):
    with pytest.raises(StepError, match=r"^" + re.escape(line)):
        ov.override(_params(), sets, set_ifs)


def test_a_malformed_set_is_one_line():
    with pytest.raises(StepError, match=r"--set train\.epochs: expected dotted\.key=value"):
        ov.parse_set("train.epochs")
    with pytest.raises(StepError, match=r"--set-if a=1: expected cond\.key=value:dotted"):
        ov.parse_set_if("a=1")


def test_overlay_adopted_not_adopted_missing_and_malformed(tmp_path, caplog):
    assert ov.read_overlay(None) == {} and ov.read_overlay("") == {}
    assert ov.read_overlay(tmp_path / "none") == {}  # no search ran: the params as they are
    (tmp_path / ov.OVERLAY).write_text(
        yaml.safe_dump({"adopted": True, "params": {"train.epochs": 3}, "study": "s", "trial": 2})
    )
    assert ov.read_overlay(tmp_path) == {"train.epochs": 3}
    # not adopted: sets nothing, even with params in it; the why is in decision.yaml, not here
    (tmp_path / ov.OVERLAY).write_text(yaml.safe_dump({"adopted": False, "params": {"a.b": 3}}))
    with caplog.at_level(logging.INFO, logger=ov.__name__):
        assert ov.read_overlay(tmp_path) == {}
    assert caplog.messages[-1] == (
        f"params overlay {tmp_path / ov.OVERLAY} sets nothing (decision.yaml beside it says why)"
    )
    (tmp_path / ov.OVERLAY).write_text("adopted: maybe\n")
    with pytest.raises(StepError, match=r"overlay\.yaml: adopted: expected true or false$"):
        ov.read_overlay(tmp_path)
    (tmp_path / ov.OVERLAY).write_text("adopted: true\nparams: [1, 2]\n")
    with pytest.raises(StepError, match=r"overlay\.yaml: params: expected a mapping"):
        ov.read_overlay(tmp_path)
    (tmp_path / ov.OVERLAY).unlink()
    with pytest.raises(StepError, match=r"overlay\.yaml: missing"):
        ov.read_overlay(tmp_path)


def test_the_command_line_wins_over_the_overlay_and_a_typo_in_either_is_one_line(tmp_path, capsys):
    """Through the train step's CLI, up to typing its params (a bad batch size stops it there,
    after the overrides were applied: the error names the value that won)."""
    hpo = tmp_path / "hpo"
    hpo.mkdir()
    (hpo / ov.OVERLAY).write_text(
        yaml.safe_dump({"adopted": True, "params": {"train.batch_size": -1}, "study": "s"})
    )
    argv = ["train", "--params", str(REPO / "params.yaml"), "--hpo", str(hpo)]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "train.batch_size: must be >= 1, got -1 (train.batch_size was set by " in err
    assert str(hpo / ov.OVERLAY) in err  # the overlay's -1 was typed, and the line says so
    assert cli.main([*argv, "--set", "train.batch_size=-2", "--data", str(tmp_path)]) == 1
    assert "got -2 (train.batch_size was set by --set)" in capsys.readouterr().err
    (hpo / ov.OVERLAY).write_text(
        yaml.safe_dump({"adopted": True, "params": {"train.bach_size": 8}, "study": "s"})
    )
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "params: train.bach_size: no such key" in err[-1]
    assert "(did you mean train.batch_size?)" in err[-1]
