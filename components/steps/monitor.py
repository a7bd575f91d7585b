"""monitor: drift and live accuracy of the served model, from its prediction log.

Reads the newest ``monitor.window`` answered items of the server's prediction log (``--log``,
the directory ``--prediction-log-dir`` writes; ``components.ml.data.prediction_log``), joins the
labels fed back so far (``--labels``: JSON Lines ``{"id": ..., "label": ...}``, or
``"labels": [...]`` for a batch request; the whole file is validated: a label out of the
bundle's classes, a label count other than the request's item count, or one id labelled twice
differently is an error line naming file:line and the rule; ids the log does not hold are
counted and named in a warning), and compares them with the reference: the bundle's
model on the held-out splits of its training snapshot (``monitor.reference_splits``, at most
``monitor.reference_samples``). The checks and their calibration are those of
``components.ml.decisions.monitoring``.

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
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import model_validator

from components.core.artifacts import StepError, read_json, write_json
from components.core.config import params_model
from components.kernel.cli import step_main
from components.kernel.step import In, Out, Step, Value
from components.ml.data.prediction_log import read_labels
from components.ml.decisions.monitor_report import monitor_doc, retrain, write_outputs
from components.ml.decisions.monitor_window import Window, read_window
from components.ml.decisions.monitoring import (
    INSUFFICIENT,
    MonitorLimits,
    Sample,
    Verdict,
    compare,
    softmax_top1,
)
from components.ml.serving.runtime import ModelFiles, PaddlePredictor
from components.tasks.base import Task
from components.tracking.monitor_registry import record, registry_reference
from components.tracking.registry import RegistryParams, registered_name

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


def _judged_model(
    task: Task, model_dir: Path, model_name: str, registry_params: RegistryParams
) -> tuple[str, list[str]]:
    """The registered name of the bundle's model and its class names; only a classifier
    can be judged."""
    if not task.outputs_logits:
        raise StepError(
            f"monitor: task {task.name}'s model answers no class logits (a {task.model_kind}); "
            "the monitor judges classifiers (prediction drift and accuracy need classes)"
        )
    signature = read_json(model_dir / "signature.json")
    name = model_name or registered_name(
        registry_params, signature.get("task", task.name), task.model_kind
    )
    return name, signature.get("label_names") or []


def _labelled(
    labels_file: str, log_dir: Path, window: Window, label_names: list[str]
) -> tuple[np.ndarray | None, int, dict[str, Any] | None]:
    """The window items' correctness by the fed-back labels (None: no labels), how many are
    labelled, and what monitor.json says of the label file."""
    if labels_file and not Path(labels_file).is_file():
        log.warning("monitor: %s does not exist: no labels fed back yet", labels_file)
        labels_file = ""
    if not labels_file:
        return None, 0, None
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
    return np.asarray([t == y for t, y in hits], dtype=bool), len(hits), feedback


def _conclude(
    doc: dict[str, Any], verdict: Verdict, window: Window, on_alarm: str, log_dir: Path
) -> None:
    """Log the verdict's one readable line; an alarm's line is its retraining's reason
    (``alarm_line``; ``retrain`` with ``on_alarm: dvc``)."""
    name, labelled = doc["model"], doc["window"]["labelled"]
    if verdict.alarm:
        line = f"monitor: ALARM {name} version {window.version}: " + "; ".join(verdict.reasons)
        log.warning(line)
        doc["alarm_line"] = line  # the retraining's reason (dvc here, a KFP run: schedule trigger)
        if on_alarm == "dvc":
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
    name, label_names = _judged_model(task, model_dir, model_name, registry_params)
    ref, input_names = reference_sample(
        task, model_dir, data_dir, params.reference_splits, params.reference_samples
    )
    window = read_window(log_dir, task, params.window, input_names, model_version or None)
    checked_at = clock()
    correct, labelled, feedback = _labelled(labels_file, log_dir, window, label_names)
    sample = Sample(window.top1, window.confidence, window.features, correct)
    verdict = compare(ref, sample, params.limits(), len(label_names) or 2)
    doc = monitor_doc(name, verdict, checked_at, window, labelled, log_dir, feedback, ref, params)
    _conclude(doc, verdict, window, params.on_alarm, log_dir)
    doc["registry"] = record(doc, uri, name, registry_params)
    write_outputs(out_dir, doc, verdict, window, checked_at)
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
