"""Scheduled retraining: upload the compiled pipeline and manage its recurring run.

    python -m pipelines.schedule create --host URL --cron "0 0 3 * * 1" [--dry-run]
    python -m pipelines.schedule list   --host URL
    python -m pipelines.schedule disable|enable|delete --host URL --name NAME
    python -m pipelines.schedule trigger --host URL --monitor outputs/monitor/monitor.json

``create`` uploads ``pipelines/compiled/training.yaml`` as a new version of pipeline
``paddle-mlops-training`` (creating the pipeline on first use), then creates the recurring
run, or replaces an existing one of the same name. The cron expression has six fields
(seconds first) as the KFP API expects; runs never overlap (``max_concurrency=1``) and missed
slots are not caught up (``no_catchup=True``). ``trigger`` is retraining by evidence: when the
monitor's ``monitor.json`` says it alarmed, it uploads the pipeline the same way and starts one
run now, its ``retrain_reason`` argument the alarm line (the track step tags it on the MLflow run,
register on the new version); no alarm, no call. ``--dry-run`` prints exactly the calls that
would be sent and contacts nothing.
"""

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PIPELINE_NAME = "paddle-mlops-training"


@dataclass(frozen=True)
class Call:
    """One ``kfp.Client`` method call: its name and keyword arguments."""

    method: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class SchedulePlan:
    calls: list[Call] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps([asdict(c) for c in self.calls], indent=2, sort_keys=True)


def check_cron(expr: str) -> str:
    """KFP recurring runs take 6-field cron expressions (seconds first)."""
    fields = expr.split()
    if len(fields) != 6:
        raise ValueError(
            f"cron '{expr}' has {len(fields)} fields; KFP needs 6 (seconds minutes hours "
            "day-of-month month day-of-week), e.g. '0 0 3 * * 1' for Mondays 03:00"
        )
    return expr


def plan_create(
    package: Path,
    *,
    experiment_id: str,
    job_name: str,
    cron: str,
    params: dict[str, Any],
    version: str,
    pipeline_id: str | None,
    service_account: str | None,
    pipeline_root: str | None,
) -> SchedulePlan:
    """The calls ``create`` makes, in order (upload first, then the recurring run)."""
    check_cron(cron)
    upload = _upload(package, version, pipeline_id)
    recurring: dict[str, Any] = {
        "experiment_id": experiment_id,
        "job_name": job_name,
        "description": f"scheduled retraining of {PIPELINE_NAME}",
        "cron_expression": cron,
        "max_concurrency": 1,
        "no_catchup": True,
        "params": params,  # one pipeline parameter per params.yaml section
        "pipeline_id": pipeline_id or "<id returned by upload_pipeline>",
        "version_id": "<id returned by the upload>",
        "enabled": True,
        "enable_caching": None,
    }
    if service_account:
        recurring["service_account"] = service_account
    if pipeline_root:
        recurring["pipeline_root"] = pipeline_root
    return SchedulePlan([upload, Call("create_recurring_run", recurring)])


def _upload(package: Path, version: str, pipeline_id: str | None) -> Call:
    """A new version of the pipeline, or the pipeline itself on first use."""
    return (
        Call(
            "upload_pipeline_version",
            {
                "pipeline_package_path": str(package),
                "pipeline_version_name": version,
                "pipeline_id": pipeline_id,
            },
        )
        if pipeline_id
        else Call(
            "upload_pipeline",
            {
                "pipeline_package_path": str(package),
                "pipeline_name": PIPELINE_NAME,
                "description": "paddle-mlops training + promotion",
            },
        )
    )


def plan_trigger(
    package: Path,
    *,
    experiment_id: str,
    job_name: str,
    params: dict[str, Any],
    reason: str,
    version: str,
    pipeline_id: str | None,
    service_account: str | None,
    pipeline_root: str | None,
) -> SchedulePlan:
    """The calls ``trigger`` makes: the upload, then one run now with ``reason``."""
    run: dict[str, Any] = {
        "experiment_id": experiment_id,
        "job_name": job_name,
        "params": {**params, "retrain_reason": reason},
        "pipeline_id": pipeline_id or "<id returned by upload_pipeline>",
        "version_id": "<id returned by the upload>",
        "enable_caching": None,
    }
    if service_account:
        run["service_account"] = service_account
    if pipeline_root:
        run["pipeline_root"] = pipeline_root
    return SchedulePlan([_upload(package, version, pipeline_id), Call("run_pipeline", run)])


def _client(host: str) -> Any:
    import kfp

    return kfp.Client(host=host)


def _find_recurring(client: Any, experiment_id: str, name: str) -> Any | None:
    runs = client.list_recurring_runs(experiment_id=experiment_id, page_size=100).recurring_runs
    return next((r for r in runs or [] if r.display_name == name), None)


def _connect(args: argparse.Namespace) -> tuple[Any, str, str | None]:
    """(client or None for a dry run, experiment id, the pipeline's id if it exists)."""
    if args.dry_run:
        return None, f"<id of experiment {args.experiment}>", None
    client = _client(args.host)
    experiment_id = client.create_experiment(args.experiment).experiment_id
    return client, experiment_id, client.get_pipeline_id(PIPELINE_NAME)


def _uploaded(client: Any, plan: SchedulePlan, pipeline_id: str | None) -> dict[str, Any]:
    """Send the plan's upload call: the arguments of its second call, with the ids of the
    pipeline and of the version just uploaded."""
    upload = plan.calls[0]
    uploaded = getattr(client, upload.method)(**upload.kwargs)
    pipeline_id = getattr(uploaded, "pipeline_id", None) or pipeline_id
    version_id = getattr(uploaded, "pipeline_version_id", None)
    if version_id is None:  # a new pipeline: its first version
        versions = client.list_pipeline_versions(
            pipeline_id, page_size=1, sort_by="created_at desc"
        )
        version_id = versions.pipeline_versions[0].pipeline_version_id
    return dict(plan.calls[1].kwargs, pipeline_id=str(pipeline_id), version_id=str(version_id))


