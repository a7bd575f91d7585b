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
the time track took to log it; the parent run starts when the earliest of its steps started
and ends when track ends (``register`` and ``promote`` add their nested runs and extend it).

Tracking URI: ``MLFLOW_TRACKING_URI`` if set, else ``sqlite:///mlflow.db`` in the working
directory (no server needed). ``run.json`` in the output directory names the run and the
logged model (``model_id``, ``model_uri`` = ``models:/<model_id>``, ``bundle_sha256``) that
``register`` versions; the tracking URI in it is redacted (no credentials).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from components.core.artifacts import (
    StepError,
    combined_sha256,
    git_sha,
    machine_tags,
    read_json,
    write_json,
)
from components.core.config import params_model, params_sha256, params_source
from components.core.uris import redact_uri
from components.faults import failpoints
from components.kernel.step import In, Out, Step, Value
from components.ml import snapshot
from components.ml.monitoring import RETRAIN_REASON_ENV
from components.tracking.liveness import (
    FAILURE_TAG,
    HOST_TAG,
    PIPELINE_RUN_TAG,
    dead_owner,
    mark_failed,
    owner_tags,
)
from components.tracking.model import (
    BUNDLE_TAG,
    SERVED_TAG,
    bundle_sha256,
    log_bundle_model,
    served_sha256,
)
from components.tracking.registry import (
    CURVE_PREFIX,
    UI_WORKFLOW,
    TrackingRetry,
    global_tracking_uri,
    set_experiment_kind,
    tracking_uri,
    use_experiment,
)

log = logging.getLogger(__name__)


@params_model
class TrackParams:
    experiment: str = "digits"
    run_name_prefix: str = "pipeline"
    # a RUNNING run of this pipeline from another host older than this died with its node;
    # one from this host whose process is gone is closed at once
    stale_run_s: Annotated[float, Field(gt=0)] = 3600.0
    retry: TrackingRetry = field(default_factory=TrackingRetry)


@dataclass(frozen=True)
class StepOutputs:
    """Where each step left its files (the ports of the track step)."""

    data: Path
    report: Path
    model: Path
    exported: Path
    int8: Path
    bundle: Path
    evaluation: Path
    infra: Path
    train_metrics: Path
    qat_metrics: Path
    evaluate_metrics: Path
    train_plots: Path
    confusion: Path

    def manifests(self) -> dict[str, dict[str, Any]]:
        """Each step's manifest.json, keyed by step name."""
        dirs = {
            "ingest": self.data,
            "validate": self.report,
            "train": self.model,
            "export": self.exported,
            "qat": self.int8,
            "package": self.bundle,
            "evaluate": self.evaluation,
            "serving_image": self.infra,
        }
        return {step: read_json(d / "manifest.json") for step, d in dirs.items()}

    def step_files(self) -> dict[str, list[tuple[Path, str | None]]]:
        """What each nested run logs: (file or directory, artifact path)."""
        return {
            "ingest": [(self.data / "manifest.json", None), (self.data / "labels.json", None)],
            "validate": [(self.report, "great_expectations")],
            "train": [
                (self.model / n, None) for n in ("manifest.json", "history.json", "model_meta.json")
            ],
            "export": [
                (self.exported / n, None)
                for n in ("manifest.json", "parity.json", "signature.json")
            ],
            "qat": [(self.int8 / "manifest.json", None), (self.int8 / "gate.json", None)],
            "package": [
                (self.bundle / n, None)
                for n in ("manifest.json", "model_config.json", "tune.json")
                if (self.bundle / n).exists()  # tune.json: only when the search ran
            ],
            "evaluate": [(self.evaluation, None)],
            "serving_image": [(self.infra / n, None) for n in ("manifest.json", "infra.json")],
        }


@dataclass(frozen=True)
class TrackResult:
    run_id: str
    experiment_id: str
    tracking_uri: str
    model_id: str = ""
    model_uri: str = ""
    bundle_sha256: str = ""


