"""monitor: drift and live accuracy of the served model, from its prediction log.

Reads the newest ``monitor.window`` answered items of the server's prediction log (``--log``,
the directory ``--prediction-log-dir`` writes; ``components.ml.prediction_log``), joins the
labels fed back so far (``--labels``: JSON Lines ``{"id": ..., "label": ...}``, or
``"labels": [...]`` for a batch request; the whole file is validated: a label out of the
bundle's classes, a label count other than the request's item count, or one id labelled twice
differently is an error line naming file:line and the rule; ids the log does not hold are
counted and named in a warning), and compares them with the reference: the bundle's
model on the held-out splits of its training snapshot (``monitor.reference_splits``, at most
``monitor.reference_samples``). The checks and their calibration are those of
``components.ml.monitoring``.

Writes ``monitor.json`` (every statistic, p-value, threshold and decision), ``report.html``,
``monitor.prom`` (Prometheus gauges, node-exporter textfile format), logs one readable line,
and, with ``--tracking-uri`` (or ``MLFLOW_TRACKING_URI``), records the verdict on the judged
registered version (tags ``monitor_status``, ``monitor_alarm``, ``monitor_reasons``,
``monitor_checked_at``: the time of the check) and on its run (metrics ``monitor_alarm``,
``monitor_p_<check>``, ``monitor_live_accuracy``, one point per monitor run). On an alarm,
``monitor.on_alarm`` starts retraining (``dvc``: ``dvc repro`` in the repository, the reason in
``PADDLE_MLOPS_RETRAIN_REASON``, which ``track`` records on the run and the new version).

A window in which no check has ``monitor.min_samples`` samples (an empty log, a fresh
deploy) has no verdict: "not enough data: N items, M needed", status ``insufficient`` in
monitor.json, report.html and the registry (``monitor_alarm: unknown``), never "no alarm".

Exit codes:
  0  the checks ran: no alarm, or an alarm (a finding, not a failure: monitor.json says which)
  1  an error (one line per fault: bad params, a missing log directory, a bad label file)
  2  bad command-line usage
  3  not enough data: no check could run (monitor.json and report.html say so)
  130/143  interrupted (Ctrl-C) / terminated (SIGTERM)

Not a stage of the training DAG: its input is live traffic, and its alarm starts that DAG.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import model_validator

from components.core.artifacts import StepError, atomic_path, read_json, write_json
from components.core.config import params_model
from components.kernel.cli import step_main
from components.kernel.step import In, Out, Step, Value
from components.ml.monitoring import (
    INSUFFICIENT,
    RETRAIN_REASON_ENV,
    MonitorLimits,
    Sample,
    Verdict,
    compare,
    softmax_top1,
)
from components.ml.prediction_log import SEGMENT_GLOB, LogReader, Prediction, read_labels
from components.ml.runtime import ModelFiles, PaddlePredictor
from components.tasks.base import Task
from components.tracking.registry import (
    CHAMPION,
    Registry,
    RegistryParams,
    client,
    download_version,
    fetch_holdout,
    registered_name,
)

log = logging.getLogger(__name__)

# the exit code of a window too small for any check (0: checked; 1: error; 2: usage)
EXIT_NOT_ENOUGH_DATA = 3


@params_model
class MonitorParams(MonitorLimits):
    """``monitor``: the limits (alpha: Bonferroni over the checks; min_samples: for each
    check) and the window and reference they judge."""

    window: int  # the newest answered items judged
    reference_samples: int  # at most, from reference_splits
    reference_splits: list[str]
    on_alarm: Literal["none", "dvc"]

    @model_validator(mode="after")
    def _enough_samples(self) -> MonitorParams:
        if self.window < self.min_samples:
            raise ValueError(f"window: must be >= min_samples, got {self.window}")
        if self.reference_samples < self.min_samples:
            raise ValueError("reference_samples: must be >= min_samples")
        return self

    def limits(self) -> MonitorLimits:
        return MonitorLimits(self.alpha, self.min_samples, self.max_accuracy_drop)


@dataclass
class Window:
    """The newest answered items of one model version in the log."""

    version: str | None
    ids: list[tuple[str, int]]  # (request id, item index) per item
    top1: np.ndarray
    confidence: np.ndarray
    features: dict[str, np.ndarray]
    records: int
    first_time: str | None
    last_time: str | None


def _served(record: Prediction) -> bool:
    return record.answered and record.ok and record.top1 is not None


def read_window(
    log_dir: Path, task: Task, size: int, input_names: list[str], version: str | None = None
) -> Window:
    """The newest ``size`` items answered by ``version`` (default: the newest record's),
    segment by segment from the newest, each in one streaming pass: memory holds the window
    (per version seen in a segment), never a segment."""
    if not log_dir.is_dir():
        raise StepError(f"{log_dir}: no prediction log directory (--log)")
    segments = sorted(log_dir.glob(SEGMENT_GLOB))
    chosen: list[Prediction] = []
    items = 0
    torn = 0
    for segment in reversed(segments):
        # one streaming pass: per version, only the newest records that can still be chosen
        need = size - items
        reader = LogReader(log_dir)
        tails: dict[str, deque[Prediction]] = {}
        held: dict[str, int] = {}
        newest = None
        for r in reader.segment_records(segment):
            if not _served(r):
                continue
            newest = r.version
            if version is not None and r.version != version:
                continue
            tail = tails.setdefault(r.version, deque())
            tail.append(r)
            held[r.version] = held.get(r.version, 0) + r.batch
            while held[r.version] - tail[0].batch >= need:
                held[r.version] -= tail.popleft().batch
        torn += reader.torn
        version = newest if version is None else version
        for r in reversed(tails.get(version or "", ())):
            chosen.append(r)
            items += r.batch
            if items >= size:
                break
        if items >= size:
            break
    chosen.reverse()
    ids: deque[tuple[str, int]] = deque(maxlen=size)
    top1: deque[int] = deque(maxlen=size)
    conf: deque[float] = deque(maxlen=size)
    feats: dict[str, list[np.ndarray]] = {}
    for r in chosen:
        for i, (t, c) in enumerate(zip(r.top1 or [], r.confidence or [], strict=True)):
            ids.append((r.id, i))
            top1.append(int(t))
            conf.append(float(c))
        if r.inputs is not None:
            # the model's inputs, or what the client sent instead (a text model's raw text)
            names = input_names if all(n in r.inputs for n in input_names) else list(r.inputs)
            arrays = [np.asarray(r.inputs[n]) for n in names]
            for name, values in task.monitor_features(arrays).items():
                feats.setdefault(name, []).append(np.asarray(values, dtype=np.float64))
    if torn:
        log.warning("%s: %d torn or invalid line(s) skipped", log_dir, torn)
    return Window(
        version=version,
        ids=list(ids),
        top1=np.asarray(top1, dtype=np.int64),
        confidence=np.asarray(conf, dtype=np.float64),
        features={k: np.concatenate(v) for k, v in feats.items()},
        records=len(chosen),
        first_time=chosen[0].time if chosen else None,
        last_time=chosen[-1].time if chosen else None,
    )


def reference_sample(
    task: Task, model_dir: Path, data_dir: Path, splits: list[str], limit: int
) -> tuple[Sample, list[str]]:
    """The bundle's model on the held-out splits (at most ``limit`` samples), as the window
    side is summarised: top-1, confidence, correctness and input features."""
    predictor = PaddlePredictor(ModelFiles.in_dir(model_dir), threads=1)
    task.load_assets(model_dir)
    top1, conf, correct = [], [], []
    feats: dict[str, list[np.ndarray]] = {}
    have = 0
    for split in splits:
        for inputs, labels in task.eval_batches(data_dir, split, 256):
            take = min(len(labels), limit - have)
            inputs = [x[:take] for x in inputs]
            logits = predictor.predict(inputs)
            logits = logits[0] if isinstance(logits, list) else logits
            t, c = softmax_top1(logits)
            top1.append(t)
            conf.append(c)
            correct.append(t == labels[:take])
            for name, values in task.monitor_features(inputs).items():
                feats.setdefault(name, []).append(np.asarray(values, dtype=np.float64))
            have += take
            if have >= limit:
                break
        if have >= limit:
            break
    if have == 0:
        raise StepError(f"{data_dir}: the reference splits {splits} hold no samples")
    names = [s.name for s in task.input_specs()]
    return (
        Sample(
            np.concatenate(top1),
            np.concatenate(conf),
            {k: np.concatenate(v) for k, v in feats.items()},
            np.concatenate(correct),
        ),
        names,
    )


def prometheus(
    verdict: Verdict, model: str, version: str | None, window: Window, checked_at: float
) -> str:
    """The verdict as node-exporter textfile gauges. Not enough data: ``enough_data`` 0 and no
    ``alarm`` sample at all (a 0 there would read as healthy)."""
    labels = f'model="{model}",version="{version or ""}"'
    enough = verdict.status != INSUFFICIENT
    lines = [
        "# HELP paddle_mlops_monitor_enough_data 0 when no check had enough data (no verdict)",
        "# TYPE paddle_mlops_monitor_enough_data gauge",
        f"paddle_mlops_monitor_enough_data{{{labels}}} {int(enough)}",
        "# HELP paddle_mlops_monitor_alarm 1 when the last monitor run alarmed",
        "# TYPE paddle_mlops_monitor_alarm gauge",
    ]
    if enough:
        lines.append(f"paddle_mlops_monitor_alarm{{{labels}}} {int(verdict.alarm)}")
    lines += [
        "# HELP paddle_mlops_monitor_p_value p-value of each check (absent: skipped)",
        "# TYPE paddle_mlops_monitor_p_value gauge",
    ]
    for c in verdict.checks:
        if c.p_value is not None:
            lines.append(
                f'paddle_mlops_monitor_p_value{{{labels},check="{c.name}"}} {c.p_value:.6g}'
            )
    lines += [
        "# HELP paddle_mlops_monitor_window_items answered items in the judged window",
        "# TYPE paddle_mlops_monitor_window_items gauge",
        f"paddle_mlops_monitor_window_items{{{labels}}} {len(window.top1)}",
        "# HELP paddle_mlops_monitor_live_accuracy accuracy on the labelled window items",
        "# TYPE paddle_mlops_monitor_live_accuracy gauge",
    ]
    acc = next((c for c in verdict.checks if c.name == "accuracy" and c.skipped is None), None)
    if acc is not None:
        lines.append(
            f"paddle_mlops_monitor_live_accuracy{{{labels}}} {acc.detail['window_accuracy']:.6g}"
        )
    lines.append(f"paddle_mlops_monitor_timestamp_seconds{{{labels}}} {checked_at:.0f}")
    return "\n".join(lines) + "\n"


def report_html(doc: dict[str, Any]) -> str:
    rows = []
    for c in doc["verdict"]["checks"]:
        p = "-" if c["p_value"] is None else f"{c['p_value']:.3g}"
        thr = "-" if c["threshold"] is None else f"{c['threshold']:.3g}"
        state = "ALARM" if c["alarm"] else ("skipped: " + c["skipped"] if c["skipped"] else "ok")
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(v))}</td>"
                for v in (c["name"], c["test"], p, thr, c["n_reference"], c["n_window"], state)
            )
            + "</tr>"
        )
    verdict = doc["verdict"]
    if verdict["status"] == INSUFFICIENT:
        head = f"NO VERDICT, {verdict['not_enough']}"
    else:
        head = "ALARM: " + "; ".join(verdict["reasons"]) if verdict["alarm"] else "no alarm"
    w, ref = doc["window"], doc["reference"]
    summary = (
        f"window: {w['items']} items of {w['records']} requests, {w['first_time']} to "
        f"{w['last_time']}; reference: {ref['samples']} samples of {', '.join(ref['splits'])}; "
        f"alpha {doc['params']['alpha']} over {doc['checks_run']} checks; checked at "
        f"{doc['checked_at']}"
    )
    return (
        "<!doctype html><meta charset='utf-8'><title>monitor</title>"
        f"<h1>{html.escape(doc['model'])} version {html.escape(str(w['version']))}</h1>"
        f"<p><b>{html.escape(head)}</b></p><p>{html.escape(summary)}</p>"
        "<table border=1 cellpadding=4><tr><th>check</th><th>test</th><th>p</th>"
        "<th>threshold</th><th>n reference</th><th>n window</th><th>state</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def registry_reference(
    tracking_uri: str, name: str, params: RegistryParams, version: str, dest: Path
) -> tuple[Path, Path, str]:
    """The reference as a cluster has it, from the registry alone: the version's bundle (its
    ``bundle_sha256`` checked) and the test split it was blessed on (the ``holdout/`` of its
    run, checked against its ``test_split_sha256`` tag). ``version`` empty: the champion.
    Returns (bundle, snapshot directory whose samples read as split ``test``, version)."""
    if not tracking_uri:
        raise StepError(
            "monitor --reference registry: no tracking URI (--tracking-uri or MLFLOW_TRACKING_URI)"
        )
    registry = Registry(client(tracking_uri), name, params)
    if not version:
        champion = registry.aliases().get(CHAMPION)
        if champion is None:
            raise StepError(f"monitor --reference registry: {name} has no '{CHAMPION}' alias")
        version = str(champion)
    mv = registry.version(int(version))
    tags = registry.test_split(mv)
    if not tags["holdout_sha256"]:
        raise StepError(
            f"monitor --reference registry: {name} v{version} has no test_split_sha256 tag (no "
            "test split stored with it); use --reference snapshot with its --data"
        )
    bundle = download_version(registry.client, tracking_uri, name, int(version), dest / "model")
    data = fetch_holdout(registry.client, tracking_uri, tags, dest / "data", "test")
    log.info("monitor: reference %s v%s, test split %s", name, version, tags["holdout_uri"])
    return bundle, data, version


def record(doc: dict[str, Any], tracking_uri: str, name: str, params: RegistryParams) -> dict:
    """The verdict on the judged registered version: tags on the version (the latest verdict)
    and metrics on its run (one point per monitor run, so the history plots in MLflow)."""
    version = doc["window"]["version"]
    if not tracking_uri or version is None:
        return {}
    registry = Registry(client(tracking_uri), name, params)
    try:
        mv = registry.version(int(version))
    except (StepError, ValueError) as exc:
        log.warning("monitor: %s v%s not in the registry (%s): verdict not recorded", name,
                    version, exc)  # fmt: skip
        return {}
    verdict = doc["verdict"]
    insufficient = verdict["status"] == INSUFFICIENT
    tags = {
        "monitor_status": verdict["status"],
        "monitor_alarm": "unknown" if insufficient else str(verdict["alarm"]).lower(),
        "monitor_checked_at": doc["checked_at"],
        "monitor_reasons": (
            verdict["not_enough"] if insufficient else "; ".join(verdict["reasons"]) or "-"
        )[:4000],
    }
    for key, value in tags.items():
        registry.client.set_model_version_tag(name, str(version), key, value)
    now = int(doc["checked_at_s"] * 1000)
    metrics = {"monitor_items": doc["window"]["items"]}
    if not insufficient:  # no point where no verdict was reached: a 0 would read as healthy
        metrics["monitor_alarm"] = float(verdict["alarm"])
    for c in verdict["checks"]:
        if c["p_value"] is not None:
            key = "monitor_p_" + c["name"].replace(":", "_")
            metrics[key] = float(c["p_value"])
        if c["kind"] == "accuracy" and c["detail"].get("window_accuracy") is not None:
            metrics["monitor_live_accuracy"] = float(c["detail"]["window_accuracy"])
    for key, value in metrics.items():
        registry.client.log_metric(mv.run_id, key, float(value), timestamp=now)
    return {"registry": name, "version": int(version), "run_id": mv.run_id, "tags": tags}


def retrain(reason: str, repo: Path) -> int:
    """``dvc repro`` of the training pipeline, the reason handed to ``track``."""
    log.warning("monitor: retraining: dvc repro in %s (the alarm above is its reason)", repo)
    env = {**os.environ, RETRAIN_REASON_ENV: reason}
    # this interpreter's dvc: the one installed with the project, whatever PATH holds
    return subprocess.run(
        [sys.executable, "-m", "dvc", "repro"], cwd=repo, env=env, check=False
    ).returncode


def run(
    params: MonitorParams,
    task: Task,
    model_dir: str | Path,
    data_dir: str | Path,
    log_dir: str | Path,
    out_dir: str | Path,
    labels_file: str = "",
    model_version: str = "",
    model_name: str = "",
    tracking_uri: str = "",
    registry_params: RegistryParams | None = None,
    reference: str = "snapshot",
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Judge the window; the document written as monitor.json (``status``: alarm, ok or
    insufficient). ``clock``: the time of the check (``monitor_checked_at``)."""
    model_dir, data_dir, log_dir, out_dir = map(Path, (model_dir, data_dir, log_dir, out_dir))
    if reference not in ("snapshot", "registry"):
        raise StepError(f"monitor --reference: snapshot or registry, got {reference!r}")
    registry_params = registry_params or RegistryParams()
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if reference == "registry":
        name = model_name or registered_name(registry_params, task.name, task.model_kind)
        with tempfile.TemporaryDirectory(prefix="monitor-reference-") as tmp:
            model_dir, data_dir, model_version = registry_reference(
                uri, name, registry_params, model_version, Path(tmp)
            )
            params = dataclasses.replace(params, reference_splits=["test"])
            return run(
                params, task, model_dir, data_dir, log_dir, out_dir, labels_file,
                model_version, name, uri, registry_params, clock=clock,
            )  # fmt: skip
    if not task.outputs_logits:
        raise StepError(
            f"monitor: task {task.name}'s model answers no class logits (a {task.model_kind}); "
            "the monitor judges classifiers (prediction drift and accuracy need classes)"
        )
    signature = read_json(model_dir / "signature.json")
    name = model_name or registered_name(
        registry_params, signature.get("task", task.name), task.model_kind
    )
    label_names = signature.get("label_names") or []
    num_classes = len(label_names) or 2
    reference, input_names = reference_sample(
        task, model_dir, data_dir, params.reference_splits, params.reference_samples
    )
    window = read_window(log_dir, task, params.window, input_names, model_version or None)
    checked_at = clock()
    correct = None
    labelled = 0
    feedback: dict[str, Any] | None = None
    if labels_file and not Path(labels_file).is_file():
        log.warning("monitor: %s does not exist: no labels fed back yet", labels_file)
        labels_file = ""
    if labels_file:
        labels = read_labels(
            Path(labels_file),
            log_dir,
            {rid for rid, _ in window.ids},
            len(label_names) or None,  # the range is checked when the bundle names classes
        )
        feedback = {"file": labels_file, **labels.summary()}
        hits = [
            (t, labels[rid][i])
            for (rid, i), t in zip(window.ids, window.top1, strict=True)
            if rid in labels and i < len(labels[rid])
        ]
        labelled = len(hits)
        correct = np.asarray([t == y for t, y in hits], dtype=bool)
    sample = Sample(window.top1, window.confidence, window.features, correct)
    verdict = compare(reference, sample, params.limits(), num_classes)
    doc = {
        "model": name,
        "status": verdict.status,
        "alarm": verdict.alarm,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(checked_at)),
        "checked_at_s": checked_at,
        "verdict": verdict.to_json(),
        "checks_run": sum(1 for c in verdict.checks if c.skipped is None),
        "window": {
            "version": window.version,
            "items": len(window.top1),
            "records": window.records,
            "labelled": labelled,
            "sampled_inputs": len(next(iter(window.features.values()), [])),
            "first_time": window.first_time,
            "last_time": window.last_time,
            "log": str(log_dir),
        },
        "labels": feedback,
        "reference": {
            "splits": params.reference_splits,
            "samples": len(reference.top1),
            "accuracy": float(reference.correct.mean()) if reference.correct is not None else None,
        },
        "params": {
            "alpha": params.alpha,
            "min_samples": params.min_samples,
            "max_accuracy_drop": params.max_accuracy_drop,
            "window": params.window,
        },
        "retrain": None,
        "registry": {},
    }
    if verdict.alarm:
        line = f"monitor: ALARM {name} version {window.version}: " + "; ".join(verdict.reasons)
        log.warning(line)
        doc["alarm_line"] = line  # the retraining's reason (dvc here, a KFP run: schedule trigger)
        if params.on_alarm == "dvc":
            doc["retrain"] = {"how": "dvc repro", "reason": line}
    elif verdict.status == INSUFFICIENT:
        where = (
            f"{name} version {window.version} ({labelled} labelled)"
            if window.version is not None
            else f"no answered request in {log_dir}"
        )
        log.warning(
            "monitor: %s (monitor.min_samples): %s; no verdict (exit code %d)",
            verdict.not_enough, where, EXIT_NOT_ENOUGH_DATA,
        )  # fmt: skip
    else:
        skipped = ", ".join(c.name for c in verdict.skipped)
        log.info(
            "monitor: no alarm for %s version %s (%d items, %d labelled, %d checks%s%s)",
            name, window.version, len(window.top1), labelled, doc["checks_run"],
            f"; not run, too few samples: {skipped}" if skipped else "",
            "" if window.features else "; no logged inputs: no input check",
        )  # fmt: skip
    doc["registry"] = record(doc, uri, name, registry_params)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        write_json(tmp / "monitor.json", doc)
        (tmp / "report.html").write_text(report_html(doc), encoding="utf-8")
        (tmp / "monitor.prom").write_text(
            prometheus(verdict, name, window.version, window, checked_at)
        )
    if doc["retrain"] is not None:
        code = retrain(doc["retrain"]["reason"], Path.cwd())
        doc["retrain"]["exit_code"] = code
        write_json(out_dir / "monitor.json", doc)
    return doc


