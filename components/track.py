"""track: record one pipeline execution as one MLflow run, with a nested run per step.

Runs after evaluate and reads only the files the steps wrote, so the steps stay free of
MLflow. The parent run carries every parameter of ``params.yaml`` (flattened), the headline
metrics, the per-epoch training curves (``step`` = epoch), the tags ``git_sha``,
``data_sha256`` (of the raw inputs), ``params_sha256`` and ``task``, and the exported model
under ``model/``. Each nested run (ingest ... evaluate, serving_image) carries that
step's manifest, outputs such as the Great Expectations result and Data Docs, and metrics.

Tracking URI: ``MLFLOW_TRACKING_URI`` if set, else ``sqlite:///mlflow.db`` in the working
directory (no server needed). ``run.json`` in the output directory names the run.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.artifacts import (
    StepError,
    combined_sha256,
    git_sha,
    machine_tags,
    read_json,
    write_json,
)
from components.cli import output_dir, run_cli, step_params, step_parser
from components.config import params_sha256
from components.registry import tracking_uri

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrackParams:
    experiment: str = "digits"
    run_name_prefix: str = "pipeline"


@dataclass(frozen=True)
class StepOutputs:
    """Where each step left its files (defaults match dvc.yaml)."""

    ingest: Path = Path("outputs/ingest")
    validate: Path = Path("outputs/validate")
    train: Path = Path("outputs/train")
    export: Path = Path("outputs/export")
    qat: Path = Path("outputs/qat")
    evaluate: Path = Path("outputs/evaluate")
    serving_image: Path = Path("outputs/serving_image")
    metrics: Path = Path("metrics")
    plots: Path = Path("plots")


@dataclass(frozen=True)
class TrackResult:
    run_id: str
    experiment_id: str
    tracking_uri: str


def flatten(d: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flatten(value, f"{name}.")
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


def _log_dir(mlflow_mod: Any, path: Path, artifact_path: str | None = None) -> None:
    if path.is_dir():
        mlflow_mod.log_artifacts(str(path), artifact_path)
    elif path.is_file():
        mlflow_mod.log_artifact(str(path), artifact_path)


def run(
    params: TrackParams, all_params: Mapping[str, Any], outputs: StepOutputs, out_dir: str | Path
) -> TrackResult:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    out_dir = Path(out_dir)
    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    manifests = {
        step: read_json(getattr(outputs, step) / "manifest.json")
        for step in ("ingest", "validate", "train", "qat", "export", "evaluate", "serving_image")
    }
    ge_summary = read_json(outputs.validate / "summary.json")
    train_metrics = read_json(outputs.metrics / "train.json")
    eval_metrics = read_json(outputs.metrics / "evaluate.json")
    qat_metrics = read_json(outputs.metrics / "qat.json")
    infra = read_json(outputs.serving_image / "infra.json")
    history = read_json(outputs.train / "history.json")
    data_sha = combined_sha256(manifests["ingest"].get("input_sha256", {}))
    sha = git_sha()
    task_name = str(all_params.get("task", {}).get("name", "unknown"))
    tags = {
        "git_sha": sha,
        "data_sha256": data_sha,
        "params_sha256": params_sha256(dict(all_params)),
        "task": task_name,
        "amp_effective": str(train_metrics.get("amp_effective")),
        "ge_success": str(bool(ge_summary.get("success"))).lower(),
        "qat_gate_passed": str(bool(qat_metrics.get("gate_passed"))).lower(),
        "serving_image": str(infra.get("image") or ""),
        "serving_image_digest": str(infra.get("digest") or ""),
        "serving_image_built": str(bool(infra.get("built"))).lower(),
        "infra_validated": str(bool(infra.get("infra_validated"))).lower(),
        # the hardware and runtimes the model was trained on (each step's own: nested runs)
        **_machine_tags(manifests["train"]),
    }

    try:
        mlflow.set_experiment(params.experiment)
    except Exception as exc:  # MLflow raises its own exception types for bad URIs/backends
        raise StepError(
            f"MLflow tracking at {uri}: cannot open experiment '{params.experiment}' ({exc})"
        ) from exc
    run_name = f"{params.run_name_prefix}-{task_name}-{sha[:8]}"
    with mlflow.start_run(run_name=run_name, tags=tags) as parent:
        flat = {k: str(v) for k, v in flatten(all_params)}
        mlflow.log_params({k: v[:6000] for k, v in flat.items()})
        mlflow.log_metrics(
            {
                **_numeric(train_metrics, "train."),
                **_numeric(eval_metrics, "test."),
                **_numeric(qat_metrics, "qat."),
                "qat.gate_passed": float(bool(qat_metrics.get("gate_passed"))),
                "ge_success": float(bool(ge_summary.get("success"))),
            }
        )
        for row in history:
            epoch = int(row["epoch"])
            mlflow.log_metrics({k: float(v) for k, v in row.items() if k != "epoch"}, step=epoch)
        _log_dir(mlflow, outputs.export, "model")
        _log_dir(mlflow, outputs.plots, "plots")
        _log_dir(mlflow, outputs.metrics, "metrics")

        step_files: dict[str, list[tuple[Path, str | None]]] = {
            "ingest": [
                (outputs.ingest / "manifest.json", None),
                (outputs.ingest / "labels.json", None),
            ],
            "validate": [(outputs.validate, "great_expectations")],
            "train": [
                (outputs.train / "manifest.json", None),
                (outputs.train / "history.json", None),
                (outputs.train / "model_meta.json", None),
            ],
            "qat": [
                (outputs.qat / "manifest.json", None),
                (outputs.qat / "gate.json", None),
            ],
            "export": [
                (outputs.export / "manifest.json", None),
                (outputs.export / "parity.json", None),
                (outputs.export / "signature.json", None),
            ],
            "evaluate": [(outputs.evaluate, None)],
            "serving_image": [
                (outputs.serving_image / "manifest.json", None),
                (outputs.serving_image / "infra.json", None),
            ],
        }
        step_metrics = {
            "train": train_metrics,
            "evaluate": eval_metrics,
            "qat": {**qat_metrics, "gate_passed": float(bool(qat_metrics.get("gate_passed")))},
            "validate": {
                "success": float(bool(ge_summary.get("success"))),
                "expectations_evaluated": ge_summary.get("evaluated", 0),
                "expectations_failed": ge_summary.get("failed", 0),
            },
        }
        for step, files in step_files.items():
            step_tags = {**tags, **_machine_tags(manifests.get(step, {})), "step": step}
            with mlflow.start_run(run_name=step, nested=True, tags=step_tags):
                section_params = all_params.get(step, {})
                if isinstance(section_params, Mapping) and section_params:
                    mlflow.log_params({k: str(v)[:6000] for k, v in flatten(section_params)})
                if step in step_metrics:
                    metrics = _numeric(step_metrics[step], "")
                    if metrics:
                        mlflow.log_metrics(metrics)
                if step == "train":
                    for row in history:
                        mlflow.log_metrics(
                            {k: float(v) for k, v in row.items() if k != "epoch"},
                            step=int(row["epoch"]),
                        )
                for path, artifact_path in files:
                    _log_dir(mlflow, path, artifact_path)
        result = TrackResult(parent.info.run_id, parent.info.experiment_id, uri)
    write_json(
        out_dir / "run.json",
        {
            "run_id": result.run_id,
            "experiment_id": result.experiment_id,
            "experiment": params.experiment,
            "tracking_uri": uri,
            "tags": tags,
        },
    )
    log.info("MLflow run %s in experiment '%s' at %s", result.run_id, params.experiment, uri)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = step_parser("components.track", __doc__)
    parser.add_argument("--out", default="outputs/track")
    args = parser.parse_args(argv)

    def _go() -> None:
        output_dir(args.out)
        params, all_params = step_params(args.params, "track", TrackParams)
        run(params, all_params, StepOutputs(), args.out)

    return run_cli(_go)


if __name__ == "__main__":
    sys.exit(main())
