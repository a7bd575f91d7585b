"""The MLflow registry behind authentication: a real ``mlflow server --app-name basic-auth`` on
127.0.0.1 (auth config in a temp ini, ``default_permission = NO_PERMISSIONS``, SQLite stores),
its users made by ``paddle-mlops mlflow-users`` run as a subprocess, and what each identity can
do to the ``champion`` alias: anonymous nothing, the pipeline user read and move it, the
deploy user only read it (and fetch the files). No password is in any argv or log."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from components.core.artifacts import StepError
from components.tracking import auth as mlflow_auth
from pipelines.containers import mlflow_server_process
from tests.conftest import REPO

EXPERIMENT = "auth-test"
MODEL = "digits-classifier"
CREDS_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")


def _password() -> str:
    return "pw-" + secrets.token_urlsafe(18)


@dataclass
class AuthServer:
    uri: str
    pid: int
    ini: Path
    log: Path
    admin: mlflow_auth.Credentials


def test_installed_mlflow_has_the_flags_the_manifests_use():
    """``--app-name basic-auth`` exists (mlflow[auth] installed), and ``--backend-store-uri``
    reads MLFLOW_BACKEND_STORE_URI, the variable k8s/mlflow sets from a Secret."""
    from mlflow.cli import cli

    params = {p.name: p for p in cli.commands["server"].params}
    assert "basic-auth" in params["app_name"].type.choices
    assert params["backend_store_uri"].envvar == "MLFLOW_BACKEND_STORE_URI"
    import flask_wtf  # noqa: F401 - the auth app's extra (mlflow[auth])


def test_the_auth_client_override_matches_the_installed_mlflow():
    """``auth.auth_client`` is MLflow's ``AuthServiceClient`` with ``_request`` overridden (the
    admin's explicit credentials instead of ``MLFLOW_TRACKING_*``): the installed MLflow still
    sends every call through ``_request`` with that signature, and has the methods we use."""
    import inspect

    from mlflow.server.auth import routes
    from mlflow.server.auth.client import AuthServiceClient

    params = inspect.signature(AuthServiceClient._request).parameters
    assert list(params)[:3] == ["self", "endpoint", "method"], params
    assert params["expected_status"].kind is inspect.Parameter.KEYWORD_ONLY
    used = (
        "create_user",
        "get_user",
        "update_user_password",
        "grant_user_permission",
        "list_user_roles",
        "update_role_permission",
    )
    for name in used:
        assert "self._request(" in inspect.getsource(getattr(AuthServiceClient, name)), name
    client = mlflow_auth.auth_client("http://127.0.0.1:9", None)
    assert isinstance(client, AuthServiceClient) and hasattr(client, "current_user")
    assert routes.GET_CURRENT_USER == "/api/2.0/mlflow/users/current"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    root = tmp_path_factory.mktemp("mlflow-auth")
    admin = mlflow_auth.Credentials("admin", _password(), source="test ini")
    ini = root / "basic_auth.ini"
    ini.write_text(
        "[mlflow]\n"
        "default_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{root / 'auth.db'}\n"
        f"admin_username = {admin.username}\n"
        f"admin_password = {admin.password}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    ini.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k not in CREDS_ENV}
    env.update(
        MLFLOW_AUTH_CONFIG_PATH=str(ini),
        MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(16),
        MLFLOW_DISABLE_TELEMETRY="true",
    )
    # the backend store URI from the environment, not argv (as in k8s/mlflow)
    with mlflow_server_process(root, app_name="basic-auth", env=env) as (uri, proc):
        yield AuthServer(uri, proc.pid, ini, root / "mlflow-server.log", admin)


@contextlib.contextmanager
def as_user(creds: mlflow_auth.Credentials | None) -> Iterator[None]:
    """MLflow's clients read their credentials from the environment at each request."""
    saved = {k: os.environ.pop(k) for k in CREDS_ENV if k in os.environ}
    if creds is not None:
        os.environ["MLFLOW_TRACKING_USERNAME"] = creds.username
        os.environ["MLFLOW_TRACKING_PASSWORD"] = creds.password
    try:
        yield
    finally:
        for k in CREDS_ENV:
            os.environ.pop(k, None)
        os.environ.update(saved)


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _status(call) -> int:
    """The HTTP status of the MlflowException/RestException ``call`` raises."""
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as info:
        call()
    return info.value.get_http_status_code()


def _new_version(client, experiment_id: str, tmp: Path) -> str:
    """A run with a small artifact, registered as a new version of MODEL."""
    run = client.create_run(experiment_id)
    payload = tmp / f"model-{run.info.run_id}.txt"
    payload.write_text("not a real model, just files to fetch\n")
    client.log_artifact(run.info.run_id, str(payload), "model")
    client.set_terminated(run.info.run_id)
    mv = client.create_model_version(MODEL, f"runs:/{run.info.run_id}/model", run.info.run_id)
    return str(mv.version)


def _argv_of_tree(pid: int) -> list[str]:
    proc = psutil.Process(pid)
    return [" ".join(p.cmdline()) for p in [proc, *proc.children(recursive=True)]]


