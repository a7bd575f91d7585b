"""``monitor`` and the registry (library layer): the reference as a cluster has it (the
judged version's bundle and the test split it was blessed on) and the verdict recorded on
that version (tags) and its run (metrics, one point per monitor run)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError
from components.ml.decisions.monitoring import INSUFFICIENT
from components.tracking.registry import (
    CHAMPION,
    Registry,
    RegistryParams,
    client,
    download_version,
    fetch_holdout,
)

log = logging.getLogger(__name__)


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
