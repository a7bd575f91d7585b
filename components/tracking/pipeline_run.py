"""One pipeline execution as MLflow runs: the parent run's contents, a nested run per step,
and the runs a dead track or a failed pipeline left RUNNING.

What is logged is read by :mod:`components.tracking.step_outputs`; the track step opens the
parent run and calls :func:`log_pipeline_run` inside it.

Library layer: imported by the track step and the KFP pipeline's exit handler, imports no
step. The ``track`` section's params model (:class:`TrackParams`) lives here so the track step
declares it and other readers (``mlflow-users``) read it typed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from components.core.artifacts import StepError, read_json
from components.core.config import params_model, params_source
from components.faults import failpoints
from components.ml.decisions.monitoring import RETRAIN_REASON_ENV
from components.tracking.liveness import (
    FAILURE_TAG,
    HOST_TAG,
    PIPELINE_RUN_TAG,
    dead_owner,
    mark_failed,
    owner_tags,
)
from components.tracking.model import BUNDLE_TAG, LoggedBundle, log_bundle_model
from components.tracking.registry import UI_WORKFLOW, TrackingRetry, use_experiment
from components.tracking.step_outputs import (
    HEADLINE_METRICS,
    StepOutputs,
    ended_ms,
    epoch_metrics,
    flatten,
    numeric_metrics,
    step_machine_tags,
    step_times,
)

log = logging.getLogger(__name__)


# ``track`` in params.yaml, declared by the track step and read typed by ``mlflow-users``
# (no docstring: it would be the schema's description)
@params_model
class TrackParams:
    experiment: str = "digits"
    run_name_prefix: str = "pipeline"
    # a RUNNING run of this pipeline from another host older than this died with its node;
    # one from this host whose process is gone is closed at once
    stale_run_s: Annotated[float, Field(gt=0)] = 3600.0
    retry: TrackingRetry = field(default_factory=TrackingRetry)


def close_dead_runs(client: Any, experiment_id: str, stale_after_s: float, closer: str) -> list:
    """Mark KILLED, with the reason, every RUNNING run of this pipeline in the experiment
    whose process is gone (:func:`components.tracking.liveness.dead_owner`): what a SIGKILLed or
    preempted track could not close itself. Returns the ids closed."""
    from mlflow.entities import ViewType

    closed = []
    running = client.search_runs(
        [experiment_id],
        filter_string="attributes.status = 'RUNNING'",
        run_view_type=ViewType.ACTIVE_ONLY,
        max_results=1000,
    )
    for old in running:
        tags = old.data.tags
        if HOST_TAG not in tags:
            continue  # not ours (a notebook's, another tool's): not ours to judge
        why = dead_owner(tags, old.info.start_time / 1000.0, stale_after_s)
        if why is None:
            continue
        mark_failed(client, old, "KILLED", f"found RUNNING by {closer}: {why}")
        closed.append(old.info.run_id)
    return closed


def fail_pipeline_runs(client: Any, experiment_id: str, pipeline_run: str, reason: str) -> list:
    """The MLflow runs of pipeline run ``pipeline_run`` (tag :data:`PIPELINE_RUN_TAG`) after
    the pipeline failed: the parent run FAILED whatever track left it as (it ended FINISHED
    when track itself succeeded, but the pipeline execution it records did not), a nested
    run still RUNNING KILLED; both with ``failure_reason``. A nested run that finished keeps
    its status (that step did finish). Returns the ids of the parent runs found."""
    if not pipeline_run:
        return []
    parents = []
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.{PIPELINE_RUN_TAG} = '{pipeline_run}'"
    )
    for found in runs:
        nested = "mlflow.parentRunId" in found.data.tags
        if not nested:
            parents.append(found.info.run_id)
        elif found.info.status != "RUNNING":
            continue
        mark_failed(client, found, "KILLED" if nested else "FAILED", reason)
    return parents


@contextlib.contextmanager
def closed_on_failure(client: Any, run_id: str) -> Iterator[None]:
    """An exception ends the active run ``run_id`` FAILED or, for an interrupt or SIGTERM,
    KILLED, with ``failure_reason`` saying why (inside ``mlflow.start_run``, which then has
    nothing left to end); if the server cannot be told, the next track run closes it
    (:func:`close_dead_runs`)."""
    import mlflow

    try:
        yield
    except BaseException as exc:
        reason = f"{type(exc).__name__}: {exc}".strip()[:500]
        status = "KILLED" if isinstance(exc, KeyboardInterrupt | SystemExit) else "FAILED"
        with contextlib.suppress(Exception):
            client.set_tag(run_id, FAILURE_TAG, reason)
            active = mlflow.active_run()
            if active is not None and active.info.run_id == run_id:
                mlflow.end_run(status)
            else:
                client.set_terminated(run_id, status)
        raise


def ui_path(experiment_id: str, run_id: str = "") -> str:
    """The MLflow UI's path (after ``http://HOST:PORT/``) of the experiment's training runs,
    or of run ``run_id``: the ``workflowType=machine_learning`` query makes MLflow 3's UI
    show runs and models rather than its GenAI overview (the UI decides by that query, not by
    the experiment's kind tag)."""
    where = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{where}?workflowType={UI_WORKFLOW}"


def log_step_run(
    client: Any,
    experiment_id: str,
    parent_id: str,
    step: str,
    tags: Mapping[str, str],
    manifest: Mapping[str, Any],
    section_params: Any,
    step_values: Mapping[str, Any],
    history: list[dict[str, Any]],
    files: list[tuple[Path, str | None]],
) -> str:
    """The nested run of ``step``: its params, metrics, curves and files, started and ended
    when the step's manifest says the step did (``step_timing`` says when it recorded no
    start: then the run starts and ends when the step finished)."""
    from mlflow.entities import Param

    span = step_times(manifest)
    ended = span[1] if span else ended_ms(manifest)
    step_tags = {**tags, "step": step, "mlflow.parentRunId": parent_id}
    if span is None:
        step_tags["step_timing"] = (
            f"not recorded: the {step} manifest has no started_at (the step ran outside "
            "paddle-mlops' step runner); the run shows when it finished"
        )
    run_id = client.create_run(
        experiment_id,
        start_time=span[0] if span else ended,
        tags=step_tags,
        run_name=step,
    ).info.run_id
    with closed_on_failure(client, run_id):
        if isinstance(section_params, Mapping) and section_params:
            client.log_batch(
                run_id,
                params=[Param(k, str(v)[:6000]) for k, v in flatten(section_params)],
            )
        values = numeric_metrics(step_values, "")
        stamp = ended or int(time.time() * 1000)
        client.log_batch(
            run_id,
            metrics=[_metric(k, v, stamp) for k, v in values.items()]
            + epoch_metrics(history, stamp),
        )
        for path, artifact_path in files:
            if path.is_dir():
                client.log_artifacts(run_id, str(path), artifact_path)
            elif path.is_file():
                client.log_artifact(run_id, str(path), artifact_path)
        client.set_terminated(run_id, "FINISHED", end_time=ended)
    return run_id


def _metric(key: str, value: float, timestamp_ms: int) -> Any:
    from mlflow.entities import Metric

    return Metric(key, value, timestamp_ms, 0)


def open_experiment(name: str, uri: str, shown_uri: str) -> str:
    """The id of experiment ``name`` at ``uri`` (created if new); one error line naming the
    (redacted) URI when MLflow cannot open it."""
    try:
        return use_experiment(name).experiment_id
    except Exception as exc:  # MLflow raises its own exception types for bad URIs/backends
        raise StepError(
            f"MLflow tracking at {shown_uri}: cannot open experiment '{name}' "
            f"({str(exc).replace(uri, shown_uri)})"
        ) from exc


def execution_tags(pipeline_run: str, retrain_reason: str) -> dict[str, str]:
    """The tags of this execution: this process's owner tags, the orchestrator's pipeline run
    id (:data:`PIPELINE_RUN_TAG`) and why it retrains (``retrain_reason``) when known."""
    tags = {**owner_tags(), **({PIPELINE_RUN_TAG: pipeline_run} if pipeline_run else {})}
    # why this run retrains, when a monitor's alarm started it (KFP: the pipeline argument;
    # dvc repro: the environment the monitor set)
    if why := (retrain_reason or os.environ.get(RETRAIN_REASON_ENV, "")):
        tags["retrain_reason"] = why[:4000]
    return tags


def pipeline_start(
    client: Any, experiment_id: str, manifests: Mapping[str, Mapping[str, Any]]
) -> int | None:
    """When the pipeline run starts (epoch ms; None: now). It spans its steps' runs: from the
    earliest start (a step that recorded none: its end, as its run shows) among the steps
    this execution ran; outputs dvc repro kept from an earlier execution (they ended before
    the previous pipeline run did) are not part of it, so the newest execution is the newest
    run in the UI."""
    starts = [(span[0] if (span := step_times(m)) else ended_ms(m)) for m in manifests.values()]
    previous = client.search_runs(
        [experiment_id],
        "tags.mlflow.parentRunId IS NULL",
        order_by=["attributes.end_time DESC"],
        max_results=1,
    )
    after = (previous[0].info.end_time or 0) if previous else 0
    started = [t for t in starts if t is not None and t > after]
    return min(started) if started else None


def log_pipeline_run(
    client: Any,
    parent_id: str,
    experiment_id: str,
    all_params: Mapping[str, Any],
    outputs: StepOutputs,
    manifests: Mapping[str, Mapping[str, Any]],
    metrics: Mapping[str, Mapping[str, Any]],
    history: list[dict[str, Any]],
    tags: Mapping[str, str],
) -> LoggedBundle:
    """Inside the active parent run ``parent_id``: every param, the bundle as an MLflow model
    (checked to be the bundle the run's tag names), the headline metrics, the training
    curves (``history``: train's ``history.json``), plots and metric files, then a nested run
    per step. Returns the logged model."""
    import mlflow

    flat = {k: str(v) for k, v in flatten(all_params)}
    mlflow.log_params({k: v[:6000] for k, v in flat.items()})
    task_section = all_params.get("task") or {}
    logged = log_bundle_model(
        outputs.bundle,
        outputs.data,
        str(task_section.get("name", "")),
        task_section.get("options"),
        source=params_source(all_params),
    )
    if logged.bundle_sha256 != tags[BUNDLE_TAG]:
        raise StepError(
            f"{outputs.bundle}: changed while track ran (sha256 {logged.bundle_sha256[:12]}, "
            f"run tag {BUNDLE_TAG} {tags[BUNDLE_TAG][:12]}); run the pipeline again"
        )
    mlflow.log_metrics(numeric_metrics(metrics["evaluate"], "test."), model_id=logged.model_id)
    summary = {
        **numeric_metrics(metrics["train"], "train."),
        **numeric_metrics(metrics["qat"], "qat."),
    }
    mlflow.log_metrics({k: summary[k] for k in HEADLINE_METRICS if k in summary})
    curves_at = ended_ms(manifests["train"]) or int(time.time() * 1000)
    client.log_batch(parent_id, metrics=epoch_metrics(history, curves_at))
    for name, plot in (("train", outputs.train_plots), ("confusion", outputs.confusion)):
        mlflow.log_text(plot.read_text(encoding="utf-8"), f"plots/{name}.csv")
    for step, file in (
        ("train", outputs.train_metrics),
        ("qat", outputs.qat_metrics),
        ("evaluate", outputs.evaluate_metrics),
    ):
        mlflow.log_dict(read_json(file), f"metrics/{step}.json")
    for step, files in outputs.step_files().items():
        failpoints.hit("track.mid_upload", f"before the {step} run's artifacts")
        log_step_run(
            client,
            experiment_id,
            parent_id,
            step,
            {**tags, **step_machine_tags(manifests.get(step, {}))},
            manifests.get(step, {}),
            all_params.get(step, {}),
            metrics.get(step, {}),
            history if step == "train" else [],
            files,
        )
    return logged
