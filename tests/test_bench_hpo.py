"""The hpo benchmark's pure parts (bench/hpo/, ``make bench-hpo``): the grid over the shipped
digits space, conditionals in it, the cache key, the ratios and the last line. The runs
themselves (the grid's trials, the searches) are the hpo step's and its engine's, tested in
tests/test_hpo_search.py; the bench measures, the tests never time anything."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from bench.hpo import cli, grid
from components.core.config import load_params
from components.ml.training import search_space
from tests.conftest import REPO

LAST_LINE = re.compile(
    r"hpo_vs_grid_best=(?P<best>\d+\.\d{4}) hpo_cost_vs_grid=(?P<cost>\d+\.\d{3}) "
    r"adopted=(?P<adopted>yes|no)"
)


@pytest.fixture(scope="module")
def shipped() -> tuple[dict, search_space.Space]:
    params = load_params(REPO / "params.yaml")
    return params, search_space.parse_space(params["hpo"]["space"], source="params.yaml")


def test_the_default_grid_covers_every_key_at_its_ends_in_48_configs(shipped):
    params, space = shipped
    assert grid.grid_counts(space, 48) == {
        "train.learning_rate": 3,  # continuous: the most values, so the third point
        "train.batch_size": 2,
        "task.options.conv_channels": 2,
        "task.options.hidden": 2,
        "task.options.augment_shift": 2,
    }
    configs = grid.grid(space, 48, params)
    assert len(configs) == 48
    assert len({repr(sorted(c.items())) for c in configs}) == 48  # no config twice
    for key, spec in space.items():
        values = {repr(c[key]) for c in configs}
        assert all(search_space.contains(spec, c[key]) for c in configs), key
        ends = search_space.ends(spec)
        assert {repr(ends[0]), repr(ends[-1])} <= values, key  # low and high, first and last
    rates = sorted({c["train.learning_rate"] for c in configs})
    assert rates == pytest.approx([0.0003, math.sqrt(0.0003 * 0.01), 0.01], rel=1e-5)


def test_a_small_grid_holds_the_other_keys_at_their_current_values(shipped):
    params, space = shipped
    configs = grid.grid(space, 8, params)
    assert len(configs) == 8
    assert {repr(c["task.options.hidden"]) for c in configs} == {repr([120, 84])}  # params'
    assert {c["task.options.augment_shift"] for c in configs} == {0, 4}


def test_the_grid_never_exceeds_its_target(shipped):
    params, space = shipped
    for target in (1, 2, 5, 31, 48, 100, 500):
        counts = grid.grid_counts(space, target)
        assert math.prod(counts.values()) <= target
        assert len(grid.grid(space, target, params)) == math.prod(counts.values())
    assert grid.grid_counts(space, 10**4)["train.batch_size"] == 3  # never past the choices


def test_a_conditional_key_is_gridded_only_where_its_condition_holds():
    params = {"task": {"options": {"arch": "small", "width": 8}}, "train": {"lr": 0.01}}
    space = search_space.parse_space(
        {
            "task.options.arch": {"type": "categorical", "choices": ["small", "big"]},
            "task.options.width": {
                "type": "int", "low": 4, "high": 16, "step": 4,
                "when": {"task.options.arch": "big"},
            },
        },
        source="p",
    )  # fmt: skip
    assert grid.cardinality(space["task.options.width"]) == 4
    configs = grid.grid(space, 8, params)
    assert configs == [
        {"task.options.arch": "small"},
        {"task.options.arch": "big", "task.options.width": 4},
        {"task.options.arch": "big", "task.options.width": 8},
        {"task.options.arch": "big", "task.options.width": 12},
        {"task.options.arch": "big", "task.options.width": 16},
    ]


def test_points_follow_the_scale_the_step_and_the_type():
    parse = search_space.parse_space
    space = parse(
        {
            "a": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
            "b": {"type": "float", "low": 0.0, "high": 1.0, "step": 0.25},
            "c": {"type": "int", "low": 1, "high": 64, "log": True},
            "d": {"type": "categorical", "choices": [[1, 2], [3, 4], [5, 6], [7, 8]]},
        },
        source="p",
    )
    assert grid.points(space["a"], 3) == pytest.approx([0.001, 0.01, 0.1])
    assert grid.points(space["b"], 3) == [0.0, 0.5, 1.0]
    assert grid.points(space["b"], 4) == [0.0, 0.25, 0.75, 1.0]  # snapped to the step
    assert grid.points(space["c"], 4) == [1, 4, 16, 64]
    assert all(isinstance(v, int) for v in grid.points(space["c"], 7))
    assert grid.points(space["d"], 2) == [[1, 2], [7, 8]]
    assert grid.points(space["d"], 1, current=[3, 4]) == [[3, 4]]
    assert grid.points(space["b"], 1, current=0.3) == [0.5]  # 0.3 is off the step: the middle
    assert grid.cardinality(space["a"]) == math.inf and grid.cardinality(space["c"]) == 64


def test_the_ratios_and_the_last_line():
    assert cli.best_ratio(0.95, 0.96, higher_is_better=True) == pytest.approx(0.95 / 0.96)
    assert cli.best_ratio(12.0, 10.0, higher_is_better=False) == pytest.approx(10 / 12)  # FID
    assert cli.spread([0.3, 0.1, 0.2]) == (0.1, 0.2, 0.3)
    line = cli.last_line([0.99, 1.0, 0.995], [0.2, 0.4, 0.25], [True, False, True])
    match = LAST_LINE.fullmatch(line)
    assert match, line
    assert (match["best"], match["cost"], match["adopted"]) == ("0.9950", "0.250", "yes")
    assert LAST_LINE.fullmatch(cli.last_line([1.0], [0.1], [False]))["adopted"] == "no"
    assert cli.last_line([1, 1], [1, 1], [True, False]).endswith("adopted=no")  # not most


def test_the_grid_cache_key_follows_code_params_data_and_configs(tmp_path: Path):
    params = {"task": {"name": "digits"}, "train": {"epochs": 40, "seed": 42}, "hpo": {"x": 1}}
    configs = [{"train.batch_size": 16}]
    key = grid.grid_key("code", params, "data", configs, 8)
    assert key == grid.grid_key("code", params, "data", configs, 8)
    # train.epochs is only the adoption's (each grid trial sets its own), hpo is the search's
    assert key == grid.grid_key("code", {**params, "train": {"epochs": 3, "seed": 42}}, "data",
                               configs, 8)  # fmt: skip
    assert key == grid.grid_key("code", {**params, "hpo": {"x": 2}}, "data", configs, 8)
    changed = [
        grid.grid_key("code2", params, "data", configs, 8),
        grid.grid_key("code", {**params, "train": {"epochs": 40, "seed": 1}}, "data", configs, 8),
        grid.grid_key("code", params, "data2", configs, 8),
        grid.grid_key("code", params, "data", [{"train.batch_size": 32}], 8),
        grid.grid_key("code", params, "data", configs, 9),
    ]
    assert key not in changed and len(set(changed)) == len(changed)

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    before = grid.code_sha256(tmp_path)
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    assert grid.code_sha256(tmp_path) == before  # bytecode is not code
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert grid.code_sha256(tmp_path) != before


def test_the_knobs_default_to_the_issue_s_benchmark():
    args = cli.parser().parse_args([])
    assert (args.trials, args.grid, args.repeats, args.pruner) == (16, 48, 3, "median")
    assert args.epochs is None  # hpo.trial_epochs: the search's own
