"""What a ``monitor`` run writes and does (library layer): ``monitor.json``'s document,
``report.html``, ``monitor.prom`` (Prometheus gauges, node-exporter textfile format), and on
an alarm with ``monitor.on_alarm: dvc`` the retraining (``dvc repro``, the reason in
``PADDLE_MLOPS_RETRAIN_REASON`` for ``track``)."""

from __future__ import annotations

import html
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from components.core.artifacts import atomic_path, write_json
from components.ml.decisions.monitor_window import Window
from components.ml.decisions.monitoring import INSUFFICIENT, RETRAIN_REASON_ENV, Sample, Verdict

log = logging.getLogger(__name__)


class MonitorSettings(Protocol):
    """The ``monitor`` params the document records (``components.steps.monitor``)."""

    alpha: float
    min_samples: int
    max_accuracy_drop: float
    window: int
    reference_splits: list[str]
    on_alarm: str


def monitor_doc(
    name: str,
    verdict: Verdict,
    checked_at: float,
    window: Window,
    labelled: int,
    log_dir: Path,
    feedback: dict[str, Any] | None,
    reference: Sample,
    params: MonitorSettings,
) -> dict[str, Any]:
    """The document written as monitor.json (``retrain`` and ``registry`` filled later)."""
    return {
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


def write_outputs(
    out_dir: Path, doc: dict[str, Any], verdict: Verdict, window: Window, checked_at: float
) -> None:
    """monitor.json, report.html and monitor.prom, written atomically into ``out_dir``."""
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        write_json(tmp / "monitor.json", doc)
        (tmp / "report.html").write_text(report_html(doc), encoding="utf-8")
        (tmp / "monitor.prom").write_text(
            prometheus(verdict, doc["model"], window.version, window, checked_at)
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


def retrain(reason: str, repo: Path) -> int:
    """``dvc repro`` of the training pipeline, the reason handed to ``track``."""
    log.warning("monitor: retraining: dvc repro in %s (the alarm above is its reason)", repo)
    env = {**os.environ, RETRAIN_REASON_ENV: reason}
    # this interpreter's dvc: the one installed with the project, whatever PATH holds
    return subprocess.run(
        [sys.executable, "-m", "dvc", "repro"], cwd=repo, env=env, check=False
    ).returncode
