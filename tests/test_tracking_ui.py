"""What the MLflow UI shows of a pipeline run (issue 39): read back with ``MlflowClient``.

The real track, register and promote steps run once (module fixture) on the session's step
outputs against a real ``mlflow server`` on loopback; validate runs through its Step
declaration (``Step.call``, as the CLI and KFP run it) so that its manifest records when it
started. Then: the experiment is a model-training one (MLflow 3's experiment kind), the step
runs carry the steps' own times, the training curves are metric histories (one point per
epoch) in a section of their own, register and promote leave runs under the pipeline run
with the decision, and the serving-image tags agree with each other.
"""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace

import pytest

from components.core.artifacts import read_json, step_clock, write_manifest
from components.tracking.registry import CURVE_PREFIX, EXPERIMENT_KIND, EXPERIMENT_KIND_TAG
from tests.conftest import STEP_RUNS, track_register_promote
from tests.test_registry import TASK_OPTIONS, server  # noqa: F401  (the module's server)

NAME = "tracking-ui-classifier"
EXPERIMENT = "tracking-ui-tests"


def _ms(iso: str) -> int:
    return int(round(datetime.fromisoformat(iso).timestamp() * 1000))


@pytest.fixture(scope="module")
def pipeline(server, step_outputs, tmp_path_factory, digits_task, digits_data):  # noqa: F811
    """validate through Step.call, then track, register and promote: what the UI reads."""
    from dataclasses import replace

    from mlflow import MlflowClient

    from components.kernel.step import load
    from components.steps.promote import PromoteParams
    from components.steps.register import RegisterParams

    root = tmp_path_factory.mktemp("tracking-ui")
    task = {"name": "digits", "options": TASK_OPTIONS}
    load("validate").call(
        {"task": task, "validate": {}}, {"data": digits_data, "report": root / "validate"}
    )
    outputs = replace(step_outputs, report=root / "validate")
    done = track_register_promote(
        server,
        outputs,
        root,
        digits_task,
        digits_data,
        all_params={"task": task, "validate": {}},
        experiment=EXPERIMENT,
        model_name=NAME,
        register=RegisterParams(min_accuracy=0.5),
        promote=PromoteParams(),
    )
    registered, promoted = done.registered, done.promoted
    client = MlflowClient(tracking_uri=server, registry_uri=server)
    run_id = read_json(root / "track" / "run.json")["run_id"]
    parent = client.get_run(run_id)
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'"
    )
    return SimpleNamespace(
        root=root,
        client=client,
        outputs=outputs,
        parent=parent,
        runs={c.info.run_name: c for c in children},
        registered=registered,
        promoted=promoted,
    )


def test_the_experiment_is_a_model_training_one(pipeline):
    experiment = pipeline.client.get_experiment(pipeline.parent.info.experiment_id)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"


def test_run_json_names_the_runs_page_of_the_ui(pipeline):
    run_json = read_json(pipeline.root / "track" / "run.json")
    experiment_id, run_id = pipeline.parent.info.experiment_id, pipeline.parent.info.run_id
    assert run_json["ui_path"] == (
        f"#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"
    )
    assert run_json["experiment_ui_path"] == (
        f"#/experiments/{experiment_id}?workflowType=machine_learning"
    )


def test_a_kind_the_user_chose_stands(server):  # noqa: F811
    from mlflow import MlflowClient

    from components.tracking.registry import set_experiment_kind

    client = MlflowClient(tracking_uri=server)
    experiment_id = client.create_experiment("tracking-ui-genai")
    set_experiment_kind(client, experiment_id)
    assert client.get_experiment(experiment_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, "genai_development")
    set_experiment_kind(client, experiment_id)
    assert client.get_experiment(experiment_id).tags[EXPERIMENT_KIND_TAG] == "genai_development"