def test_registry_requires_authentication_and_grants(
    auth_server: AuthServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import mlflow

    from components.tracking.registry import (
        CHAMPION,
        LINEAGE_TAGS,
        PREVIOUS,
        Registry,
        RegistryParams,
    )

    uri, admin = auth_server.uri, auth_server.admin
    # nothing may fall back to ./mlflow.db (the working tree's own registry)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)
    pipeline = mlflow_auth.Credentials("pipeline", _password())
    deploy = mlflow_auth.Credentials("deploy", _password())
    passwords = (admin.password, pipeline.password, deploy.password)

    # the users, as the k8s Job makes them: admin from the server's ini, the pipeline user
    # from a mounted Secret (files), the deploy user from environment variables
    secret_dir = tmp_path / "mlflow-auth"
    secret_dir.mkdir(mode=0o700)
    (secret_dir / "username").write_text(pipeline.username)
    (secret_dir / "password").write_text(pipeline.password + "\n")
    cmd = [
        sys.executable,
        "-m",
        "components",
        "mlflow-users",
        "--tracking-uri",
        uri,
        "--experiment",
        EXPERIMENT,
        "--model-name",
        MODEL,
        "--admin-auth-config",
        str(auth_server.ini),
        "--pipeline-secret-dir",
        str(secret_dir),
        "--wait-s",
        "30",
    ]
    env = {k: v for k, v in os.environ.items() if k not in CREDS_ENV}
    env.update(
        LOG_LEVEL="DEBUG",
        MLFLOW_DEPLOY_USERNAME=deploy.username,
        MLFLOW_DEPLOY_PASSWORD=deploy.password,
        MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
    )
    results = []
    for _ in range(2):  # the second run changes nothing
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        with contextlib.suppress(psutil.NoSuchProcess):
            live_argv = " ".join(psutil.Process(proc.pid).cmdline())
            assert not any(p in live_argv for p in passwords)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        for text in (out, err, " ".join(cmd)):
            assert not any(p in text for p in passwords), "a password leaked into argv or logs"
        results.append(out)
    assert '"user": "created"' in results[0] and '"granted"' in results[0]
    assert '"created"' not in results[1] and '"granted"' not in results[1]
    assert '"unchanged"' in results[1]

    # the admin registers a version and points champion at it
    with as_user(admin):
        client = _client(uri)
        experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
        v1 = _new_version(client, experiment_id, tmp_path)
        client.set_registered_model_alias(MODEL, CHAMPION, v1)

    # anonymous, or a wrong password: neither read nor move the alias
    for who in (None, mlflow_auth.Credentials("pipeline", "wrong-password-0000")):
        with as_user(who):
            client = _client(uri)
            assert _status(lambda c=client: c.get_model_version_by_alias(MODEL, CHAMPION)) == 401
            assert _status(lambda c=client: c.get_registered_model(MODEL)) == 401
            assert (
                _status(lambda c=client: c.set_registered_model_alias(MODEL, CHAMPION, v1)) == 401
            )

    # the pipeline user: logs a run, registers a version, promotes it through the registry
    # (promotion lock model, champion + previous-champion aliases, history tag)
    with as_user(pipeline):
        client = _client(uri)
        assert client.get_model_version_by_alias(MODEL, CHAMPION).version == v1
        v2 = _new_version(client, experiment_id, tmp_path)
        for tag in (*LINEAGE_TAGS, "blessed"):
            client.set_model_version_tag(MODEL, v2, tag, "true")
        Registry(client, MODEL, RegistryParams(lock_timeout_s=60)).promote(int(v2))
        assert client.get_model_version_by_alias(MODEL, CHAMPION).version == v2
        assert client.get_model_version_by_alias(MODEL, PREVIOUS).version == v1
        # but it administers nothing
        auth = mlflow_auth.AuthAdmin(uri, pipeline)
        with pytest.raises(StepError, match="not an admin"):
            auth.check_admin()

    # the deploy user: reads the alias and fetches the champion's files, moves nothing
    with as_user(deploy):
        client = _client(uri)
        assert client.get_model_version_by_alias(MODEL, CHAMPION).version == v2
        # as components.tracking.registry.download_version: the version's files are its run's
        # artifacts, so fetching them needs READ on the experiment too
        source = client.get_model_version_download_uri(MODEL, v2)
        fetched = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=source, dst_path=str(tmp_path / "fetched"), tracking_uri=uri
            )
        )
        assert [p.suffix for p in fetched.iterdir()] == [".txt"]
        assert _status(lambda: client.set_registered_model_alias(MODEL, CHAMPION, v1)) == 403
        assert _status(lambda: client.set_registered_model_tag(MODEL, "x", "y")) == 403
        assert _status(lambda: client.create_model_version(MODEL, "runs:/x/model")) == 403
        assert client.get_model_version_by_alias(MODEL, CHAMPION).version == v2

    # no password on any command line of the server (or its workers), nor in its log
    for argv in _argv_of_tree(auth_server.pid):
        assert not any(p in argv for p in passwords), argv
    log_text = auth_server.log.read_text()
    assert not any(p in log_text for p in passwords)


