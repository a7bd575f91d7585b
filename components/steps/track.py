"""track: record one pipeline execution as one MLflow run, with a nested run per step.

Runs after evaluate and reads only the files the steps wrote, so the steps stay free of
MLflow. The experiment is tagged ``mlflow.experimentKind`` = ``custom_model_development``
(MLflow 3: a model-training experiment, not a GenAI one). The parent run carries every
parameter of ``params.yaml`` (flattened), the per-epoch training curves (``training/<key>``
with ``step`` = epoch: the first section of charts in the UI), the headline metrics
(``test.*``, a few of ``qat.*`` and ``train.*``; every other summary value is a metric of
its step's nested run), the tags ``git_sha``, ``data_sha256`` (of the raw inputs),
``snapshot_sha256`` (of the ingested snapshot's ``snapshot.json``), ``params_sha256``, ``task``,
``bundle_sha256`` and the serving image's (:func:`serving_image_tags`), and the packaged
serving bundle as an MLflow model (an MLflow 3 LoggedModel named ``model``, a ``pyfunc`` with
a signature and an input example from the test split: :mod:`components.tracking.model`); the
headline test metrics are linked to that model. Each nested run (ingest ... evaluate,
serving_image) carries that step's manifest, outputs such as the Great Expectations result
and Data Docs, and metrics. Every run carries the times its step recorded (the manifest's
``started_at`` and ``finished_at``: :func:`components.core.artifacts.write_manifest`), not
the time track took to log it. The hyperparameter search (:mod:`components.tracking.hpo`): the
parent run is tagged ``hpo_adopted`` and ``hpo_reason`` (and gets the adopted keys as params
``overlay.<key>``); when a search ran, a nested run ``hpo`` holds it, with a run per trial
nested under it (params, state, per-epoch objective curve). The parent run starts when the
earliest of its steps started and ends when track ends (``register`` and ``promote`` add their
nested runs and extend it).

Tracking URI: ``MLFLOW_TRACKING_URI`` if set, else ``sqlite:///mlflow.db`` in the working
directory (no server needed). ``run.json`` in the output directory names the run and the
logged model (``model_id``, ``model_uri`` = ``models:/<model_id>``, ``bundle_sha256``) that
``register`` versions; the tracking URI in it is redacted (no credentials).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.artifacts import (
    read_json,
    write_json,
)
from components.core.uris import redact_uri
from components.kernel.step import In, Out, Step, Value
from components.ml.decisions.monitoring import RETRAIN_REASON_ENV
from components.tracking.hpo import log_search
from components.tracking.model import BUNDLE_TAG
from components.tracking.pipeline_run import (
    TrackParams,
    close_dead_runs,
    closed_on_failure,
    execution_tags,
    log_pipeline_run,
    open_experiment,
    pipeline_start,
    ui_path,
)
from components.tracking.registry import (
    global_tracking_uri,
    set_experiment_kind,
    tracking_uri,
)
from components.tracking.step_outputs import StepOutputs, lineage_tags, step_metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrackResult:
    run_id: str
    experiment_id: str
    tracking_uri: str
    model_id: str = ""
    model_uri: str = ""
    bundle_sha256: str = ""


def run(
    params: TrackParams,
    all_params: Mapping[str, Any],
    out_dir: str | Path,
    outputs: StepOutputs,
    pipeline_run: str = "",
    retrain_reason: str = "",
    hpo_dir: str | Path | None = None,
) -> TrackResult:
    """Log the pipeline's run to MLflow at ``$MLFLOW_TRACKING_URI`` (else the default). The
    process's MLflow tracking URI is set for the run and put back after it, so a caller in the
    same process (a notebook, a test) keeps its own. ``hpo_dir``: the hpo step's output
    directory (None: the caller ran no hpo step; nothing about a search is logged)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    with global_tracking_uri(tracking_uri()):
        return _run(params, all_params, out_dir, outputs, pipeline_run, retrain_reason, hpo_dir)


def _run(
    params: TrackParams,
    all_params: Mapping[str, Any],
    out_dir: str | Path,
    outputs: StepOutputs,
    pipeline_run: str,
    retrain_reason: str,
    hpo_dir: str | Path | None = None,
) -> TrackResult:
    """:func:`run`'s work (telemetry off, the tracking URI set)."""
    import mlflow

    out_dir = Path(out_dir)
    params.retry.apply()
    uri = tracking_uri()
    shown_uri = redact_uri(uri)
    if shown_uri != uri:  # MLflow prints "View run <tracking URI>/#/..." links as they are
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    manifests = outputs.manifests()
    metrics = step_metrics(outputs)
    tags = lineage_tags(all_params, outputs, manifests, metrics)
    history = read_json(outputs.model / "history.json")
    experiment_id = open_experiment(params.experiment, uri, shown_uri)
    run_name = f"{params.run_name_prefix}-{tags['task']}-{(tags['git_sha'] or 'nogit')[:8]}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    close_dead_runs(client, experiment_id, params.stale_run_s, f"track (pid {os.getpid()})")
    tags = {**tags, **execution_tags(pipeline_run, retrain_reason)}
    set_experiment_kind(client, experiment_id)
    start = pipeline_start(client, experiment_id, manifests)
    created = client.create_run(experiment_id, start_time=start, tags=tags, run_name=run_name)
    with (
        mlflow.start_run(run_id=created.info.run_id) as parent,
        closed_on_failure(client, parent.info.run_id),
    ):
        logged = log_pipeline_run(
            client,
            parent.info.run_id,
            experiment_id,
            all_params,
            outputs,
            manifests,
            metrics,
            history,
            tags,
        )
        if hpo_dir is not None:
            log_search(
                client,
                experiment_id,
                parent.info.run_id,
                hpo_dir,
                tags,
                all_params.get("hpo") or {},
            )
        result = TrackResult(
            parent.info.run_id,
            parent.info.experiment_id,
            uri,
            logged.model_id,
            logged.model_uri,
            logged.bundle_sha256,
        )
    _write_run_json(out_dir, params.experiment, shown_uri, result, tags)
    return result


