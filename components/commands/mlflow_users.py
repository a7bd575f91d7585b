"""``paddle-mlops mlflow-users``: create or update the pipeline and deploy users of an MLflow
server running ``--app-name basic-auth``, and their grants (run with admin rights).

The command line only: reading the arguments and the credentials, then the library
``components.tracking.auth`` (MLflow's ``AuthServiceClient`` with explicit credentials).
Passwords come only from environment variables or files (mounted Secrets), never from the
command line, and are never logged.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError
from components.core.config import load_params, section
from components.core.retry import BackoffParams
from components.core.uris import redact_uri
from components.kernel.cli import run_cli
from components.tasks import is_builtin, task_class
from components.tracking.auth import (
    DEPLOY_PERMISSION,
    PIPELINE_PERMISSION,
    AuthAdmin,
    Credentials,
    admin_from_auth_config,
    can_log_in,
    check_password,
    credentials_from,
    ensure_user,
    grant_experiment,
    grant_model,
    wait_for_server,
)
from components.tracking.pipeline_run import TrackParams
from components.tracking.registry import (
    BUILTIN_MODEL_KIND,
    RegistryParams,
    registered_name,
    tracking_uri,
)

log = logging.getLogger("components.tracking.auth")  # the library's logger, as before


@dataclass(frozen=True)
class Accounts:
    """Who the command acts as and for: the admin, the pipeline user, the deploy user (None:
    ``--no-deploy-user``)."""

    admin: Credentials
    pipeline: Credentials
    deploy: Credentials | None


def _defaults_from_params(params_file: str) -> tuple[str, str]:
    """``track.experiment`` and the registered model name of ``params_file`` (without
    importing the task, so no Paddle import)."""

    all_params = load_params(params_file)
    experiment = ""  # no track section: the error below names it
    if "track" in all_params:
        experiment = section(all_params, "track", TrackParams, source=params_file).experiment
    registry = section(all_params, "registry", RegistryParams, source=params_file)
    task = (all_params.get("task") or {}).get("name")
    model = ""
    if task:  # a plugin's class says what it registers (built-in ones: no paddle import)
        kind = BUILTIN_MODEL_KIND if is_builtin(task) else task_class(task).model_kind
        model = registered_name(registry, task, kind)
    if not experiment or not model:
        raise StepError(
            f"{params_file}: cannot tell the experiment (track.experiment) or the model "
            "(registry.model_name, task.name); pass --experiment and --model-name"
        )
    return experiment, model


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paddle-mlops mlflow-users",
        description=(
            "Create or update the MLflow users of the pipeline (EDIT on the experiment and the "
            "registered model) and of deployments (READ), idempotently. Passwords are read "
            "from environment variables or files only. Admin: --admin-auth-config, "
            "--admin-secret-dir, or MLFLOW_ADMIN_USERNAME + MLFLOW_ADMIN_PASSWORD[_FILE]. "
            "Pipeline user: --pipeline-secret-dir or MLFLOW_PIPELINE_USERNAME + "
            "MLFLOW_PIPELINE_PASSWORD[_FILE]. Deploy user: --deploy-secret-dir or "
            "MLFLOW_DEPLOY_USERNAME + MLFLOW_DEPLOY_PASSWORD[_FILE]."
        ),
    )
    parser.add_argument("--tracking-uri", default=None, help="default: MLFLOW_TRACKING_URI")
    parser.add_argument("--params", default="params.yaml", help="for the default names")
    parser.add_argument("--experiment", default=None, help="default: params track.experiment")
    parser.add_argument("--model-name", default=None, help="default: the registry's model name")
    parser.add_argument(
        "--admin-auth-config",
        default=None,
        metavar="INI",
        help="the server's auth config (basic_auth.ini): admin_username and admin_password",
    )
    for role in ("admin", "pipeline", "deploy"):
        parser.add_argument(
            f"--{role}-secret-dir",
            default=None,
            metavar="DIR",
            help=f"directory with files 'username' and 'password' of the {role} user",
        )
    parser.add_argument(
        "--no-deploy-user", action="store_true", help="only create the pipeline user"
    )
    parser.add_argument(
        "--wait-s", type=float, default=120.0, help="wait this long for the server (default 120)"
    )
    return parser


def _health_backoff(params_file: str) -> BackoffParams | None:
    """``registry.health_backoff`` of ``params_file`` (None when there is no such file: the
    default)."""
    if not Path(params_file).is_file():
        return None
    return section(load_params(params_file), "registry", RegistryParams).health_backoff


def _names(args: argparse.Namespace) -> tuple[str, str]:
    """The experiment and the registered model: the flags, else ``--params``'s."""
    if args.experiment and args.model_name:
        return args.experiment, args.model_name
    default_experiment, default_model = _defaults_from_params(args.params)
    return args.experiment or default_experiment, args.model_name or default_model