def test_step_runs_carry_the_times_their_steps_recorded(pipeline):
    manifests = pipeline.outputs.manifests()
    validate = manifests["validate"]  # run through Step.call: it recorded its start
    run = pipeline.runs["validate"]
    assert run.info.start_time == _ms(validate["started_at"])
    assert run.info.end_time == _ms(validate["finished_at"])
    assert run.info.end_time > run.info.start_time and "step_timing" not in run.data.tags
    # the session fixtures ran the other steps' functions directly: no start recorded, and
    # the run says so rather than showing the time track took to log it
    for step in ("train", "evaluate", "serving_image"):
        run, manifest = pipeline.runs[step], manifests[step]
        assert "started_at" not in manifest
        assert "not recorded" in run.data.tags["step_timing"]
        assert run.info.start_time == run.info.end_time == _ms(manifest["finished_at"])
    # the pipeline run spans them all, to the end of promote (the last run under it)
    parent = pipeline.client.get_run(pipeline.parent.info.run_id)
    children = pipeline.runs.values()
    assert parent.info.start_time == min(c.info.start_time for c in children)
    assert parent.info.end_time == max(c.info.end_time for c in children)
    assert parent.info.end_time == pipeline.runs["promote"].info.end_time


def test_a_manifest_says_when_its_step_started_and_finished(tmp_path):
    with step_clock(now=1_000_000.25):
        write_manifest(tmp_path / "a", "a", inputs={}, outputs={}, params={})
    write_manifest(tmp_path / "b", "b", inputs={}, outputs={}, params={})
    a, b = read_json(tmp_path / "a" / "manifest.json"), read_json(tmp_path / "b" / "manifest.json")
    assert a["started_at"] == "1970-01-12T13:46:40.250+00:00"
    assert _ms(a["finished_at"]) > _ms(a["started_at"])
    assert "started_at" not in b and b["finished_at"]  # outside a step's clock


def test_the_training_curves_are_histories_in_their_own_section(pipeline):
    client, parent = pipeline.client, pipeline.parent
    history = read_json(pipeline.outputs.model / "history.json")
    epochs = [row["epoch"] for row in history]
    assert len(epochs) >= 2
    keys = [k for k in history[0] if k != "epoch"]
    assert {"train_loss", "val_loss", "train_accuracy", "val_accuracy"} <= set(keys)
    for run in (parent, pipeline.runs["train"]):
        for key in keys:
            points = client.get_metric_history(run.info.run_id, f"{CURVE_PREFIX}{key}")
            assert sorted(m.step for m in points) == epochs, key
            assert [m.value for m in sorted(points, key=lambda m: m.step)] == [
                row[key] for row in history
            ]
    # the UI lists a prefixed section ("training") before the unprefixed metrics; those are
    # the few headline values, not every summary number (each step's run has its own)
    metrics = parent.data.metrics
    curves = {k for k in metrics if k.startswith(CURVE_PREFIX)}
    assert curves == {f"{CURVE_PREFIX}{k}" for k in keys}
    assert all("/" not in k for k in set(metrics) - curves)
    single = set(metrics) - curves
    assert "test.accuracy" in single and "qat.size_ratio" in single
    assert not {"train.epochs_run", "train.world_size", "qat.gate_samples", "ge_success"} & single
    assert len(single) <= 20
    assert "epochs_run" in pipeline.runs["train"].data.metrics  # still the train run's


def test_register_and_promote_leave_runs_with_their_decision(pipeline):
    runs, client = pipeline.runs, pipeline.client
    # no search ran for this fixture's outputs: no hpo run (tests/test_hpo_tracking.py has one)
    assert set(runs) == set(STEP_RUNS) - {"hpo"}
    register, promote = runs["register"], runs["promote"]
    version = pipeline.registered.version
    for run in (register, promote):
        assert run.info.status == "FINISHED"
        assert run.data.tags["step"] == run.info.run_name
        assert run.data.tags["registered_model"] == NAME
        assert run.data.tags["model_version"] == str(version)
    assert register.data.tags["blessed"] == "true" and register.data.metrics["blessed"] == 1.0
    assert register.data.tags["blessing_reasons"]
    assert "blessing.json" in {f.path for f in client.list_artifacts(register.info.run_id)}
    assert promote.data.tags["promoted"] == "true"
    assert promote.data.tags["decision"] == f"promoted: v{version} is the champion (the first)"
    assert pipeline.promoted.decision == promote.data.tags["decision"]
    assert "promotion.json" in {f.path for f in client.list_artifacts(promote.info.run_id)}
    # the pipeline run holds the training record, not the decision's numbers
    assert not any(k.startswith("blessing") for k in pipeline.parent.data.metrics)


