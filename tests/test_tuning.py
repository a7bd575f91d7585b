"""The serving-config search (components/ml/tuning.py) with the real server and wrk, and
what package ships from it."""

from __future__ import annotations

import dataclasses
import math
import shutil

import pytest

from components.core.artifacts import StepError, read_json
from components.core.config import load_params, section
from components.ml import model_config as mc
from components.ml.loadgen import LoadResult
from components.ml.model_config import ModelConfig
from components.ml.server import RunningServer
from components.ml.tuning import Trial, TuneParams, TuneSpace, config_key, decide, tune
from components.ml.tuning import grid as configs_grid
from components.steps.package import PackageParams
from components.steps.package import run as package_run
from tests.conftest import REPO, package_params

# short: the search's behaviour is under test, not this machine's best config
SHORT = TuneParams(budget_s=14.0, concurrencies=[1, 4], trial_s=1, finalists=2, repeats=1)


def test_params_yaml_tunes_by_default_within_the_documented_budget():
    params = section(load_params(REPO / "params.yaml"), "package", PackageParams)
    assert 0 < params.tune.budget_s <= 60  # the default search fits a minute on 2 cores


def test_package_ships_the_searched_config_and_its_table(
    server_binary, exported, qat_out, tmp_path
):
    params = dataclasses.replace(package_params(), tune=SHORT)
    bundle = package_run(params, exported, qat_out[0], tmp_path / "bundle")
    table = read_json(bundle / "tune.json")
    shipped = mc.read(bundle)
    written = params.model_config

    # what model_config.json says is the search's choice, and only the searched settings moved
    assert {k: getattr(shipped, k) for k in table["chosen_settings"]} == table["chosen_settings"]
    for unsearched in ("max_queue_size", "request_timeout_ms", "log_input_rate"):
        assert getattr(shipped, unsearched) == getattr(written, unsearched)
    assert table["written"] == config_key(written)
    # within the budget, plus at most one trial begun inside it
    longest = max(t["seconds"] for t in table["trials"])
    assert table["elapsed_s"] <= SHORT.budget_s + longest + 1.0
    # every trial measured every concurrency with real answers, none failed
    assert len(table["trials"]) >= 2
    for trial in table["trials"]:
        assert [load["concurrency"] for load in trial["loads"]] == [1, 4]
        assert all(load["requests"] > 0 and load["errors"] == 0 for load in trial["loads"])
    # the written settings were measured, and the choice is never worse than them by median
    assert any(t["config"] == table["written"] for t in table["trials"])
    assert table["chosen_score"] >= table["written_score"]
    assert table["variant"] == "int8" and table["objective"] == "throughput"

    # the server serving the bundle with no flag runs the chosen settings
    server = RunningServer(server_binary, bundle, "int8", "m", tmp_path / "server.log")
    try:
        server.wait_ready(60)
        served = server.client.model_config("m")["settings"]
    finally:
        server.stop()
    assert {k: served[k] for k in table["chosen_settings"]} == table["chosen_settings"]


def test_a_budget_of_one_trial_keeps_the_written_config(server_binary, exported_int8, tmp_path):
    bundle = shutil.copytree(exported_int8, tmp_path / "bundle")
    written = mc.read(bundle)
    chosen, table = tune(dataclasses.replace(SHORT, budget_s=0.5), server_binary, bundle, written)
    assert len(table["trials"]) == 1 and table["trials"][0]["config"] == config_key(written)
    assert chosen == written


def test_a_bundle_without_warmup_samples_is_one_clear_error(server_binary, exported_int8, tmp_path):
    bundle = shutil.copytree(exported_int8, tmp_path / "bundle")
    (bundle / "warmup.json").unlink()
    with pytest.raises(StepError, match=r"warmup\.json: missing; .*export\.warmup_samples"):
        tune(SHORT, server_binary, bundle, mc.read(bundle))


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({"layouts": ["2by1"]}, r"package\.tune\.space: layout '2by1': expected WORKERSxTHREADS"),
        ({"max_batch_size": [0]}, r"package\.tune\.space: max_batch_size: each must be >= 1"),
    ],
)
def test_a_bad_search_space_is_refused_naming_the_field(space, message):
    params = load_params(REPO / "params.yaml")
    params["package"]["tune"]["space"].update(space)
    with pytest.raises(StepError, match=message):
        section(params, "package", PackageParams, source="params.yaml")


