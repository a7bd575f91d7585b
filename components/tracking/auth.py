"""Users and permissions of an MLflow server that runs ``mlflow server --app-name basic-auth``.

Library layer (imports no step). An admin session (:class:`AuthAdmin`) talks to the auth REST
API of the server with explicit credentials (never the process-wide ``MLFLOW_TRACKING_*``
variables), and every operation is idempotent, so the ``mlflow-users`` Job can run again after
a password rotation or a partial failure:

- :func:`ensure_user` creates a user, or sets its password if the user exists and the password
  does not already work;
- :func:`grant_experiment` / :func:`grant_model` give a user exactly one permission on an
  experiment (by name) or a registered model, creating the experiment or model (as the admin)
  when it does not exist yet, and updating an existing grant of another level.

``paddle-mlops mlflow-users`` (:func:`main`) makes the two accounts the cluster uses: the
**pipeline** user (``EDIT`` on the experiment and the registered model: runs, artifacts, new
versions, tags, aliases; it creates and deletes the promotion lock model itself, as its
creator) and the read-only **deploy** user (``READ`` on the registered model, and on the
experiment because a version's files are its run's artifacts). Passwords come only from
environment variables or files (mounted Secrets), never from the command line, and are never
logged.
"""

from __future__ import annotations

import configparser
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError
from components.core.config import load_params, section
from components.core.uris import redact_uri
from components.kernel.cli import run_cli
from components.tasks import is_builtin, task_class
from components.tracking.registry import (
    BUILTIN_MODEL_KIND,
    RegistryParams,
    registered_name,
    tracking_uri,
)

log = logging.getLogger(__name__)

# The REST routes of mlflow.server.auth.routes / mlflow.server.handlers (mlflow 3.17), spelled
# out so a client does not import the server (tests/test_mlflow_auth.py checks they match).
CREATE_USER = "/api/2.0/mlflow/users/create"
GET_USER = "/api/2.0/mlflow/users/get"
GET_CURRENT_USER = "/api/2.0/mlflow/users/current"
UPDATE_USER_PASSWORD = "/api/2.0/mlflow/users/update-password"
GRANT_USER_PERMISSION = "/api/3.0/mlflow/users/permissions/grant"
LIST_USER_ROLES = "/api/3.0/mlflow/users/roles/list"
UPDATE_ROLE_PERMISSION = "/api/3.0/mlflow/roles/permissions/update"
GET_EXPERIMENT_BY_NAME = "/api/2.0/mlflow/experiments/get-by-name"
CREATE_EXPERIMENT = "/api/2.0/mlflow/experiments/create"
GET_REGISTERED_MODEL = "/api/2.0/mlflow/registered-models/get"
CREATE_REGISTERED_MODEL = "/api/2.0/mlflow/registered-models/create"

PERMISSIONS = ("READ", "USE", "EDIT", "MANAGE")
MIN_PASSWORD_LENGTH = 12  # the auth store refuses shorter passwords

# who gets what (paddle-mlops mlflow-users)
PIPELINE_PERMISSION = "EDIT"  # experiment + registered model: log, register, move aliases
DEPLOY_PERMISSION = "READ"  # registered model + experiment (a version's files are run artifacts)


@dataclass(frozen=True)
class Credentials:
    """A username and its password; the password never appears in ``repr`` or logs."""

    username: str
    password: str = field(repr=False)
    source: str = "?"  # where they were read from, for error messages


def _host_creds(tracking_uri: str, creds: Credentials | None) -> Any:
    from mlflow.environment_variables import (
        MLFLOW_TRACKING_CLIENT_CERT_PATH,
        MLFLOW_TRACKING_INSECURE_TLS,
        MLFLOW_TRACKING_SERVER_CERT_PATH,
    )
    from mlflow.utils.rest_utils import MlflowHostCreds

    return MlflowHostCreds(
        host=tracking_uri,
        username=creds.username if creds else None,
        password=creds.password if creds else None,
        ignore_tls_verification=MLFLOW_TRACKING_INSECURE_TLS.get(),
        client_cert_path=MLFLOW_TRACKING_CLIENT_CERT_PATH.get(),
        server_cert_path=MLFLOW_TRACKING_SERVER_CERT_PATH.get(),
    )


