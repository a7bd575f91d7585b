"""What the pipeline's steps left, as the MLflow tags, params and metrics ``track`` logs.

:class:`StepOutputs` is where each step left its files (the ports of the track step);
:func:`lineage_tags` the parent run's tags (what the model was made from and where),
:func:`step_metrics` each step's metrics, :func:`epoch_metrics` the training curves,
:func:`flatten` ``params.yaml`` as MLflow params and :func:`step_times` when a step ran, as its
manifest recorded it. Only files are read here; :mod:`components.tracking.pipeline_run` logs.

Library layer: imported by the track step, imports no step.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from components.core.artifacts import combined_sha256, git_sha, machine_tags, read_json
from components.core.config import params_sha256
from components.ml.data import snapshot
from components.tracking.model import BUNDLE_TAG, SERVED_TAG, bundle_sha256, served_sha256
from components.tracking.registry import CURVE_PREFIX


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


def numeric_metrics(d: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """The numeric values of ``d`` (flattened) as MLflow metrics named ``<prefix><key>``."""
    return {
        f"{prefix}{k}".replace(" ", "_"): float(v)
        for k, v in flatten(d)
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def step_machine_tags(manifest: Mapping[str, Any]) -> dict[str, str]:
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
        **step_machine_tags(manifests["train"]),
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


def ended_ms(manifest: Mapping[str, Any]) -> int | None:
    """When a step ended (its manifest's ``finished_at``, else ``created_at``), in epoch ms."""
    stamp = manifest.get("finished_at") or manifest.get("created_at")
    return _ms(stamp) if stamp else None