def _write_run_json(
    out_dir: Path, experiment: str, shown_uri: str, result: TrackResult, tags: Mapping[str, str]
) -> None:
    """``run.json``: the run and the logged model register versions (no credentials); the
    step's last log line names them."""
    write_json(
        out_dir / "run.json",
        {
            "run_id": result.run_id,
            "experiment_id": result.experiment_id,
            "experiment": experiment,
            # no credentials in files: register takes the URI from MLFLOW_TRACKING_URI first
            "tracking_uri": shown_uri,
            # what register versions: the LoggedModel of this run
            "model_id": result.model_id,
            "model_uri": result.model_uri,
            BUNDLE_TAG: result.bundle_sha256,
            # the run in the MLflow UI, after its base URL (MLflow 3.17's UI opens an
            # experiment by the workflow type in its URL, GenAI unless it says otherwise)
            "ui_path": ui_path(result.experiment_id, result.run_id),
            "experiment_ui_path": ui_path(result.experiment_id),
            "tags": tags,
        },
    )
    log.info(
        "MLflow run %s in experiment '%s' at %s: model %s",
        result.run_id,
        experiment,
        shown_uri,
        result.model_uri,
    )


def run_step(
    params: TrackParams,
    all_params: Mapping[str, Any],
    run_info: Path,
    pipeline_run: str = "",
    retrain_reason: str = "",
    *,
    search: Path,
    **paths: Path,
) -> TrackResult:
    """:func:`run` with each upstream output as its own port (the STEP binding)."""
    return run(
        params,
        all_params,
        run_info,
        StepOutputs(**paths),
        pipeline_run,
        retrain_reason,
        hpo_dir=search,
    )


def _port(name: str, path: str, source: str, kfp: Any = "Artifact") -> In:
    return In(name, path, name, source=source, kfp=kfp)


STEP = Step(
    name="track",
    doc=__doc__,
    params=TrackParams,
    # the run records every section, as the params of the whole pipeline
    sections=(
        "task",
        "ingest",
        "validate",
        "hpo",
        "train",
        "export",
        "qat",
        "package",
        "evaluate",
        "serving_image",
        "track",
        "register",
        "registry",
        "promote",
        "deploy",
    ),
    run=run_step,
    inputs=(
        _port("data", "outputs/ingest", "ingest.data", "Dataset"),
        _port("report", "outputs/validate", "validate.report"),
        # the hpo step's output directory (not "hpo": that is the params section)
        _port("search", "outputs/hpo", "hpo.out"),
        _port("model", "outputs/train", "train.model", "Model"),
        _port("exported", "outputs/export", "export.exported", "Model"),
        _port("int8", "outputs/qat", "qat.int8", "Model"),
        _port("bundle", "outputs/package", "package.bundle", "Model"),
        _port("evaluation", "outputs/evaluate", "evaluate.evaluation"),
        _port("infra", "outputs/serving_image", "serving_image.infra"),
        _port("train_metrics", "metrics/train.json", "train.metrics", "Metrics"),
        _port("qat_metrics", "metrics/qat.json", "qat.metrics", "Metrics"),
        _port("evaluate_metrics", "metrics/evaluate.json", "evaluate.metrics", "Metrics"),
        _port("train_plots", "plots/train.csv", "train.plots"),
        _port("confusion", "plots/confusion.csv", "evaluate.confusion", "ClassificationMetrics"),
    ),
    outputs=(Out("run_info", "outputs/track", "run_info", dvc="uncached", help="run.json"),),
    values=(
        Value(
            "pipeline_run",
            "pipeline_run",
            help="the orchestrator's id of this pipeline run (KFP: its job id), tagged "
            "pipeline_run_id on the MLflow runs",
        ),
        Value(
            "retrain_reason",
            "retrain_reason",
            help="why this run retrains (a monitor's alarm line), tagged retrain_reason on the "
            f"run and the version; default ${RETRAIN_REASON_ENV}",
        ),
    ),
)
