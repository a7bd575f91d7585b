"""Scheduled retraining: the requests ``pipelines/schedule.py`` would send to a KFP backend.

No KFP backend (API server, Argo, MySQL, MinIO) can run on these machines, so this is a
contract test: every call in the ``--dry-run`` plan must bind to the documented signature of
the ``kfp.Client`` method it names (kfp 2.17), with the scheduling semantics we promise
(6-field cron, no overlapping runs, no catch-up) and params.yaml as the pipeline parameter.
"""

import inspect
import json
import os
import subprocess
import sys

import kfp
import yaml

from pipelines.schedule import PIPELINE_NAME, check_cron, plan_create
from pipelines.training import pipeline_params
from tests.conftest import REPO


def dry_run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.schedule",
            "create",
            "--dry-run",
            "--package",
            str(tmp_path / "training.yaml"),
            *args,
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def bind(call: dict) -> inspect.BoundArguments:
    method = getattr(kfp.Client, call["method"])
    return inspect.signature(method).bind(None, **call["kwargs"])  # None stands for self


def test_dry_run_plan_matches_the_kfp_client_api(tmp_path):
    proc = dry_run(tmp_path, "--cron", "0 30 2 * * 0")
    assert proc.returncode == 0, proc.stderr
    calls = json.loads(proc.stdout)
    assert [c["method"] for c in calls] == ["upload_pipeline", "create_recurring_run"]
    for call in calls:
        bind(call)  # raises TypeError on an unknown or missing argument
    upload, recurring = (c["kwargs"] for c in calls)
    assert upload["pipeline_name"] == PIPELINE_NAME
    assert (tmp_path / "training.yaml").exists()  # compiled before upload
    assert recurring["cron_expression"] == "0 30 2 * * 0"
    assert recurring["max_concurrency"] == 1 and recurring["no_catchup"] is True
    assert recurring["service_account"] == "paddle-mlops-pipeline"
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert recurring["params"] == pipeline_params(params)
    assert set(recurring["params"]) >= {"train", "register"}


def test_an_existing_pipeline_gets_a_new_version(tmp_path):
    plan = plan_create(
        tmp_path / "p.yaml",
        experiment_id="e1",
        job_name="weekly",
        cron="0 0 3 * * 1",
        params={"train": {"epochs": 3}},
        version="v2",
        pipeline_id="p-123",
        service_account=None,
        pipeline_root="s3://b/r",
    )
    upload, recurring = plan.calls
    assert upload.method == "upload_pipeline_version"
    assert upload.kwargs["pipeline_id"] == "p-123"
    bind(asdict_call(upload))
    bound = bind(asdict_call(recurring))
    assert bound.arguments["pipeline_root"] == "s3://b/r"


def asdict_call(call) -> dict:
    return {"method": call.method, "kwargs": call.kwargs}


def test_five_field_cron_is_refused_readably(tmp_path):
    proc = dry_run(tmp_path, "--cron", "0 3 * * 1")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "KFP needs 6" in proc.stderr
    assert check_cron("0 0 3 * * 1") == "0 0 3 * * 1"


def trigger(tmp_path, monitor: dict) -> subprocess.CompletedProcess:
    (tmp_path / "monitor.json").write_text(json.dumps(monitor))
    return subprocess.run(
        [sys.executable, "-m", "pipelines.schedule", "trigger", "--dry-run",
         "--monitor", str(tmp_path / "monitor.json"), "--package", str(tmp_path / "t.yaml")],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_monitor_alarm_starts_one_run_with_its_reason_and_no_alarm_starts_none(tmp_path):
    """Retraining by evidence on a cluster: the monitor CronJob's alarm (monitor.json) becomes
    one KFP run whose retrain_reason argument the track task reads."""
    line = "monitor: ALARM digits-classifier version 3: input:mean (ks_2samp p=1e-09 < 0.0007)"
    proc = trigger(tmp_path, {"alarm": True, "alarm_line": line})
    assert proc.returncode == 0, proc.stderr
    calls = json.loads(proc.stdout)
    assert [c["method"] for c in calls] == ["upload_pipeline", "run_pipeline"]
    for call in calls:
        bind(call)
    run = calls[1]["kwargs"]
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert run["params"] == {**pipeline_params(params), "retrain_reason": line}
    assert run["service_account"] == "paddle-mlops-pipeline"
    compiled = next(yaml.safe_load_all((tmp_path / "t.yaml").read_text()))
    assert compiled["root"]["inputDefinitions"]["parameters"]["retrain_reason"] == {
        "defaultValue": "",
        "isOptional": True,
        "parameterType": "STRING",
    }

    proc = trigger(tmp_path, {"alarm": False})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