def create(args: argparse.Namespace, params: dict[str, Any]) -> SchedulePlan:
    from pipelines.training import compile_pipeline, pipeline_params

    # compiled from the same params file as the run's arguments (resources, train backend)
    package = compile_pipeline(args.package, args.gpus, params_file=args.params)
    version = args.version or datetime.now(UTC).strftime("v%Y%m%d-%H%M%S")
    client, experiment_id, pipeline_id = _connect(args)
    plan = plan_create(
        package,
        experiment_id=experiment_id,
        job_name=args.name,
        cron=args.cron,
        params=pipeline_params(params),
        version=version,
        pipeline_id=pipeline_id,
        service_account=args.service_account,
        pipeline_root=args.pipeline_root,
    )
    if client is None:
        return plan
    kwargs = _uploaded(client, plan, pipeline_id)
    existing = _find_recurring(client, experiment_id, args.name)
    if existing is not None:  # "update": KFP has no update call, so replace it
        client.delete_recurring_run(existing.recurring_run_id)
    client.create_recurring_run(**kwargs)
    return plan


def trigger(args: argparse.Namespace, params: dict[str, Any]) -> SchedulePlan:
    """One run now when ``args.monitor`` (a monitor.json) alarmed; no alarm: no call."""
    from components.core.artifacts import StepError, read_json
    from pipelines.training import compile_pipeline, pipeline_params

    path = Path(args.monitor)
    if not path.is_file():
        raise StepError(f"{path}: no monitor.json (--monitor: the monitor's --report/monitor.json)")
    doc = read_json(path)
    if not doc.get("alarm"):
        log.info("%s: no alarm, no retraining run", path)
        return SchedulePlan()
    reason = str(doc.get("alarm_line") or f"monitor alarm ({path})")
    package = compile_pipeline(args.package, args.gpus, params_file=args.params)
    now = datetime.now(UTC)
    client, experiment_id, pipeline_id = _connect(args)
    plan = plan_trigger(
        package,
        experiment_id=experiment_id,
        job_name=f"{args.name}-retrain-{now:%Y%m%d-%H%M%S}",
        params=pipeline_params(params),
        reason=reason,
        version=args.version or now.strftime("v%Y%m%d-%H%M%S"),
        pipeline_id=pipeline_id,
        service_account=args.service_account,
        pipeline_root=args.pipeline_root,
    )
    if client is None:
        return plan
    run = client.run_pipeline(**_uploaded(client, plan, pipeline_id))
    log.warning("started KFP run %s: %s", getattr(run, "run_id", "?"), reason)
    return plan


def build_parser() -> argparse.ArgumentParser:
    """The command line (the manifests under k8s/ are checked against it)."""
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.schedule",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default=None, help="KFP API endpoint (or KF_PIPELINES_ENDPOINT)")
    parser.add_argument("--experiment", default="paddle-mlops")
    parser.add_argument("--name", default="paddle-mlops-weekly-retraining")
    sub = parser.add_subparsers(dest="command", required=True)
    p_create = sub.add_parser("create", help="upload + create/replace the recurring run")
    p_create.add_argument("--cron", default="0 0 3 * * 1", help="6 fields, seconds first")
    p_trigger = sub.add_parser("trigger", help="upload + one run now, if the monitor alarmed")
    p_trigger.add_argument("--monitor", required=True, help="the monitor's monitor.json")
    for p in (p_create, p_trigger):
        p.add_argument("--params", default="params.yaml")
        p.add_argument("--package", default="pipelines/compiled/training.yaml")
        p.add_argument("--version", default=None, help="default: vYYYYmmdd-HHMMSS")
        p.add_argument("--gpus", type=int, default=0)
        p.add_argument("--service-account", default="paddle-mlops-pipeline")
        p.add_argument("--pipeline-root", default=None)
        p.add_argument("--dry-run", action="store_true", help="print the calls, send none")
    for name in ("list", "enable", "disable", "delete"):
        sub.add_parser(name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from components.core.config import load_params
    from components.kernel.cli import run_cli

    args = build_parser().parse_args(argv)

    def _go() -> None:
        from components.core.artifacts import StepError

        if args.command in ("create", "trigger"):
            if args.host is None and not args.dry_run:
                raise StepError("--host is required (the KFP API endpoint)")
            action = create if args.command == "create" else trigger
            try:
                plan = action(args, load_params(args.params))
            except ValueError as exc:
                raise StepError(str(exc)) from exc
            sys.stdout.write(plan.to_json() + "\n")
            return
        if args.host is None:
            raise StepError("--host is required (the KFP API endpoint)")
        client = _client(args.host)
        experiment_id = client.get_experiment(experiment_name=args.experiment).experiment_id
        if args.command == "list":
            runs = client.list_recurring_runs(experiment_id=experiment_id).recurring_runs or []
            for r in runs:
                sys.stdout.write(f"{r.recurring_run_id}  {r.display_name}  {r.status}\n")
            return
        run = _find_recurring(client, experiment_id, args.name)
        if run is None:
            raise StepError(f"no recurring run named {args.name} in {args.experiment}")
        {
            "enable": client.enable_recurring_run,
            "disable": client.disable_recurring_run,
            "delete": client.delete_recurring_run,
        }[args.command](run.recurring_run_id)

    return run_cli(_go)


if __name__ == "__main__":
    sys.exit(main())