def _accounts(args: argparse.Namespace) -> Accounts:
    """The three accounts' credentials, each password checked before any request."""
    if args.admin_auth_config and args.admin_secret_dir:
        raise StepError("give --admin-auth-config or --admin-secret-dir, not both")
    admin = (
        admin_from_auth_config(args.admin_auth_config)
        if args.admin_auth_config
        else credentials_from("admin", "MLFLOW_ADMIN", secret_dir=args.admin_secret_dir)
    )
    pipeline = credentials_from("pipeline", "MLFLOW_PIPELINE", secret_dir=args.pipeline_secret_dir)
    deploy = (
        None
        if args.no_deploy_user
        else credentials_from("deploy", "MLFLOW_DEPLOY", secret_dir=args.deploy_secret_dir)
    )
    if deploy is not None and deploy.username == pipeline.username:
        raise StepError(
            f"the pipeline and deploy users are both '{pipeline.username}'; the deploy user "
            "must be a separate, read-only account"
        )
    for creds in (pipeline, deploy):
        if creds is not None:
            check_password(creds)
    return Accounts(admin, pipeline, deploy)


def _apply(
    uri: str, admin: AuthAdmin, accounts: Accounts, experiment: str, model: str
) -> dict[str, Any]:
    """Each user, its grants and a login check; the summary the command prints."""
    from mlflow.exceptions import MlflowException

    plan = [("pipeline", accounts.pipeline, PIPELINE_PERMISSION)]
    if accounts.deploy is not None:
        plan.append(("deploy", accounts.deploy, DEPLOY_PERMISSION))
    users: dict[str, Any] = {}
    try:
        admin.check_admin()
        for role, creds, permission in plan:
            users[role] = {
                "username": creds.username,
                "user": ensure_user(admin, creds),
                "permission": permission,
                "experiment": experiment,
                "experiment_grant": grant_experiment(admin, creds.username, experiment, permission),
                "registered_model": model,
                "registered_model_grant": grant_model(admin, creds.username, model, permission),
            }
            if not can_log_in(admin.tracking_uri, creds):
                raise StepError(f"MLflow user '{creds.username}' still cannot log in")
    except MlflowException as exc:  # its message names the endpoint, never a password
        raise StepError(
            f"MLflow server {redact_uri(uri)} refused a request: HTTP "
            f"{exc.get_http_status_code()} {exc.error_code}: {exc.message[:300]}"
        ) from None
    return users


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops mlflow-users``: create/update the pipeline and deploy users and their
    grants on an MLflow server running ``--app-name basic-auth`` (run with admin rights)."""
    args = _parser().parse_args(argv)

    def _go() -> None:
        uri = args.tracking_uri or tracking_uri()
        experiment, model = _names(args)
        accounts = _accounts(args)
        admin = AuthAdmin(uri, accounts.admin)
        log.info(
            "MLflow server %s: users for experiment '%s' and model '%s' (admin '%s')",
            redact_uri(uri),
            experiment,
            model,
            accounts.admin.username,
        )
        wait_for_server(admin.tracking_uri, args.wait_s, health=_health_backoff(args.params))
        users = _apply(uri, admin, accounts, experiment, model)
        summary = {"tracking_uri": redact_uri(uri), "users": users}
        sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")

    return run_cli(_go)
