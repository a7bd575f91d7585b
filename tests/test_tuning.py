"""The serving-config search (components/ml/serving/tuning.py) with the real server and wrk, and
what package ships from it."""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil

import pytest

from components.core.artifacts import StepError, read_json
from components.core.config import load_params, section
from components.ml.serving import model_config as mc
from components.ml.serving.loadgen import LoadResult
from components.ml.serving.model_config import ModelConfig
from components.ml.serving.server import RunningServer
from components.ml.serving.tuning import (
    Trial,
    TuneParams,
    TuneSpace,
    candidates_layouts,
    config_key,
    decide,
    tune,
)
from components.ml.serving.tuning import grid as configs_grid
from components.steps.package import PackageParams
from components.steps.package import run as package_run
from tests.conftest import REPO, package_params

# short: the search's behaviour is under test, not this machine's best config. Bounded by a
# trial count, not by time: every host runs the same trials, however fast it is.
SHORT = TuneParams(
    budget_s=900.0, max_trials=7, concurrencies=[1, 4], trial_s=1, finalists=2, repeats=1
)


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
    # max_trials bounds it; the finalists' extra rounds are whole rounds
    assert SHORT.max_trials - SHORT.finalists < len(table["trials"]) <= SHORT.max_trials
    # every trial measured every concurrency with real answers, none failed
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
    chosen, table = tune(dataclasses.replace(SHORT, max_trials=1), server_binary, bundle, written)
    assert len(table["trials"]) == 1 and table["trials"][0]["config"] == config_key(written)
    assert chosen == written


def test_a_written_layout_the_cpus_cannot_run_is_only_a_reference(
    server_binary, exported_int8, tmp_path, caplog
):
    """On 1 CPU (a pod's limit) the written 2x1 runs once, as the reference the choice is
    compared with; nothing is searched around it, it is no finalist and cannot be chosen,
    and tune.json and one warning say so. Holds for any number of trials a host runs."""
    bundle = shutil.copytree(exported_int8, tmp_path / "bundle")
    written = dataclasses.replace(mc.read(bundle), workers=2, threads_per_worker=1)
    caplog.set_level(logging.INFO, logger="components.ml.serving.tuning")
    params = dataclasses.replace(SHORT, max_trials=6, finalists=3)
    chosen, table = tune(params, server_binary, bundle, written, cpus=1)

    def cpus(settings: dict) -> int:
        return settings["workers"] * settings["threads_per_worker"]

    assert table["cpus"] == 1 and table["written_fits"] is False and table["written_cpus"] == 2
    first, *rest = table["trials"]
    assert first["stage"] == "reference" and first["config"] == config_key(written)
    assert rest and all(cpus(t["settings"]) == 1 and t["stage"] != "reference" for t in rest)
    assert cpus(table["chosen_settings"]) == 1 and chosen.workers * chosen.threads_per_worker == 1
    assert not any(f["written"] for f in table["finalists"])
    assert not table["kept_written"] and table["written_score"] is not None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w for w in warnings if "written layout" in w] == [
        "tune: the written layout 2x1 needs 2 CPUs, this process may use 1: measured once as "
        "a reference; only layouts of <= 1 CPUs are searched or chosen"
    ]


def test_listed_layouts_that_do_not_fit_are_skipped_and_named():
    space = TuneSpace(layouts=["1x1", "2x1", "1x2", "4x1"])
    configs, skipped = candidates_layouts(WRITTEN, space, cpus=1)  # written: 2x1
    assert [(c.workers, c.threads_per_worker) for c in configs] == [(2, 1), (1, 1)]
    assert skipped == ["1x2", "4x1"]  # the written 2x1 is the reference, not a skipped one
    assert {(c.workers, c.threads_per_worker) for c in configs_grid(WRITTEN, space, 1)} == {(1, 1)}


def test_a_space_with_no_layout_that_fits_is_one_clear_error(
    server_binary, exported_int8, tmp_path
):
    bundle = shutil.copytree(exported_int8, tmp_path / "bundle")
    params = dataclasses.replace(SHORT, space=TuneSpace(layouts=["2x1", "2x2"]))
    written = dataclasses.replace(mc.read(bundle), workers=2, threads_per_worker=2)
    with pytest.raises(
        StepError, match=r"package\.tune\.space\.layouts: none of .* fits the 1 CPUs"
    ):
        tune(params, server_binary, bundle, written, cpus=1)


def test_a_bundle_without_warmup_samples_is_one_clear_error(server_binary, exported_int8, tmp_path):
    bundle = shutil.copytree(exported_int8, tmp_path / "bundle")
    (bundle / "warmup.json").unlink()
    with pytest.raises(StepError, match=r"warmup\.json: missing; .*export\.warmup_samples"):
        tune(SHORT, server_binary, bundle, mc.read(bundle))


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({"layouts": ["2by1"]}, r"tune\.space\.layouts: layout '2by1': expected WORKERSxTHREADS"),
        ({"max_batch_size": [0]}, r"tune\.space\.max_batch_size\[0\]: must be >= 1, got 0"),
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
    from components.ml.serving.tuning import layouts_for

    assert layouts_for(2) == [(1, 1), (1, 2), (2, 1)]
    assert (4, 1) in layouts_for(4) and (2, 2) in layouts_for(4) and (3, 2) not in layouts_for(4)
    assert TuneSpace().layouts is None


def test_the_search_never_shrinks_the_largest_request_clients_may_send():
    space = TuneSpace(max_batch_size=[8, 64, 128], max_queue_delay_us=[0, 500])
    grid = configs_grid(WRITTEN, space, 2)  # written: max_batch_size 64
    assert {c.max_batch_size for c in grid} == {64, 128}
    assert len(grid) == len(set(grid))  # no config measured twice