def _call(
    tracking_uri: str,
    creds: Credentials | None,
    endpoint: str,
    method: str,
    *,
    max_retries: int | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """One REST call; a non-200 answer raises ``MlflowException`` (its status and error code
    kept: ``exc.get_http_status_code()``, ``exc.error_code``)."""
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    resp = http_request(
        _host_creds(tracking_uri, creds), endpoint, method, max_retries=max_retries, **kwargs
    )
    resp = verify_rest_response(resp, endpoint)
    return resp.json() if resp.content else {}


def _error_code(exc: BaseException) -> str | None:
    return getattr(exc, "error_code", None)


class AuthAdmin:
    """An admin session against one tracking server's auth API (explicit credentials)."""

    def __init__(self, tracking_uri: str, admin: Credentials):
        if not tracking_uri.startswith(("http://", "https://")):
            raise StepError(
                f"tracking URI {redact_uri(tracking_uri)!r}: users and permissions exist only on "
                "an MLflow server (http:// or https://) running --app-name basic-auth"
            )
        self.tracking_uri = tracking_uri.rstrip("/")
        self.admin = admin

    def call(self, endpoint: str, method: str, **kwargs: Any) -> dict[str, Any]:
        return _call(self.tracking_uri, self.admin, endpoint, method, **kwargs)

    def check_admin(self) -> None:
        """Fail with a readable message unless the admin credentials work and are an admin's."""
        from mlflow.exceptions import MlflowException

        try:
            user = self.call(GET_CURRENT_USER, "GET", max_retries=0).get("user", {})
        except MlflowException as exc:
            status = exc.get_http_status_code()
            if status == 401:
                raise StepError(
                    f"admin user '{self.admin.username}' ({self.admin.source}) was refused by "
                    f"{redact_uri(self.tracking_uri)}: wrong password, or no such user"
                ) from exc
            if status == 404:
                raise StepError(
                    f"{redact_uri(self.tracking_uri)} has no auth API ({GET_CURRENT_USER}): the "
                    "server must run `mlflow server --app-name basic-auth`"
                ) from exc
            raise
        if not user.get("is_admin"):
            raise StepError(
                f"user '{self.admin.username}' ({self.admin.source}) is not an admin of "
                f"{redact_uri(self.tracking_uri)}; creating users and grants needs one"
            )

    def user_id(self, username: str) -> int | None:
        from mlflow.exceptions import MlflowException

        try:
            return int(self.call(GET_USER, "GET", params={"username": username})["user"]["id"])
        except MlflowException as exc:
            if _error_code(exc) == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise

    def explicit_grant(
        self, username: str, resource_type: str, resource_id: str
    ) -> tuple[int, str] | None:
        """``(role_permission_id, permission)`` of the user's own grant on one resource (the
        grant lives on the user's synthetic role ``__user_<id>__``), or ``None``."""
        uid = self.user_id(username)
        if uid is None:
            raise StepError(f"MLflow user '{username}' does not exist")
        roles = self.call(LIST_USER_ROLES, "GET", params={"username": username}).get("roles", [])
        for role in roles:
            if role.get("name") != f"__user_{uid}__":
                continue
            for perm in role.get("permissions", []):
                if (perm["resource_type"], perm["resource_pattern"]) == (
                    resource_type,
                    resource_id,
                ):
                    return int(perm["id"]), str(perm["permission"])
        return None

    def experiment_id(self, name: str, *, create: bool = True) -> str:
        """The id of experiment ``name``, created (owned by the admin) if missing."""
        from mlflow.exceptions import MlflowException

        try:
            got = self.call(GET_EXPERIMENT_BY_NAME, "GET", params={"experiment_name": name})
            return str(got["experiment"]["experiment_id"])
        except MlflowException as exc:
            if _error_code(exc) != "RESOURCE_DOES_NOT_EXIST" or not create:
                raise
        try:
            created = self.call(CREATE_EXPERIMENT, "POST", json={"name": name})
            log.info("created experiment '%s' (id %s)", name, created["experiment_id"])
            return str(created["experiment_id"])
        except MlflowException as exc:  # created concurrently
            if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                raise
        got = self.call(GET_EXPERIMENT_BY_NAME, "GET", params={"experiment_name": name})
        return str(got["experiment"]["experiment_id"])

    def ensure_registered_model(self, name: str) -> None:
        """Create registered model ``name`` (owned by the admin) if missing."""
        from mlflow.exceptions import MlflowException

        try:
            self.call(GET_REGISTERED_MODEL, "GET", params={"name": name})
            return
        except MlflowException as exc:
            if _error_code(exc) != "RESOURCE_DOES_NOT_EXIST":
                raise
        try:
            self.call(CREATE_REGISTERED_MODEL, "POST", json={"name": name})
            log.info("created registered model '%s'", name)
        except MlflowException as exc:
            if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                raise


def can_log_in(tracking_uri: str, creds: Credentials) -> bool:
    """Whether the server accepts ``creds`` (a 401 is ``False``; anything else raises)."""
    from mlflow.exceptions import MlflowException

    try:
        _call(tracking_uri.rstrip("/"), creds, GET_CURRENT_USER, "GET", max_retries=0)
    except MlflowException as exc:
        if exc.get_http_status_code() == 401:
            return False
        raise
    return True


def check_password(creds: Credentials) -> None:
    if len(creds.password) < MIN_PASSWORD_LENGTH:
        raise StepError(
            f"password of MLflow user '{creds.username}' ({creds.source}) is shorter than "
            f"{MIN_PASSWORD_LENGTH} characters; the server refuses it"
        )


def ensure_user(admin: AuthAdmin, creds: Credentials) -> str:
    """Create ``creds.username`` with ``creds.password``, or set that password on an existing
    user whose login fails with it. Returns ``created``, ``password updated`` or ``unchanged``."""
    from mlflow.exceptions import MlflowException

    if creds.username == admin.admin.username:
        raise StepError(
            f"user '{creds.username}' ({creds.source}) is the admin user itself; the pipeline "
            "and deploy users must be separate accounts"
        )
    check_password(creds)
    if admin.user_id(creds.username) is None:
        try:
            admin.call(
                CREATE_USER, "POST", json={"username": creds.username, "password": creds.password}
            )
            log.info("MLflow user '%s': created", creds.username)
            return "created"
        except MlflowException as exc:  # created concurrently: fall through to the update
            if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                raise StepError(
                    f"creating MLflow user '{creds.username}' failed: HTTP "
                    f"{exc.get_http_status_code()} {_error_code(exc)}"
                ) from None  # the server's message may quote the request
    if can_log_in(admin.tracking_uri, creds):
        log.info("MLflow user '%s': exists, password unchanged", creds.username)
        return "unchanged"
    try:
        admin.call(
            UPDATE_USER_PASSWORD,
            "PATCH",
            json={"username": creds.username, "password": creds.password},
        )
    except MlflowException as exc:
        raise StepError(
            f"setting the password of MLflow user '{creds.username}' failed: HTTP "
            f"{exc.get_http_status_code()} {_error_code(exc)}"
        ) from None
    log.info("MLflow user '%s': exists, password updated", creds.username)
    return "password updated"


def grant(
    admin: AuthAdmin, username: str, resource_type: str, resource_id: str, permission: str
) -> str:
    """Give ``username`` exactly ``permission`` on one resource (its own grant; a grant of
    another level is changed in place). Returns ``granted``, ``updated`` or ``unchanged``."""
    from mlflow.exceptions import MlflowException

    if permission not in PERMISSIONS:
        raise StepError(f"permission {permission!r}: expected one of {', '.join(PERMISSIONS)}")
    current = admin.explicit_grant(username, resource_type, resource_id)
    if current is None:
        try:
            admin.call(
                GRANT_USER_PERMISSION,
                "POST",
                json={
                    "username": username,
                    "resource_type": resource_type,
                    "resource_id": resource_id,
                    "permission": permission,
                },
            )
            return "granted"
        except MlflowException as exc:
            if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                raise
        current = admin.explicit_grant(username, resource_type, resource_id)
        if current is None:
            raise StepError(
                f"granting {permission} on {resource_type} {resource_id!r} to '{username}': the "
                "server reports an existing grant that its user's roles do not list"
            )
    grant_id, have = current
    if have == permission:
        return "unchanged"
    admin.call(
        UPDATE_ROLE_PERMISSION,
        "PATCH",
        json={"role_permission_id": grant_id, "permission": permission},
    )
    return "updated"


def grant_experiment(
    admin: AuthAdmin, username: str, experiment: str, permission: str, *, create: bool = True
) -> str:
    """``grant`` on experiment ``experiment`` (a name; created if missing unless ``create``
    is false)."""
    experiment_id = admin.experiment_id(experiment, create=create)
    outcome = grant(admin, username, "experiment", experiment_id, permission)
    log.info(
        "%s %s on experiment '%s' (id %s): %s",
        username,
        permission,
        experiment,
        experiment_id,
        outcome,
    )
    return outcome


def grant_model(
    admin: AuthAdmin, username: str, model_name: str, permission: str, *, create: bool = True
) -> str:
    """``grant`` on registered model ``model_name`` (created if missing unless ``create`` is
    false)."""
    if create:
        admin.ensure_registered_model(model_name)
    outcome = grant(admin, username, "registered_model", model_name, permission)
    log.info("%s %s on registered model '%s': %s", username, permission, model_name, outcome)
    return outcome


# --------------------------------------------------------------------------- credentials


def _read_secret_file(path: Path, what: str) -> str:
    try:
        value = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise StepError(f"{what}: file {path} not found") from exc
    except OSError as exc:
        raise StepError(f"{what}: cannot read {path} ({exc.strerror or exc})") from exc
    value = value.rstrip("\r\n")  # `echo > file` and editors add one
    if not value:
        raise StepError(f"{what}: file {path} is empty")
    return value


def credentials_from(
    role: str,
    env_prefix: str,
    *,
    secret_dir: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Credentials:
    """A user's credentials from ``secret_dir`` (files ``username`` and ``password``, how
    Kubernetes mounts a Secret with those keys), else from ``{env_prefix}_USERNAME`` and
    ``{env_prefix}_PASSWORD`` or ``{env_prefix}_PASSWORD_FILE``."""
    env = os.environ if environ is None else environ
    if secret_dir is not None:
        directory = Path(secret_dir)
        if not directory.is_dir():
            raise StepError(f"{role} credentials: {directory} is not a directory")
        return Credentials(
            _read_secret_file(directory / "username", f"{role} username"),
            _read_secret_file(directory / "password", f"{role} password"),
            source=str(directory),
        )
    user_var, pw_var = f"{env_prefix}_USERNAME", f"{env_prefix}_PASSWORD"
    file_var = f"{pw_var}_FILE"
    username = env.get(user_var, "").strip()
    if not username:
        raise StepError(
            f"{role} credentials: {user_var} is not set (or use --{role}-secret-dir DIR with "
            "files 'username' and 'password')"
        )
    if env.get(pw_var):
        return Credentials(username, env[pw_var], source=f"${pw_var}")
    if env.get(file_var):
        path = Path(env[file_var])
        return Credentials(
            username, _read_secret_file(path, f"{role} password"), source=f"${file_var}={path}"
        )
    raise StepError(
        f"{role} credentials: neither {pw_var} nor {file_var} is set (or use "
        f"--{role}-secret-dir DIR with files 'username' and 'password')"
    )


def admin_from_auth_config(path: str | Path) -> Credentials:
    """The bootstrap admin of the server's auth config ini (``[mlflow] admin_username`` and
    ``admin_password``), the file ``MLFLOW_AUTH_CONFIG_PATH`` names on the server."""
    path = Path(path)
    config = configparser.ConfigParser(interpolation=None)
    try:
        with path.open(encoding="utf-8") as fh:
            config.read_file(fh)
    except FileNotFoundError as exc:
        raise StepError(f"auth config {path} not found") from exc
    except (OSError, configparser.Error) as exc:
        raise StepError(f"auth config {path}: cannot be read as an ini file") from exc
    section = config["mlflow"] if config.has_section("mlflow") else {}
    missing = [k for k in ("admin_username", "admin_password") if not section.get(k)]
    if missing:
        raise StepError(f"auth config {path}: [mlflow] {' and '.join(missing)} missing or empty")
    return Credentials(section["admin_username"], section["admin_password"], source=str(path))


def wait_for_server(tracking_uri: str, timeout_s: float) -> None:
    """Wait (bounded) until ``/health`` answers 200; a Job may start before the server."""
    deadline = time.monotonic() + timeout_s
    url = tracking_uri.rstrip("/") + "/health"
    delay = 0.5
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - http(s) only
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() + delay > deadline:
            raise StepError(
                f"MLflow server {redact_uri(tracking_uri)} did not answer /health within "
                f"{timeout_s:.0f} s"
            )
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


# --------------------------------------------------------------------------- CLI


def _defaults_from_params(params_file: str) -> tuple[str, str]:
    """``track.experiment`` and the registered model name of ``params_file`` (without
    importing the task, so no Paddle import)."""

    all_params = load_params(params_file)
    track = all_params.get("track") or {}
    experiment = str(track.get("experiment") or "")
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


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops mlflow-users``: create/update the pipeline and deploy users and their
    grants on an MLflow server running ``--app-name basic-auth`` (run with admin rights)."""
    import argparse
    import sys

    from mlflow.exceptions import MlflowException

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
    args = parser.parse_args(argv)

    def _go() -> None:
        uri = args.tracking_uri or tracking_uri()
        if args.experiment and args.model_name:
            experiment, model = args.experiment, args.model_name
        else:
            default_experiment, default_model = _defaults_from_params(args.params)
            experiment = args.experiment or default_experiment
            model = args.model_name or default_model
        if args.admin_auth_config and args.admin_secret_dir:
            raise StepError("give --admin-auth-config or --admin-secret-dir, not both")
        admin_creds = (
            admin_from_auth_config(args.admin_auth_config)
            if args.admin_auth_config
            else credentials_from("admin", "MLFLOW_ADMIN", secret_dir=args.admin_secret_dir)
        )
        pipeline = credentials_from(
            "pipeline", "MLFLOW_PIPELINE", secret_dir=args.pipeline_secret_dir
        )
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

        admin = AuthAdmin(uri, admin_creds)
        log.info(
            "MLflow server %s: users for experiment '%s' and model '%s' (admin '%s')",
            redact_uri(uri),
            experiment,
            model,
            admin_creds.username,
        )
        wait_for_server(admin.tracking_uri, args.wait_s)
        plan = [("pipeline", pipeline, PIPELINE_PERMISSION)]
        if deploy is not None:
            plan.append(("deploy", deploy, DEPLOY_PERMISSION))
        summary: dict[str, Any] = {"tracking_uri": redact_uri(uri), "users": {}}
        try:
            admin.check_admin()
            for role, creds, permission in plan:
                summary["users"][role] = {
                    "username": creds.username,
                    "user": ensure_user(admin, creds),
                    "permission": permission,
                    "experiment": experiment,
                    "experiment_grant": grant_experiment(
                        admin, creds.username, experiment, permission
                    ),
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
        sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")

    return run_cli(_go)
