"""Users and permissions of an MLflow server that runs ``mlflow server --app-name basic-auth``.

Library layer (imports no step). An admin session (:class:`AuthAdmin`) talks to the server
through MLflow's own ``AuthServiceClient`` with explicit credentials (never the process-wide
``MLFLOW_TRACKING_*`` variables), and every operation is idempotent, so the ``mlflow-users``
Job can run again after a password rotation or a partial failure:

- :func:`ensure_user` creates a user, or sets its password if the user exists and the password
  does not already work;
- :func:`grant_experiment` / :func:`grant_model` give a user exactly one permission on an
  experiment (by name) or a registered model, creating the experiment or model (as the admin)
  when it does not exist yet, and updating an existing grant of another level.

``paddle-mlops mlflow-users`` (``components.commands.mlflow_users``) makes the two accounts the
cluster uses: the **pipeline** user (``EDIT`` on the experiment and the registered model:
runs, artifacts, new versions, tags, aliases; it creates and deletes the promotion lock model
itself, as its creator) and the read-only **deploy** user (``READ`` on the registered model,
and on the experiment because a version's files are its run's artifacts). Passwords come only
from environment variables or files (mounted Secrets), never from the command line, and are
never logged.
"""

from __future__ import annotations

import configparser
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError
from components.core.retry import SYSTEM_CLOCK, BackoffParams, Clock, poll
from components.core.uris import redact_uri
from components.tracking.mlflow_client import health_default

log = logging.getLogger(__name__)

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


def auth_client(tracking_uri: str, creds: Credentials | None, *, max_retries: int | None = None):
    """MLflow's ``AuthServiceClient`` on ``tracking_uri`` signed in as ``creds`` (explicit:
    MLflow's own reads ``MLFLOW_TRACKING_USERNAME``/``_PASSWORD`` at each request), with
    ``current_user()`` (``GET /users/current``, which it lacks). ``max_retries``: MLflow's HTTP
    retries of each request (None: MLflow's setting). A non-200 answer raises
    ``MlflowException`` (status and error code kept: ``exc.get_http_status_code()``,
    ``exc.error_code``)."""
    from mlflow.server.auth.client import AuthServiceClient
    from mlflow.server.auth.routes import GET_CURRENT_USER
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    class _Client(AuthServiceClient):
        def _request(
            self, endpoint: str, method: str, *, expected_status: int = 200, **kwargs: Any
        ) -> dict[str, Any]:
            if max_retries is not None:
                kwargs.setdefault("max_retries", max_retries)
            host = _host_creds(self.tracking_uri, creds)
            resp = verify_rest_response(
                http_request(host, endpoint, method, **kwargs),
                endpoint,
                expected_status=expected_status,
            )
            return resp.json() if resp.status_code != 204 and resp.content else {}

        def current_user(self) -> dict[str, Any]:
            return self._request(GET_CURRENT_USER, "GET").get("user", {})

    return _Client(tracking_uri)


def _error_code(exc: BaseException) -> str | None:
    return getattr(exc, "error_code", None)


class AuthAdmin:
    """An admin session against one tracking server (explicit credentials): MLflow's auth
    client (:func:`auth_client`) for users and grants, its REST stores for the experiment and
    the registered model a grant names."""

    def __init__(self, tracking_uri: str, admin: Credentials):
        if not tracking_uri.startswith(("http://", "https://")):
            raise StepError(
                f"tracking URI {redact_uri(tracking_uri)!r}: users and permissions exist only on "
                "an MLflow server (http:// or https://) running --app-name basic-auth"
            )
        from mlflow.store.model_registry.rest_store import RestStore as RegistryStore
        from mlflow.store.tracking.rest_store import RestStore as TrackingStore

        self.tracking_uri = tracking_uri.rstrip("/")
        self.admin = admin
        self.client = auth_client(self.tracking_uri, admin)

        def host() -> Any:
            return _host_creds(self.tracking_uri, admin)

        self.tracking = TrackingStore(host)
        self.registry = RegistryStore(host)

    def check_admin(self) -> None:
        """Fail with a readable message unless the admin credentials work and are an admin's."""
        from mlflow.exceptions import MlflowException
        from mlflow.server.auth.routes import GET_CURRENT_USER

        try:
            user = auth_client(self.tracking_uri, self.admin, max_retries=0).current_user()
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
            return int(self.client.get_user(username).id)
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
        for role in self.client.list_user_roles(username):
            if role.name != f"__user_{uid}__":
                continue
            for perm in role.permissions:
                if (perm.resource_type, perm.resource_pattern) == (resource_type, resource_id):
                    return int(perm.id), str(perm.permission)
        return None

    def experiment_id(self, name: str, *, create: bool = True) -> str:
        """The id of experiment ``name``, created (owned by the admin) if missing."""
        from mlflow.exceptions import MlflowException

        found = self.tracking.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        if not create:
            raise StepError(f"MLflow experiment '{name}' does not exist")
        try:
            created = self.tracking.create_experiment(name)
            log.info("created experiment '%s' (id %s)", name, created)
            return str(created)
        except MlflowException as exc:  # created concurrently
            if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                raise
        return str(self.tracking.get_experiment_by_name(name).experiment_id)

    def ensure_registered_model(self, name: str) -> None:
        """Create registered model ``name`` (owned by the admin) if missing."""
        from mlflow.exceptions import MlflowException

        try:
            self.registry.get_registered_model(name)
            return
        except MlflowException as exc:
            if _error_code(exc) != "RESOURCE_DOES_NOT_EXIST":
                raise
        try:
            self.registry.create_registered_model(name)
            log.info("created registered model '%s'", name)
        except MlflowException as exc:
            if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                raise


def can_log_in(tracking_uri: str, creds: Credentials) -> bool:
    """Whether the server accepts ``creds`` (a 401 is ``False``; anything else raises)."""
    from mlflow.exceptions import MlflowException

    try:
        auth_client(tracking_uri.rstrip("/"), creds, max_retries=0).current_user()
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
            admin.client.create_user(creds.username, creds.password)
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
        admin.client.update_user_password(creds.username, creds.password)
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
            admin.client.grant_user_permission(username, resource_type, resource_id, permission)
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
    admin.client.update_role_permission(grant_id, permission)
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


def wait_for_server(
    tracking_uri: str,
    timeout_s: float,
    clock: Clock = SYSTEM_CLOCK,
    *,
    health: BackoffParams | None = None,
) -> None:
    """Wait (bounded) until ``/health`` answers 200; a Job may start before the server.
    Asks again after ``health``'s waits (``registry.health_backoff``, default: its default),
    at most ``timeout_s`` in all."""
    url = tracking_uri.rstrip("/") + "/health"

    def _healthy() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - http(s) only
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    backoff = (health or health_default()).backoff(deadline_s=timeout_s)
    if not poll(_healthy, backoff, clock=clock):
        raise StepError(
            f"MLflow server {redact_uri(tracking_uri)} did not answer /health within "
            f"{timeout_s:.0f} s"
        )