# ------------------------------------------------------------------ the decision rule


def _trial(config: ModelConfig, *loads: tuple[float, float]) -> Trial:
    return Trial(
        "t",
        config,
        [
            LoadResult(c, int(rps), 1.0, rps, p99 / 2, p99 / 1.5, p99, 0)
            for c, (rps, p99) in zip((1, 16), loads, strict=True)
        ],
        1.0,
    )


WRITTEN = ModelConfig(2, 1, 64, 0, True, 4096, 10000, 0.1)
FASTER = dataclasses.replace(WRITTEN, workers=1, threads_per_worker=2)


def test_throughput_never_picks_a_config_over_the_p99_budget():
    params = dataclasses.replace(SHORT, p99_budget_ms=5.0)
    trials = [
        _trial(WRITTEN, (1000, 1.0), (4000, 4.0)),
        _trial(FASTER, (2000, 1.0), (9000, 8.0)),  # twice the throughput, p99 over 5 ms
    ] * 2
    decision = decide(trials, [WRITTEN, FASTER], WRITTEN, params)
    assert decision["chosen"] == WRITTEN and decision["feasible"]


def test_a_winner_within_the_noise_does_not_replace_the_written_config():
    trials = [
        _trial(WRITTEN, (1000, 1.0), (4000, 2.0)),
        _trial(WRITTEN, (1000, 1.0), (4100, 2.0)),
        _trial(FASTER, (1300, 1.0), (4600, 2.0)),  # better median ...
        _trial(FASTER, (1250, 1.0), (4500, 2.0)),
        _trial(FASTER, (900, 1.0), (4000, 2.0)),  # ... but one round below the written's
    ]
    decision = decide(trials, [WRITTEN, FASTER], WRITTEN, SHORT)
    assert decision["chosen"] == WRITTEN and decision["kept_written"]


def test_a_clear_winner_replaces_the_written_config():
    trials = [
        _trial(WRITTEN, (1000, 1.0), (4000, 2.0)),
        _trial(WRITTEN, (1050, 1.0), (4100, 2.0)),
        _trial(FASTER, (1500, 1.0), (6000, 2.0)),
        _trial(FASTER, (1450, 1.0), (5800, 2.0)),
    ]
    decision = decide(trials, [WRITTEN, FASTER], WRITTEN, SHORT)
    assert decision["chosen"] == FASTER and not decision["kept_written"]
    best = max(decision["finalists"], key=lambda f: f["median_score"])
    assert math.isclose(best["median_score"], math.sqrt(1475 * 5900), rel_tol=0.02)


def test_latency_picks_the_lowest_worst_p99():
    params = dataclasses.replace(SHORT, objective="latency")
    trials = [
        _trial(WRITTEN, (1000, 1.0), (4000, 6.0)),
        _trial(FASTER, (900, 1.2), (3000, 3.0)),
    ] * 2
    assert decide(trials, [WRITTEN, FASTER], WRITTEN, params)["chosen"] == FASTER


def test_space_defaults_cover_every_layout_of_the_cpus():
    from components.ml.tuning import layouts_for

    assert layouts_for(2) == [(1, 1), (1, 2), (2, 1)]
    assert (4, 1) in layouts_for(4) and (2, 2) in layouts_for(4) and (3, 2) not in layouts_for(4)
    assert TuneSpace().layouts is None


def test_the_search_never_shrinks_the_largest_request_clients_may_send():
    space = TuneSpace(max_batch_size=[8, 64, 128], max_queue_delay_us=[0, 500])
    grid = configs_grid(WRITTEN, space)  # written: max_batch_size 64
    assert {c.max_batch_size for c in grid} == {64, 128}
    assert len(grid) == len(set(grid))  # no config measured twice
