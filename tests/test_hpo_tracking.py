"""The hpo step's search as MLflow runs (components/tracking/hpo.py), against a real
``mlflow server`` on 127.0.0.1, from the outputs of the real hpo step (its CLI) on the digits
snapshot: the search run under the pipeline run, a run per trial with its params, state and
per-epoch curve, the plots as artifacts; nothing but the decision when the search was off."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from components.core import overrides
from components.core.artifacts import StepError
from components.tracking import hpo as tracking_hpo
from tests.conftest import REPO, run_module

TRIALS, TRIAL_EPOCHS, SEEDS = 3, 2, 2


def _hpo(root: Path, data: Path, *sets: str) -> Path:
    """The real hpo step's CLI on ``data``; its output directory."""
    proc = run_module(
        "components",
        "hpo",
        "--params",
        str(REPO / "params.yaml"),
        "--data",
        str(data),
        "--out",
        str(root / "hpo"),
        "--study",
        str(root / "study"),
        "--metrics",
        str(root / "hpo.json"),
        *(a for s in sets for a in ("--set", s)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "hpo"


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory, digits_data: Path) -> Path:
    """A real search: 3 trials of 2 epochs, the winner adopted or not on 2 paired seeds."""
    return _hpo(
        tmp_path_factory.mktemp("hpo-on"),
        digits_data,
        "hpo.enabled=true",
        f"hpo.budget.trials={TRIALS}",
        f"hpo.trial_epochs={TRIAL_EPOCHS}",
        f"hpo.adopt.seeds={SEEDS}",
        "train.epochs=1",
    )


@pytest.fixture(scope="module")
def switched_off(tmp_path_factory: pytest.TempPathFactory, digits_data: Path) -> Path:
    return _hpo(tmp_path_factory.mktemp("hpo-off"), digits_data)


class CountingClient:
    """The real MlflowClient, counting the calls made through it (each is one request)."""

    def __init__(self, client: Any) -> None:
        self.client, self.calls = client, Counter()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return method(*args, **kwargs)

        return call


def _pipeline_run(server, experiment: str) -> SimpleNamespace:
    """A pipeline run as track opens it (a parent run with the owner tags), to log under."""
    import mlflow

    from components.tracking.liveness import owner_tags

    client = mlflow.MlflowClient(server.uri)
    experiment_id = mlflow.set_experiment(experiment).experiment_id
    tags = {**owner_tags(), "task": "digits"}
    parent = client.create_run(experiment_id, tags=tags, run_name="pipeline-test").info.run_id
    return SimpleNamespace(client=client, experiment_id=experiment_id, id=parent, tags=tags)


def _children(client: Any, experiment_id: str, parent_id: str) -> list[Any]:
    return client.search_runs(
        [experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'", max_results=5000
    )


@pytest.fixture(scope="module")
def logged(server, searched: Path) -> SimpleNamespace:
    pipeline = _pipeline_run(server, "hpo-tracking")
    params = yaml.safe_load((REPO / "params.yaml").read_text())["hpo"]
    search_id = tracking_hpo.log_search(
        pipeline.client, pipeline.experiment_id, pipeline.id, searched, pipeline.tags, params
    )
    trials = json.loads((searched / "trials.json").read_text())
    overlay = yaml.safe_load((searched / "overlay.yaml").read_text())
    decision = yaml.safe_load((searched / "decision.yaml").read_text())
    return SimpleNamespace(
        **vars(pipeline), search_id=search_id, trials=trials, overlay=overlay, decision=decision
    )


def test_the_search_is_one_run_under_the_pipeline_run(logged, searched: Path) -> None:
    client = logged.client
    (search,) = _children(client, logged.experiment_id, logged.id)
    assert search.info.run_id == logged.search_id
    assert search.info.run_name == "hpo" and search.info.status == "FINISHED"
    tags, overlay, decision = search.data.tags, logged.overlay, logged.decision
    assert tags["step"] == "hpo" and tags["adopted"] == str(decision["adopted"]).lower()
    assert tags["reason"] == decision["reason"] and tags["study"] == decision["study"]
    assert tags["trial"] == str(decision["trial"]) and tags["objective"] == "val_accuracy"
    metrics = search.data.metrics
    assert metrics["trials"] == TRIALS
    assert metrics["complete"] + metrics["pruned"] + metrics["fail"] == TRIALS
    assert metrics["trial_epochs"] == sum(len(t["curve"]) for t in logged.trials["trials"])
    evidence = decision["evidence"]
    if evidence.get("diffs"):  # the winner was not the current params: seeds were run
        history = client.get_metric_history(search.info.run_id, "evidence.diffs")
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == evidence["diffs"]
        assert metrics["evidence.lower_bound"] == pytest.approx(evidence["lower_bound"])
    assert search.data.params["budget.trials"] == str(
        yaml.safe_load((REPO / "params.yaml").read_text())["hpo"]["budget"]["trials"]
    )
    # the pipeline run says what was decided, whatever it was
    parent = client.get_run(logged.id).data
    assert parent.tags["hpo_adopted"] == str(decision["adopted"]).lower()
    assert parent.tags["hpo_reason"] == decision["reason"]
    assert {k for k in parent.params if k.startswith("overlay.")} == {
        f"overlay.{k}" for k in (overlay["params"] if overlay["adopted"] else {})
    }


def test_plots_and_files_are_artifacts_of_the_search_run(logged, searched: Path) -> None:
    plots = {"parallel_coordinate.png", "param_importances.png"}
    assert plots <= {p.name for p in searched.iterdir()}  # 3 complete trials, varying params
    names = {a.path for a in logged.client.list_artifacts(logged.search_id)}
    assert names == plots | {"overlay.yaml", "decision.yaml", "trials.json", "manifest.json"}
    local = Path(logged.client.download_artifacts(logged.search_id, "trials.json"))
    assert json.loads(local.read_text()) == logged.trials


def test_a_run_per_trial_with_its_params_state_and_curve(logged) -> None:
    client = logged.client
    runs = _children(client, logged.experiment_id, logged.search_id)
    by_trial = {int(r.data.tags["trial"]): r for r in runs}
    trials = logged.trials["trials"]
    assert sorted(by_trial) == [t["number"] for t in trials] == list(range(TRIALS))
    for trial in trials:
        run = by_trial[trial["number"]]
        assert run.info.run_name == f"trial-{trial['number']}"
        assert run.data.tags["state"] == trial["state"]
        assert run.info.status == ("FAILED" if trial["state"] == "FAIL" else "FINISHED")
        assert run.data.params == {k: overrides.format_value(v) for k, v in trial["params"].items()}
        curve = client.get_metric_history(run.info.run_id, "val_accuracy")
        assert len(curve) == len(trial["curve"]) == TRIAL_EPOCHS  # every epoch the trial ran
        assert sorted((m.step, m.value) for m in curve) == [tuple(p) for p in trial["curve"]]
        assert run.data.metrics["value"] == trial["value"]
        # overlays' params are typed back from what the run shows
        assert {k: overrides.parse_value(v) for k, v in run.data.params.items()} == trial["params"]


def test_logging_again_adds_no_run_and_no_point(logged, searched: Path) -> None:
    client = CountingClient(logged.client)
    again = tracking_hpo.log_search(
        client, logged.experiment_id, logged.id, searched, logged.tags, {}
    )
    assert again == logged.search_id
    assert not client.calls["create_run"] and not client.calls["log_artifact"]
    assert len(_children(logged.client, logged.experiment_id, logged.id)) == 1
    runs = _children(logged.client, logged.experiment_id, logged.search_id)
    assert len(runs) == TRIALS
    history = logged.client.get_metric_history(runs[0].info.run_id, "val_accuracy")
    assert len(history) == TRIAL_EPOCHS


def test_a_big_study_costs_three_calls_per_trial_whatever_its_curves(
    server, searched: Path, tmp_path: Path
) -> None:
    """60 trials of 40 epochs, each state, made from the real trials.json: the calls grow
    with the trials (create, one batch, end), not with the metric points; a logger killed
    part way is resumed without logging a trial twice."""
    big = tmp_path / "hpo"
    shutil.copytree(searched, big)
    real = json.loads((searched / "trials.json").read_text())
    epochs, n = 40, 60
    states = ("COMPLETE", "PRUNED", "FAIL")
    rows = []
    for i in range(n):
        state = states[i % 3]
        row = dict(real["trials"][i % len(real["trials"])], number=i, state=state)
        length = epochs if state == "COMPLETE" else (epochs // 2 if state == "PRUNED" else 0)
        row["curve"] = [[e, 0.5 + e / 100] for e in range(1, length + 1)]
        row["value"] = row["curve"][-1][1] if state == "COMPLETE" else None
        row["error"] = "exit 1: RuntimeError: out of memory" if state == "FAIL" else None
        rows.append(row)
    (big / "trials.json").write_text(json.dumps({**real, "best": 0, "trials": rows}))
    pipeline = _pipeline_run(server, "hpo-tracking-big")
    client = CountingClient(pipeline.client)
    search_id = tracking_hpo.log_search(
        client, pipeline.experiment_id, pipeline.id, big, pipeline.tags, {}
    )
    per_trial = {"create_run": n + 1, "log_batch": n + 2, "set_terminated": n + 1}
    assert {k: client.calls[k] for k in per_trial} == per_trial
    assert sum(client.calls.values()) - sum(per_trial.values()) <= 10  # searches, artifacts
    runs = {
        int(r.data.tags["trial"]): r
        for r in _children(pipeline.client, pipeline.experiment_id, search_id)
    }
    assert len(runs) == n
    for number, state, status, points in (
        (0, "COMPLETE", "FINISHED", epochs),
        (1, "PRUNED", "FINISHED", epochs // 2),
        (2, "FAIL", "FAILED", 0),
    ):
        run = runs[number]
        assert (run.data.tags["state"], run.info.status) == (state, status)
        history = pipeline.client.get_metric_history(run.info.run_id, "val_accuracy")
        assert sorted(m.step for m in history) == list(range(1, points + 1))
    assert runs[2].data.tags["error"] == "exit 1: RuntimeError: out of memory"
    assert "value" not in runs[1].data.metrics and runs[0].data.metrics["value"] == 0.9
    # killed part way: the search run RUNNING, trial 5 RUNNING, trials 6.. never logged
    pipeline.client.delete_run(runs[5].info.run_id)
    pipeline.client.create_run(
        pipeline.experiment_id,
        tags={"mlflow.parentRunId": search_id, "trial": "5"},
        run_name="trial-5",
    )
    for number in range(6, n):
        pipeline.client.delete_run(runs[number].info.run_id)
    pipeline.client.update_run(search_id, "RUNNING")
    resumed = CountingClient(pipeline.client)
    assert (
        tracking_hpo.log_search(
            resumed, pipeline.experiment_id, pipeline.id, big, pipeline.tags, {}
        )
        == search_id
    )
    assert resumed.calls["create_run"] == n - 5 and resumed.calls["delete_run"] == 1
    after = _children(pipeline.client, pipeline.experiment_id, search_id)
    assert sorted(int(r.data.tags["trial"]) for r in after) == list(range(n))
    assert all(r.info.status != "RUNNING" for r in after)
    assert pipeline.client.get_run(search_id).info.status == "FINISHED"


def test_search_off_records_the_decision_and_no_run(server, switched_off: Path) -> None:
    assert not (switched_off / "trials.json").exists()
    pipeline = _pipeline_run(server, "hpo-tracking-off")
    assert (
        tracking_hpo.log_search(
            pipeline.client, pipeline.experiment_id, pipeline.id, switched_off, pipeline.tags
        )
        is None
    )
    assert _children(pipeline.client, pipeline.experiment_id, pipeline.id) == []
    tags = pipeline.client.get_run(pipeline.id).data.tags
    assert (tags["hpo_adopted"], tags["hpo_reason"]) == ("false", "hpo.enabled is false")


def test_a_malformed_trials_file_is_one_line(searched: Path, tmp_path: Path) -> None:
    bad = tmp_path / "hpo"
    shutil.copytree(searched, bad)
    doc = json.loads((bad / "trials.json").read_text())
    del doc["trials"][1]["state"]
    (bad / "trials.json").write_text(json.dumps(doc))
    with pytest.raises(StepError) as err:
        tracking_hpo.read_search(bad)
    assert str(err.value) == f"{bad / 'trials.json'}: trials[1].state: expected str"


def test_a_malformed_or_missing_decision_is_one_line(searched: Path, tmp_path: Path) -> None:
    """decision.yaml (the reason and evidence the tags and the search run show) is checked like
    the overlay: one line naming the file and the field, and it must agree with the overlay."""
    bad = tmp_path / "hpo"
    shutil.copytree(searched, bad)
    file = bad / "decision.yaml"
    good = yaml.safe_load(file.read_text())
    adopted = str(good["adopted"]).lower()
    flipped = str(not good["adopted"]).lower()
    cases = [
        ({**good, "reason": None}, "reason: expected the decision's one line"),
        ({**good, "evidence": [1, 2]}, "evidence: expected a mapping"),
        ({**good, "adopted": "maybe"}, "adopted: expected true or false"),
        (
            {**good, "adopted": not good["adopted"]},
            f"adopted: {flipped}, but overlay.yaml beside it says {adopted}",
        ),
    ]
    for doc, message in cases:
        file.write_text(yaml.safe_dump(doc))
        with pytest.raises(StepError) as err:
            tracking_hpo.read_search(bad)
        assert str(err.value) == f"{file}: {message}"
    file.write_text("reason: [unclosed\n")
    with pytest.raises(StepError, match=r"decision\.yaml: not YAML: ") as err:
        tracking_hpo.read_search(bad)
    assert "\n" not in str(err.value)
    file.unlink()
    with pytest.raises(StepError) as err:
        tracking_hpo.read_search(bad)
    assert str(err.value) == f"{file}: missing (the hpo step writes it beside its overlay)"
