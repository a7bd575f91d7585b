"""register: version the model in the MLflow registry, bless it against the champion, promote.

``run`` (the dvc stage after ``track``):

1. Registers the tracked run's ``model/`` artifacts (fp32 PIR + legacy, the gated int8 model,
   signature, manifests) as a new version of ``register.model_name`` (default
   ``<task>-classifier``), copies the lineage tags of the run onto it (``git_sha``,
   ``data_sha256``, ``params_sha256``, ``ge_success``, ``qat_gate_passed``) plus key metrics,
   and points alias ``challenger`` at it.
2. Blesses it: the registered challenger and, if one exists, the registered champion are both
   downloaded and scored by the same code as ``evaluate`` on the *current* test split. Blessed
   means: lineage complete, data validation and the QAT gate passed, accuracy at least
   ``register.min_accuracy``, and not more than ``register.max_regression`` points below the
   champion. ``blessing.json`` records the decision, every reason, and both models' metrics.
3. With ``register.auto_promote``, a blessed challenger becomes ``champion``.

Promotion and rollback hold a registry-wide lock (a lock entry created through the tracking
server, which the backend database makes unique), so racing promotions serialise: exactly one
champion, and the history tag ``champion_history`` lists every change in order with the
previous champion. Alias ``previous-champion`` always names the version ``rollback`` restores.

CLI::

    python -m components.register [run]            # the dvc stage
    python -m components.register status [--json]
    python -m components.register promote [--version N] [--force --reason TEXT]
    python -m components.register rollback [--reason TEXT]
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components import dataset, gates
from components.artifacts import StepError, read_json, write_json
from components.cli import output_dir, run_cli, step_params, step_parser, task_from_params
from components.registry import (
    CHALLENGER,
    CHAMPION,
    HOLDOUT_TAGS,
    LINEAGE_TAGS,
    PREVIOUS,
    TAG_LIMIT,
    Registry,
    download_version,
    fetch_holdout,
    log_test_split,
    version_label,
)
from components.registry import client as mlflow_client
from components.tasks import Task

log = logging.getLogger(__name__)

_EXTRA_TAGS = ("serving_image_digest", "serving_image_built")  # copied when present


@dataclass(frozen=True)
class RegisterParams:
    model_name: str | None = None  # default: "<task>-classifier"
    min_accuracy: float = 0.95  # absolute floor on the test split
    max_regression: float = 0.0  # points of accuracy the challenger may trail the champion
    max_class_regression: float = 2.0  # points of recall, any class
    alpha: float = 0.1  # one-sided exact McNemar level
    min_class_flips: int = 3  # a class limit counts from this many samples lost (net)
    auto_promote: bool = True
    split: str = "test"
    lock_timeout_s: float = 120.0  # how long a promotion waits for another to finish
    lock_stale_s: float = 600.0  # a lock older than this was left by a crashed process
    history_length: int = 25

    def check(self) -> None:
        if not 0.0 <= self.min_accuracy <= 1.0:
            raise ValueError("min_accuracy must be within [0, 1]")
        if self.max_regression < 0:
            raise ValueError("max_regression must be >= 0 (points of accuracy)")
        self.limits().check("")

    def limits(self) -> gates.PairedLimits:
        return gates.PairedLimits(
            alpha=self.alpha,
            max_drop=self.max_regression,
            max_class_drop=self.max_class_regression,
            min_class_flips=self.min_class_flips,
        )


@dataclass(frozen=True)
class Blessing:
    blessed: bool
    reasons: list[str]
    challenger: dict[str, Any]
    champion: dict[str, Any] | None
    # per data set ("test", "holdout"): paired counts of challenger vs champion, and the rules
    comparisons: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RegisterResult:
    name: str
    version: int
    blessing: Blessing
    promoted: bool


def model_name(params: RegisterParams, task: Task) -> str:
    return params.model_name or f"{task.name}-classifier"


# --------------------------------------------------------------------------- blessing


def score_registered(
    model_dir: Path, task: Task, data_dir: Path, split: str
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """Score a downloaded model version exactly as ``evaluate`` does.

    Returns the summary kept in ``blessing.json``, the labels and the predicted classes (for
    the paired comparison with the other model on the same samples).
    """
    from components.scoring import score_model

    report, y_true, y_pred, _, _ = score_model(model_dir, task, data_dir, split)
    sig_file = model_dir / "signature.json"
    signature = read_json(sig_file) if sig_file.exists() else {}
    summary = {
        "accuracy": report["accuracy"],
        "macro_f1": report["macro_f1"],
        "inputs": signature.get("inputs"),
    }
    return summary, y_true, y_pred


def bless(
    params: RegisterParams,
    lineage: dict[str, str],
    challenger: dict[str, Any],
    champion: dict[str, Any] | None,
    paired: dict[str, dict[str, Any]] | None = None,
) -> Blessing:
    """Every rule the challenger must meet; all failures are reported, not just the first.

    ``paired`` holds, per data set (``test``, ``holdout``), the :func:`gates.compare` counts
    of the champion (reference) vs the challenger (candidate) on the same samples.
    """
    reasons = []
    missing = [t for t in LINEAGE_TAGS if not lineage.get(t)]
    if missing:
        reasons.append(f"lineage tags missing: {', '.join(missing)}")
    if lineage.get("ge_success") not in (None, "", "true"):
        reasons.append("data validation (Great Expectations) did not pass")
    if lineage.get("qat_gate_passed") not in (None, "", "true"):
        reasons.append("the int8 model did not pass the QAT gate")
    if lineage.get("infra_validated") not in (None, "", "true"):
        reasons.append("infra validation of the serving image did not pass")
    acc = challenger["accuracy"]
    if acc < params.min_accuracy:
        reasons.append(f"accuracy {acc:.4f} is below register.min_accuracy {params.min_accuracy}")
    comparisons: dict[str, Any] = {}
    if champion is not None:
        if champion.get("inputs") != challenger.get("inputs"):
            reasons.append(
                f"champion v{champion['version']} takes inputs {champion.get('inputs')}, the "
                f"challenger {challenger.get('inputs')}: not comparable on the same data; "
                "promote with --force --reason if the change is intended"
            )
        else:
            for data, comparison in (paired or {}).items():
                where = f"the {params.split} split" if data == "test" else "the pinned holdout"
                verdict = gates.decide(
                    comparison,
                    params.limits(),
                    what=f"on {where}",
                    reference=f"champion v{champion['version']}",
                    params_prefix="register",
                    drop_param="max_regression",
                    class_drop_param="max_class_regression",
                )
                reasons += verdict.failures
                comparisons[data] = {**comparison, "rules": verdict.rules, "passed": verdict.passed}
    return Blessing(not reasons, reasons, challenger, champion, comparisons)


# --------------------------------------------------------------------------- step


def register_version(
    client: Any, name: str, run_id: str, tags: dict[str, str], description: str
) -> int:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(
            name,
            description="PaddlePaddle classifier; aliases "
            "champion / challenger / previous-champion",
        )
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    source = client.get_run(run_id).info.artifact_uri.rstrip("/") + "/model"
    mv = client.create_model_version(
        name, source=source, run_id=run_id, tags=tags, description=description
    )
    return int(mv.version)


def run(
    params: RegisterParams,
    task: Task,
    run_file: str | Path,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    tracking_uri: str | None = None,
) -> RegisterResult:
    run_info = read_json(run_file)
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or run_info["tracking_uri"]
    client = mlflow_client(uri)
    name = model_name(params, task)
    registry = Registry(client, name, params)
    mlrun = client.get_run(run_info["run_id"])
    lineage = {t: mlrun.data.tags.get(t, "") for t in LINEAGE_TAGS + _EXTRA_TAGS}
    metrics = mlrun.data.metrics
    key_metrics = {
        k: str(round(metrics[m], 6))
        for k, m in (
            ("accuracy", "test.accuracy"),
            ("macro_f1", "test.macro_f1"),
            ("latency_ms_b1", "test.latency_ms_b1"),
            ("qat_accuracy", "qat.accuracy"),
            ("qat_size_ratio", "qat.size_ratio"),
            ("qat_latency_ratio_b64", "qat.latency_ratio_b64"),
        )
        if m in metrics
    }
    tags = {
        **{k: v for k, v in lineage.items() if v},
        **key_metrics,
        "task": task.name,
        "mlflow_run_id": mlrun.info.run_id,
    }
    version = register_version(
        client,
        name,
        mlrun.info.run_id,
        tags,
        f"pipeline run {mlrun.info.run_id} ({lineage.get('git_sha')})",
    )
    client.set_registered_model_alias(name, CHALLENGER, str(version))
    log.info("registered %s v%d (alias %s)", name, version, CHALLENGER)

    data_dir = Path(data_dir)
    split_sha = log_test_split(client, mlrun.info.run_id, data_dir, params.split)
    client.set_model_version_tag(name, str(version), "test_split_sha256", split_sha)
    model_tags = client.get_registered_model(name).tags
    holdout = {t: model_tags[t] for t in HOLDOUT_TAGS if model_tags.get(t)}
    paired: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        challenger_dir = download_version(client, uri, name, version, Path(tmp) / "c")
        challenger, y_true, y_challenger = score_registered(
            challenger_dir, task, data_dir, params.split
        )
        challenger["version"] = version
        champion_version = registry.aliases().get(CHAMPION)
        champion = None
        if champion_version is not None:
            champion_dir = download_version(client, uri, name, champion_version, Path(tmp) / "p")
            champion, _, y_champion = score_registered(champion_dir, task, data_dir, params.split)
            champion["version"] = champion_version
            names = dataset.read_label_names(data_dir)
            paired["test"] = gates.compare(y_true, y_champion, y_challenger, names)
            pinned = len(holdout) == len(HOLDOUT_TAGS)
            if pinned and holdout["holdout_sha256"] == split_sha:  # the same bytes: same counts
                paired["holdout"] = {
                    **paired["test"],
                    "pinned_from_version": int(holdout["holdout_version"]),
                    "sha256": split_sha,
                }
            elif pinned and champion["inputs"] == challenger["inputs"]:
                h_dir = fetch_holdout(client, uri, holdout, Path(tmp) / "h", params.split)
                h_names = dataset.read_label_names(h_dir)
                _, h_true, h_champion = score_registered(champion_dir, task, h_dir, params.split)
                _, _, h_challenger = score_registered(challenger_dir, task, h_dir, params.split)
                paired["holdout"] = {
                    **gates.compare(h_true, h_champion, h_challenger, h_names),
                    "pinned_from_version": int(holdout["holdout_version"]),
                    "sha256": holdout["holdout_sha256"],
                }
            elif not pinned:
                log.warning("%s has no pinned holdout yet: blessing on %s only", name, params.split)
    blessing = bless(params, lineage, challenger, champion, paired)
    client.set_model_version_tag(name, str(version), "blessed", str(blessing.blessed).lower())
    client.set_model_version_tag(
        name, str(version), "blessing_reasons", "; ".join(blessing.reasons)[:TAG_LIMIT]
    )
    for data, comparison in blessing.comparisons.items():
        o = comparison["overall"]
        summary = {
            "vs_champion": champion["version"] if champion else None,
            "samples": o["samples"],
            "worse": o["worse"],
            "better": o["better"],
            "p_value": round(o["p_value"], 6),
            "drop_points": round(o["drop_points"], 4),
            "passed": comparison["passed"],
        }
        client.set_model_version_tag(
            name, str(version), f"blessing_{data}", json.dumps(summary, separators=(",", ":"))
        )
        client.log_batch(
            mlrun.info.run_id,
            metrics=[
                _metric(f"blessing.{data}.{k}", float(v))
                for k, v in summary.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            ],
        )
    out_dir = Path(out_dir)
    write_json(
        out_dir / "blessing.json",
        {"model": name, "version": version, **asdict(blessing), "params": asdict(params)},
    )
    client.log_artifact(mlrun.info.run_id, str(out_dir / "blessing.json"))
    client.log_metric(mlrun.info.run_id, "blessed", float(blessing.blessed))
    if blessing.blessed:
        log.info(
            "%s v%d blessed (accuracy %.4f%s)",
            name,
            version,
            challenger["accuracy"],
            f", champion v{champion['version']} {champion['accuracy']:.4f}"
            if champion
            else ", no champion yet",
        )
    else:
        log.warning(
            "%s v%d NOT blessed:\n%s",
            name,
            version,
            "\n".join(f"  - {r}" for r in blessing.reasons),
        )

    promoted = False
    if blessing.blessed and params.auto_promote:
        registry.promote(
            version,
            reason="blessed by the pipeline",
            expected_champion=champion["version"] if champion else None,
        )
        promoted = True
    write_json(
        out_dir / "registration.json",
        {
            "model": name,
            "version": version,
            "blessed": blessing.blessed,
            "promoted": promoted,
            "aliases": registry.aliases(),
        },
    )
    return RegisterResult(name, version, blessing, promoted)


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = step_parser("components.register", __doc__)
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db",
    )
    parser.add_argument("--model-name", default=None, help="default: register.model_name")
    sub = parser.add_subparsers(dest="command")
    p_run = sub.add_parser("run", help="register + bless the tracked run (the dvc stage)")
    p_run.add_argument("--run", default="outputs/track/run.json")
    p_run.add_argument("--data", default="outputs/ingest")
    p_run.add_argument("--out", default="outputs/register")
    p_status = sub.add_parser("status", help="champion, challenger, history")
    p_status.add_argument("--json", action="store_true")
    p_promote = sub.add_parser("promote", help="make a version the champion")
    p_promote.add_argument("--version", type=int, default=None, help="default: the challenger")
    p_promote.add_argument("--force", action="store_true", help="promote although not blessed")
    p_promote.add_argument("--reason", default="")
    p_rollback = sub.add_parser("rollback", help="restore the previous champion")
    p_rollback.add_argument("--reason", default="")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a in ("run", "status", "promote", "rollback", "-h", "--help") for a in argv):
        argv.append("run")
    args = parser.parse_args(argv)

    def _go() -> None:
        if args.command == "run":
            output_dir(args.out)
        params, all_params = step_params(args.params, "register", RegisterParams)
        task = task_from_params(all_params)
        if args.command == "run":
            run(params, task, args.run, args.data, args.out, tracking_uri=args.tracking_uri)
            return
        name = args.model_name or model_name(params, task)
        registry = Registry(mlflow_client(args.tracking_uri), name, params)
        if not registry.exists():
            raise StepError(f"no registered model '{name}' at the tracking URI")
        if args.command == "status":
            status = registry.status()
            sys.stdout.write(
                json.dumps(status, indent=2) + "\n" if args.json else _format_status(status)
            )
        elif args.command == "promote":
            version = args.version or registry.aliases().get(CHALLENGER)
            if version is None:
                raise StepError(f"{name}: no --version given and no '{CHALLENGER}' alias")
            event = registry.promote(version, force=args.force, reason=args.reason)
            sys.stdout.write(json.dumps(event) + "\n")
        elif args.command == "rollback":
            sys.stdout.write(json.dumps(registry.rollback(reason=args.reason)) + "\n")

    return run_cli(_go)


def _metric(key: str, value: float) -> Any:
    from mlflow.entities import Metric

    return Metric(key, value, int(time.time() * 1000), 0)


def _format_status(status: dict[str, Any]) -> str:
    lines = [f"model {status['model']}"]
    for alias in (CHAMPION, CHALLENGER, PREVIOUS):
        entry = status.get(alias)
        if entry is None:
            lines.append(f"  {alias:<18} -")
            continue
        t = entry["tags"]
        lines.append(
            f"  {alias:<18} v{entry['version']}  accuracy {t.get('accuracy', '?')}  "
            f"blessed {t.get('blessed', '?')}  git {t.get('git_sha', '?')[:12]}  "
            f"data {t.get('data_sha256', '?')[:12]}  params {t.get('params_sha256', '?')[:12]}  "
            f"ge {t.get('ge_success', '?')}  qat_gate {t.get('qat_gate_passed', '?')}"
        )
    for event in status["history"][-5:]:
        lines.append(
            f"  {event['at']}  {event['action']:<8} v{event['version']} "
            f"(was {version_label(event['previous'])})"
            f"{'  FORCED: ' + event['reason'] if event.get('forced') else ''}"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