_PARAM_KEY = re.compile(r"[\w\-. :/]+")  # what MLflow accepts in a parameter or metric name


def flatten(d: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of a nested mapping. A mapping with a key MLflow cannot name
    (``ingest.split.files``: globs such as ``holdout/*``) is one value, its JSON."""
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if all(_PARAM_KEY.fullmatch(str(k)) for k in value):
                yield from flatten(value, f"{name}.")
            else:
                yield name, json.dumps(value, sort_keys=True, default=str)
        else:
            yield name, value


def _numeric(d: Mapping[str, Any], prefix: str) -> dict[str, float]:
    return {
        f"{prefix}{k}".replace(" ", "_"): float(v)
        for k, v in flatten(d)
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _machine_tags(manifest: Mapping[str, Any]) -> dict[str, str]:
    """Where a step ran: CPU model, ISA flags, cores, Paddle/OpenVINO versions."""
    versions = manifest.get("versions") or {}
    return {
        **machine_tags(manifest.get("machine") or {}),
        **{f"versions.{k}": str(v) for k, v in versions.items()},
    }


def lineage_tags(
    all_params: Mapping[str, Any],
    outputs: StepOutputs,
    manifests: Mapping[str, Any],
    metrics: Mapping[str, Mapping[str, Any]],
) -> dict[str, str]:
    """The parent run's tags: what the model was made from and where (registry lineage);
    ``metrics`` is :func:`step_metrics`."""

    infra = read_json(outputs.infra / "infra.json")
    return {
        "git_sha": "" if (sha := git_sha()) == "unknown" else sha,  # unknown is no lineage
        "data_sha256": combined_sha256(manifests["ingest"].get("input_sha256", {})),
        # the ingested snapshot the model was made from: its manifest's sha256 (the shards,
        # their splits and sha256s); register records the version's training keys from it
        "snapshot_sha256": snapshot.load(outputs.data).sha256,
        "params_sha256": params_sha256(dict(all_params)),
        "task": str(all_params.get("task", {}).get("name", "unknown")),
        "amp_effective": str(metrics["train"].get("amp_effective")),
        "ge_success": str(bool(metrics["validate"]["success"])).lower(),
        "qat_gate_passed": str(bool(metrics["qat"]["gate_passed"])).lower(),
        **serving_image_tags(infra, manifests["serving_image"]),
        "infra_validated": str(bool(infra.get("infra_validated"))).lower(),
        # the served files, byte for byte (the registered version's tag; the blessing checks it)
        BUNDLE_TAG: bundle_sha256(outputs.bundle),
        # ... and what they compute (register's idempotency key across pipeline runs)
        SERVED_TAG: served_sha256(outputs.bundle),
        # the hardware and runtimes the model was trained on (each step's own: nested runs)
        **_machine_tags(manifests["train"]),
        # the container image (reference@id) the steps ran in, when an orchestrator says so
        **({"component_image": image} if (image := os.environ.get("PADDLE_MLOPS_IMAGE")) else {}),
    }


def serving_image_tags(infra: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, str]:
    """What the serving_image step left, as tags that never contradict each other: an image
    is named (``serving_image``, ``serving_image_id``) only when one was built here
    (``serving_image_built`` ``true``); otherwise ``serving_image_not_built`` says why and
    which reference a build of the context would be pushed as (promote names the image once
    it has a digest). ``serving_image_context_sha256``, what any build of it is made from, is
    always there (lineage)."""
    built = bool(infra.get("built")) and bool(infra.get("image"))
    context = str(infra.get("context_sha256") or manifest.get("context_sha256") or "")
    tags = {"serving_image_context_sha256": context, "serving_image_built": str(built).lower()}
    if built:
        tags["serving_image"] = str(infra["image"])
        if infra.get("image_id"):  # the local build's id; the registry digest is promote's
            tags["serving_image_id"] = str(infra["image_id"])
    else:
        why = str(infra.get("builder_note") or "no image builder on this machine")
        tags["serving_image_not_built"] = (
            f"{why}; the build context is ready"
            + (f" (to be pushed as {infra['image']})" if infra.get("image") else "")
        )[:5000]
    return tags


# the headline values of the parent run's charts, besides the test metrics and the curves
# (each step's nested run has all of its own)
HEADLINE_METRICS = (
    "train.best_val_accuracy",
    "train.samples_per_second",
    "qat.accuracy",
    "qat.accuracy_drop",
    "qat.size_ratio",
    "qat.latency_ratio_b1",
    "qat.latency_ratio_b64",
)


def step_metrics(outputs: StepOutputs) -> dict[str, dict[str, Any]]:
    """Metrics per step, as the nested runs and (prefixed) the parent run log them."""
    ge_summary = read_json(outputs.report / "summary.json")
    qat = read_json(outputs.qat_metrics)
    tune_file = outputs.bundle / "tune.json"
    tune = read_json(tune_file) if tune_file.exists() else {}
    return {
        # the serving-config search's summary (the whole table is the run's tune.json)
        "package": {
            f"tune_{k}": tune[k]
            for k in ("elapsed_s", "chosen_score", "written_score", "chosen_vs_written")
            if tune.get(k) is not None
        }
        | ({"tune_trials": len(tune["trials"])} if tune else {}),
        "train": read_json(outputs.train_metrics),
        "evaluate": read_json(outputs.evaluate_metrics),
        "qat": {**qat, "gate_passed": float(bool(qat.get("gate_passed")))},
        "validate": {
            "success": float(bool(ge_summary.get("success"))),
            "expectations_evaluated": ge_summary.get("evaluated", 0),
            "expectations_failed": ge_summary.get("failed", 0),
        },
    }


def epoch_metrics(history: list[dict[str, Any]], timestamp_ms: int) -> list[Any]:
    """The per-epoch history (train's ``history.json``) as MLflow metrics
    ``training/<key>`` with ``step`` = epoch: one curve per key."""
    from mlflow.entities import Metric

    return [
        Metric(f"{CURVE_PREFIX}{k}", float(v), timestamp_ms, int(row["epoch"]))
        for row in history
        for k, v in row.items()
        if k != "epoch" and isinstance(v, int | float) and not isinstance(v, bool)
    ]


def step_times(manifest: Mapping[str, Any]) -> tuple[int, int] | None:
    """(start, end) of a step in epoch milliseconds, as its manifest recorded them; None
    when it recorded no start (made outside :class:`components.kernel.step.Step`)."""
    if not manifest.get("started_at") or not manifest.get("finished_at"):
        return None
    return _ms(manifest["started_at"]), _ms(manifest["finished_at"])


def _ms(iso: str) -> int:
    return int(round(datetime.fromisoformat(iso).timestamp() * 1000))


def _ended_ms(manifest: Mapping[str, Any]) -> int | None:
    stamp = manifest.get("finished_at") or manifest.get("created_at")
    return _ms(stamp) if stamp else None


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
def _closed_on_failure(client: Any, run_id: str) -> Iterator[None]:
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


def _log_step_run(
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
    ended = span[1] if span else _ended_ms(manifest)
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
    with _closed_on_failure(client, run_id):
        if isinstance(section_params, Mapping) and section_params:
            client.log_batch(
                run_id,
                params=[Param(k, str(v)[:6000]) for k, v in flatten(section_params)],
            )
        values = _numeric(step_values, "")
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


def run(
    params: TrackParams,
    all_params: Mapping[str, Any],
    out_dir: str | Path,
    outputs: StepOutputs,
    pipeline_run: str = "",
    retrain_reason: str = "",
) -> TrackResult:
    """Log the pipeline's run to MLflow at ``$MLFLOW_TRACKING_URI`` (else the default). The
    process's MLflow tracking URI is set for the run and put back after it, so a caller in the
    same process (a notebook, a test) keeps its own."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    with global_tracking_uri(tracking_uri()):
        return _run(params, all_params, out_dir, outputs, pipeline_run, retrain_reason)


def _run(
    params: TrackParams,
    all_params: Mapping[str, Any],
    out_dir: str | Path,
    outputs: StepOutputs,
    pipeline_run: str,
    retrain_reason: str,
) -> TrackResult:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
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
    task_section = all_params.get("task") or {}
    try:
        experiment_id = use_experiment(params.experiment).experiment_id
    except Exception as exc:  # MLflow raises its own exception types for bad URIs/backends
        raise StepError(
            f"MLflow tracking at {shown_uri}: cannot open experiment '{params.experiment}' "
            f"({str(exc).replace(uri, shown_uri)})"
        ) from exc
    run_name = f"{params.run_name_prefix}-{tags['task']}-{(tags['git_sha'] or 'nogit')[:8]}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    close_dead_runs(client, experiment_id, params.stale_run_s, f"track (pid {os.getpid()})")
    tags = {**tags, **owner_tags(), **({PIPELINE_RUN_TAG: pipeline_run} if pipeline_run else {})}
    # why this run retrains, when a monitor's alarm started it (KFP: the pipeline argument;
    # dvc repro: the environment the monitor set)
    if why := (retrain_reason or os.environ.get(RETRAIN_REASON_ENV, "")):
        tags["retrain_reason"] = why[:4000]
    set_experiment_kind(client, experiment_id)
    # the pipeline run spans its steps' runs: from the earliest start (a step that recorded
    # none: its end, as its run shows) among the steps this execution ran; outputs dvc repro
    # kept from an earlier execution (they ended before the previous pipeline run did) are
    # not part of it, so the newest execution is the newest run in the UI
    starts = [(span[0] if (span := step_times(m)) else _ended_ms(m)) for m in manifests.values()]
    previous = client.search_runs(
        [experiment_id],
        "tags.mlflow.parentRunId IS NULL",
        order_by=["attributes.end_time DESC"],
        max_results=1,
    )
    after = (previous[0].info.end_time or 0) if previous else 0
    started = [t for t in starts if t is not None and t > after]
    created = client.create_run(
        experiment_id, start_time=min(started) if started else None, tags=tags, run_name=run_name
    )
    with (
        mlflow.start_run(run_id=created.info.run_id) as parent,
        _closed_on_failure(client, parent.info.run_id),
    ):
        flat = {k: str(v) for k, v in flatten(all_params)}
        mlflow.log_params({k: v[:6000] for k, v in flat.items()})
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
        mlflow.log_metrics(_numeric(metrics["evaluate"], "test."), model_id=logged.model_id)
        summary = {
            **_numeric(metrics["train"], "train."),
            **_numeric(metrics["qat"], "qat."),
        }
        mlflow.log_metrics({k: summary[k] for k in HEADLINE_METRICS if k in summary})
        curves_at = _ended_ms(manifests["train"]) or int(time.time() * 1000)
        client.log_batch(parent.info.run_id, metrics=epoch_metrics(history, curves_at))
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
            _log_step_run(
                client,
                experiment_id,
                parent.info.run_id,
                step,
                {**tags, **_machine_tags(manifests.get(step, {}))},
                manifests.get(step, {}),
                all_params.get(step, {}),
                metrics.get(step, {}),
                history if step == "train" else [],
                files,
            )
        result = TrackResult(
            parent.info.run_id,
            parent.info.experiment_id,
            uri,
            logged.model_id,
            logged.model_uri,
            logged.bundle_sha256,
        )
    write_json(
        out_dir / "run.json",
        {
            "run_id": result.run_id,
            "experiment_id": result.experiment_id,
            "experiment": params.experiment,
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
        params.experiment,
        shown_uri,
        result.model_uri,
    )
    return result


def run_step(
    params: TrackParams,
    all_params: Mapping[str, Any],
    run_info: Path,
    pipeline_run: str = "",
    retrain_reason: str = "",
    **paths: Path,
) -> TrackResult:
    """:func:`run` with each upstream output as its own port (the STEP binding)."""
    return run(params, all_params, run_info, StepOutputs(**paths), pipeline_run, retrain_reason)


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