def test_blessing_reasons_say_why_the_version_was_blessed(pipeline):
    mv = pipeline.client.get_model_version(NAME, str(pipeline.registered.version))
    reasons = mv.tags["blessing_reasons"].split("; ")
    assert mv.tags["blessed"] == "true"
    assert reasons == pipeline.registered.blessing.passed
    assert "lineage complete" in reasons[0]
    assert any(r.startswith("accuracy ") and ">= register.min_accuracy 0.5" in r for r in reasons)
    assert "no champion yet: nothing to regress against" in reasons


def test_serving_image_tags_never_contradict(pipeline):
    """The session's step outputs are those of a machine without an image builder."""
    infra = read_json(pipeline.outputs.infra / "infra.json")
    assert infra["built"] is False
    mv = pipeline.client.get_model_version(NAME, str(pipeline.registered.version))
    for tags in (pipeline.parent.data.tags, mv.tags):
        assert tags["serving_image_built"] == "false"
        assert "serving_image" not in tags and "serving_image_id" not in tags
        assert infra["builder_note"] in tags["serving_image_not_built"]
        assert infra["image"] in tags["serving_image_not_built"]
        assert tags["serving_image_context_sha256"] == infra["context_sha256"]


def test_serving_image_tags_of_a_built_image():
    from components.tracking.step_outputs import serving_image_tags

    built = {"image": "r/x:1", "image_id": "abc", "built": True, "context_sha256": "c" * 64}
    assert serving_image_tags(built, {}) == {
        "serving_image": "r/x:1",
        "serving_image_id": "abc",
        "serving_image_built": "true",
        "serving_image_context_sha256": "c" * 64,
    }
    none = {**built, "built": False, "image_id": None, "builder_note": "no podman"}
    tags = serving_image_tags(none, {})
    assert tags["serving_image_built"] == "false" and "serving_image" not in tags
    assert tags["serving_image_not_built"].startswith("no podman; ")


def test_a_failing_step_run_ends_failed_with_its_reason(server):  # noqa: F811
    from mlflow import MlflowClient

    from components.tracking.registry import step_run

    client = MlflowClient(tracking_uri=server)
    experiment_id = client.create_experiment("tracking-ui-failures")
    parent = client.create_run(experiment_id, run_name="pipeline")
    client.set_terminated(parent.info.run_id, "FINISHED")
    ended = client.get_run(parent.info.run_id).info.end_time
    with (
        pytest.raises(RuntimeError),
        step_run(client, parent.info.run_id, "promote", stale_after_s=600) as run_id,
    ):
        raise RuntimeError("the registry said no")
    failed = client.get_run(run_id)
    assert failed.info.status == "FAILED"
    assert failed.data.tags["failure_reason"] == "RuntimeError: the registry said no"
    assert failed.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert client.get_run(parent.info.run_id).info.end_time == ended  # only a finish extends it


def test_a_killed_attempts_step_run_is_ended_killed_by_the_next_attempt(server):  # noqa: F811
    """register/promote SIGKILLed after their run started leave it RUNNING; the rerun's step
    run ends it KILLED with the reason (a live owner's run is left alone)."""
    import socket
    import subprocess
    import sys

    from mlflow import MlflowClient

    from components.tracking.liveness import HOST_TAG, PID_TAG, owner_tags
    from components.tracking.registry import STEP_TAG, step_run

    client = MlflowClient(tracking_uri=server)
    experiment_id = client.create_experiment("tracking-ui-killed-attempt")
    parent = client.create_run(experiment_id, run_name="pipeline").info.run_id
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs
    nested = {"mlflow.parentRunId": parent, STEP_TAG: "register"}
    dead = client.create_run(
        experiment_id,
        tags={**nested, HOST_TAG: socket.gethostname(), PID_TAG: str(gone.pid)},
        run_name="register",
    ).info.run_id
    alive = client.create_run(experiment_id, tags={**nested, **owner_tags()}).info.run_id
    with step_run(client, parent, "register", stale_after_s=600) as run_id:
        pass
    killed = client.get_run(dead)
    assert killed.info.status == "KILLED"
    assert f"its process {gone.pid}" in killed.data.tags["failure_reason"]
    assert client.get_run(alive).info.status == "RUNNING"  # this process: alive
    assert client.get_run(run_id).info.status == "FINISHED"