def test_grants_are_idempotent_and_change_in_place(auth_server: AuthServer):
    admin = mlflow_auth.AuthAdmin(auth_server.uri, auth_server.admin)
    admin.check_admin()
    user = mlflow_auth.Credentials("grants-user", _password())
    assert mlflow_auth.ensure_user(admin, user) == "created"
    assert mlflow_auth.ensure_user(admin, user) == "unchanged"
    rotated = mlflow_auth.Credentials(user.username, _password())
    assert mlflow_auth.ensure_user(admin, rotated) == "password updated"
    assert mlflow_auth.can_log_in(auth_server.uri, rotated)
    assert not mlflow_auth.can_log_in(auth_server.uri, user)

    model = "grants-model"
    assert mlflow_auth.grant_model(admin, user.username, model, "READ") == "granted"
    assert mlflow_auth.grant_model(admin, user.username, model, "READ") == "unchanged"
    assert mlflow_auth.grant_model(admin, user.username, model, "EDIT") == "updated"
    assert admin.explicit_grant(user.username, "registered_model", model)[1] == "EDIT"
    assert mlflow_auth.grant_experiment(admin, user.username, "grants-exp", "EDIT") == "granted"
    with pytest.raises(StepError, match="admin user itself"):
        mlflow_auth.ensure_user(admin, auth_server.admin)
    with pytest.raises(StepError, match="shorter than 12"):
        mlflow_auth.ensure_user(admin, mlflow_auth.Credentials("short", "tooshort"))

    wrong = mlflow_auth.AuthAdmin(
        auth_server.uri, mlflow_auth.Credentials("admin", "wrong-password-0000", source="x")
    )
    with pytest.raises(StepError, match="was refused"):
        wrong.check_admin()


def test_credentials_come_from_files_or_environment_only(tmp_path: Path):
    creds = mlflow_auth.credentials_from(
        "deploy",
        "MLFLOW_DEPLOY",
        environ={"MLFLOW_DEPLOY_USERNAME": "deploy", "MLFLOW_DEPLOY_PASSWORD": "p" * 12},
    )
    assert (creds.username, creds.password) == ("deploy", "p" * 12)
    assert "p" * 12 not in repr(creds)
    pw_file = tmp_path / "pw"
    pw_file.write_text("q" * 12 + "\n")
    creds = mlflow_auth.credentials_from(
        "deploy",
        "MLFLOW_DEPLOY",
        environ={"MLFLOW_DEPLOY_USERNAME": "deploy", "MLFLOW_DEPLOY_PASSWORD_FILE": str(pw_file)},
    )
    assert creds.password == "q" * 12
    with pytest.raises(StepError, match="MLFLOW_PIPELINE_USERNAME is not set"):
        mlflow_auth.credentials_from("pipeline", "MLFLOW_PIPELINE", environ={})
    with pytest.raises(StepError, match="neither MLFLOW_PIPELINE_PASSWORD nor"):
        mlflow_auth.credentials_from(
            "pipeline", "MLFLOW_PIPELINE", environ={"MLFLOW_PIPELINE_USERNAME": "p"}
        )
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    with pytest.raises(StepError, match="pipeline username: file .*/username not found"):
        mlflow_auth.credentials_from("pipeline", "MLFLOW_PIPELINE", secret_dir=secret_dir)
    (secret_dir / "username").write_text("pipeline\n")
    (secret_dir / "password").write_text("\n")
    with pytest.raises(StepError, match="pipeline password: file .*/password is empty"):
        mlflow_auth.credentials_from("pipeline", "MLFLOW_PIPELINE", secret_dir=secret_dir)
    ini = tmp_path / "basic_auth.ini"
    ini.write_text("[mlflow]\nadmin_username = admin\n")
    with pytest.raises(StepError, match="admin_password missing"):
        mlflow_auth.admin_from_auth_config(ini)
    with pytest.raises(StepError, match="basic-auth"):
        mlflow_auth.AuthAdmin("sqlite:///mlflow.db", creds)


def test_cli_names_what_is_missing_without_a_server():
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MLFLOW_ADMIN_", "MLFLOW_PIPELINE_", "MLFLOW_DEPLOY_"))
    }
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "components", "mlflow-users", "--tracking-uri",
             "http://127.0.0.1:9", "--experiment", "e", "--model-name", "m"],
            cwd=tmp, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    assert proc.returncode == 1
    assert "MLFLOW_ADMIN_USERNAME is not set" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_waiting_for_a_dead_server_backs_off_to_its_deadline():
    """``wait_for_server`` asks /health, waiting 0.5 s, doubling, at most 5 s, until the
    deadline (a fake clock: the refused connections are real, the waits are counted)."""
    from tests.test_retry import FakeClock

    fake = FakeClock()
    with pytest.raises(StepError, match=r"did not answer /health within 20 s"):
        mlflow_auth.wait_for_server("http://127.0.0.1:9", 20, clock=fake.clock())
    assert fake.waits == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 2.5]