STEP = Step(
    name="monitor",
    doc=__doc__,
    params=MonitorParams,
    sections=("task", "monitor", "registry"),
    shared=(("registry", "registry_params", RegistryParams),),
    run=run,
    inputs=(
        In("bundle", "outputs/package", "model_dir", help="the served (champion's) bundle"),
        In("data", "outputs/ingest", "data_dir", help="its training snapshot"),
        In("log", ".deploy/predictions", "log_dir", help="the server's prediction log dir"),
    ),
    outputs=(Out("report", "outputs/monitor", "out_dir", kfp="HTML", help="monitor.json, HTML"),),
    values=(
        Value("labels", "labels_file", "", help="fed-back labels, JSON Lines {id, label}"),
        Value("model_version", "model_version", "", help="version judged (default: newest)"),
        Value("model_name", "model_name", "", help="registered name (default: registry's)"),
        Value("tracking_uri", "tracking_uri", "", help="MLflow (default: $MLFLOW_TRACKING_URI)"),
        Value(
            "reference",
            "reference",
            "snapshot",
            help="snapshot: --bundle on --data's held-out splits; registry: the champion's (or "
            "--model-version's) bundle and blessed test split from MLflow (a cluster's way)",
        ),
    ),
)


def main(argv: Sequence[str] | None = None) -> int:
    """The step's CLI; exit code 3 when no check had enough data (see the module doc)."""
    return step_main(
        STEP,
        argv,
        exit_code=lambda doc: EXIT_NOT_ENOUGH_DATA if doc["status"] == INSUFFICIENT else 0,
    )


if __name__ == "__main__":
    sys.exit(main())
