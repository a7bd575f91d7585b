"""The command line's conventions (issue 39): it runs without the venv activated, says
``--version``, suggests the command meant, prints no Paddle ccache warning; the commands that
talk to MLflow never create a database, name the tracking URI they used, and give up on a
dead server after their configured retries with one line.

Real parts: the system's ``/usr/bin/python3`` (no project dependencies) handing over to a
venv, Paddle, a real SQLite MLflow store, a port nobody listens on. The retry test injects
the clock (``time.sleep`` records instead of waiting) and counts the connection attempts.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from components.core.ports import free_port
from components.kernel import cli
from tests.conftest import REPO

SYSTEM_PYTHON = Path("/usr/bin/python3")


@pytest.fixture(autouse=True)
def process_state():
    """What a command run in-process (``main([...])``) sets for its process: the root
    logger's handlers (on this test's captured stderr) and the SIGTERM handler, put back."""
    handlers, level = logging.root.handlers[:], logging.root.level
    sigterm = signal.getsignal(signal.SIGTERM)
    yield
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)
    signal.signal(signal.SIGTERM, sigterm)


def run(*args: str, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    # the defaults are under test: no tracking URI, no retry settings (an in-process test
    # of another module on this worker may have exported its own)
    full = {
        k: v
        for k, v in os.environ.items()
        if k != "MLFLOW_TRACKING_URI" and not k.startswith("MLFLOW_HTTP_REQUEST_")
    }
    full["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "components", *args],
        cwd=cwd,
        env={**full, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# --------------------------------------------------------------------------- the venv


def bare_python_env() -> dict[str, str]:
    """What a shell without the venv activated has: the system's PATH, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return env | {"PATH": "/usr/local/bin:/usr/bin:/bin"}


@pytest.fixture(scope="module")
def system_python() -> Path:
    if not SYSTEM_PYTHON.is_file():
        pytest.skip("no /usr/bin/python3 on this machine")
    probe = "import importlib.util as u; print(all(u.find_spec(m) for m in ('paddle', 'mlflow')))"
    has = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", probe], capture_output=True, text=True, env=bare_python_env()
    ).stdout.strip()
    if has != "False":
        pytest.skip("/usr/bin/python3 has the project's dependencies: nothing to hand over")
    return SYSTEM_PYTHON


def checkout(root: Path, venv: bool) -> Path:
    """The project's code in ``root`` (a copy: the hand-over finds the venv next to the
    code), with ``.venv`` this test run's venv when ``venv``."""
    root.mkdir()
    shutil.copytree(
        REPO / "components", root / "components", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    if venv:
        if sys.prefix == sys.base_prefix:
            pytest.skip("the tests do not run in a venv")
        (root / ".venv").symlink_to(sys.prefix)
    return root


def test_the_system_python_hands_over_to_the_repositorys_venv(system_python, tmp_path):
    repo = checkout(tmp_path / "repo", venv=True)
    proc = subprocess.run(
        [str(system_python), "-m", "components", "--version"],
        cwd=repo, env=bare_python_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # the copy's code ran, under the venv's interpreter (its version, not the system's)
    venv_python = ".".join(map(str, sys.version_info[:3]))
    assert f"({repo / 'components'}, Python {venv_python})" in proc.stdout


def test_a_dvc_stage_command_runs_without_the_venv_on_path(system_python, tmp_path):
    """dvc.yaml's commands as ``.venv/bin/dvc repro`` runs them: ``sh -c CMD`` with the
    venv's bin not on PATH (``--help``: the hand-over, not the step, is under test)."""
    repo = checkout(tmp_path / "repo", venv=True)
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    cmd = stages["validate"]["cmd"]
    assert cmd.startswith("python3 -m components validate ")
    proc = subprocess.run(
        ["/bin/sh", "-c", f"{cmd} --help"],
        cwd=repo, env=bare_python_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: paddle-mlops validate")


def test_without_a_venv_it_says_make_install_in_one_line(system_python, tmp_path):
    repo = checkout(tmp_path / "repo", venv=False)
    proc = subprocess.run(
        [str(system_python), "-m", "components", "train"],
        cwd=repo, env=bare_python_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    from components.__main__ import NO_DEPENDENCIES

    assert proc.returncode == NO_DEPENDENCIES
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "run `make install`" in lines[0] and str(repo / ".venv") in lines[0]
    assert "cannot import paddle" in lines[0]


# --------------------------------------------------------------------------- conventions


def test_version_names_the_release_and_where_it_runs_from():
    import tomllib

    number = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    proc = run("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"paddle-mlops {number} ({REPO / 'components'}, Python 3.")


def test_an_unknown_command_suggests_the_closest_one(capsys):
    assert cli.main(["trian"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "paddle-mlops: error: invalid choice 'trian' (did you mean 'train'?); "
        "paddle-mlops --help lists them"
    ]
    assert cli.main(["fetch-modle"]) == 2
    assert "(did you mean 'fetch-model'?)" in capsys.readouterr().err
    assert cli.main(["frobnicate"]) == 2  # nothing close: every choice
    err = capsys.readouterr().err
    assert "invalid choice 'frobnicate' (choose from: ingest, validate, hpo, train" in err
    assert "verify" in err and len(err.splitlines()) == 1


def test_an_unknown_subcommand_suggests_the_closest_one(capsys):
    from components.commands import registry as registry_cli

    with pytest.raises(SystemExit) as exc:
        registry_cli.main(["stauts"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith("invalid choice 'stauts' (did you mean 'status'?)")


def test_help_lists_every_step_and_command(capsys):
    from components.kernel.step import AFTER_DEPLOY, STEPS

    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in (*STEPS, *AFTER_DEPLOY, *cli.COMMANDS, "--version"):
        assert name in out
    assert cli.main([]) == 2  # no command: the same text, on stderr, as a usage error
    assert "pipeline steps" in capsys.readouterr().err


def test_no_ccache_warning_on_a_command_that_imports_paddle():
    if shutil.which("ccache"):
        pytest.skip("ccache is installed: Paddle has nothing to warn about")
    bare = subprocess.run(
        [sys.executable, "-c", "import paddle"], capture_output=True, text=True, timeout=300
    )
    assert "No ccache found" in bare.stderr  # what every command printed
    proc = run("train", "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: paddle-mlops train")
    assert "ccache" not in proc.stderr, proc.stderr
    # only that warning: another of Paddle's, at import, still reaches the user
    probe = "import warnings, components.kernel.cli; warnings.warn('something else', UserWarning)"
    other = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert "UserWarning: something else" in other.stderr


# --------------------------------------------------------------------------- MLflow


def test_commands_run_in_an_empty_directory_create_no_database_and_name_the_uri(tmp_path):
    params = str(REPO / "params.yaml")
    for command in (
        ("verify", "models:/digits-classifier/1"),
        ("fetch-model", "models:/digits-classifier@champion", str(tmp_path / "model")),
        ("registry", "--params", params, "--model-name", "digits-classifier", "status"),
    ):
        proc = run(*command, cwd=tmp_path)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert list(tmp_path.iterdir()) == [], command  # no mlflow.db, no model
        (line,) = errors(proc.stderr)
        assert "tracking URI sqlite:///mlflow.db (the default" in line, line
        assert f"{tmp_path / 'mlflow.db'} does not exist" in line
        assert "nothing was created" in line


def test_an_answer_about_a_store_names_its_uri(tmp_path):
    """A real store without the model: "not in the registry" says which registry."""
    from components.tracking.registry import client

    client(f"sqlite:///{tmp_path / 'mlflow.db'}").search_registered_models()  # creates it
    proc = run("verify", "models:/nope/1", cwd=tmp_path)
    assert proc.returncode == 1
    (line,) = errors(proc.stderr)
    assert "models:/nope/1: not in the registry" in line
    assert line.endswith("[tracking URI sqlite:///mlflow.db]")


@pytest.fixture
def clean_retry_env(monkeypatch):
    """MLflow's retry variables unset now and restored after (the commands set them)."""
    from components.commands.connection import JITTER_ENV, RETRY_ENV

    for var in (*RETRY_ENV.values(), JITTER_ENV):
        monkeypatch.setenv(var, "0")  # recorded, so the teardown puts back what was there
        monkeypatch.delenv(var)


@pytest.fixture
def attempts(monkeypatch) -> dict[str, list]:
    """The clock injected (``time.sleep`` records what urllib3 would wait) and the
    connection attempts counted (the real connect still runs)."""
    import urllib3.connection

    seen: dict[str, list] = {"slept": [], "connects": []}
    monkeypatch.setattr(time, "sleep", seen["slept"].append)
    real = urllib3.connection.HTTPConnection.connect

    def connect(self):
        seen["connects"].append(self.port)
        return real(self)

    monkeypatch.setattr(urllib3.connection.HTTPConnection, "connect", connect)
    return seen


def test_a_dead_server_costs_the_configured_retries_and_backoff_then_one_line(
    clean_retry_env, attempts, capsys
):
    from components.commands import verify
    from components.commands.connection import CLI_RETRY, give_up_after_s

    port = free_port()
    assert (
        verify.main(["models:/digits-classifier/1", "--tracking-uri", f"http://127.0.0.1:{port}"])
        == 1
    )
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: MLflow tracking server http://127.0.0.1:{port} did not answer")
    assert f"after {CLI_RETRY.retries} retries" in line
    assert attempts["connects"] == [port] * (CLI_RETRY.retries + 1)
    # no wait before the first retry, backoff * 2^(k-1) s (+ up to 1 s jitter) before the k-th
    waits = [CLI_RETRY.backoff_s * 2 ** (k - 1) for k in range(2, CLI_RETRY.retries + 1)]
    assert len(attempts["slept"]) == len(waits)
    assert all(w <= s <= w + 1.0 for s, w in zip(attempts["slept"], waits, strict=True))
    # the whole wait, bounded by configuration (not measured): well inside 15 s
    assert sum(attempts["slept"]) <= give_up_after_s(CLI_RETRY) <= 10


def test_the_retries_come_from_the_flag_else_mlflows_variable(
    clean_retry_env, attempts, monkeypatch, capsys, tmp_path
):
    from components.commands import fetch_model

    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "4")
    uri = "models:/digits-classifier/1"
    argv = [uri, str(tmp_path / "m"), "--tracking-uri", dead]
    assert fetch_model.main([*argv, "--tracking-retries", "1"]) == 1
    assert len(attempts["connects"]) == 2 and attempts["slept"] == []
    assert "after 1 retries" in capsys.readouterr().err
    attempts["connects"].clear()
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "4")  # the command set it to 1
    assert fetch_model.main(argv) == 1  # the variable (a pod's mlflow-client-env)
    assert len(attempts["connects"]) == 5
    assert "after 4 retries" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse: not a whole number
        fetch_model.main([*argv, "--tracking-retries", "x"])
    assert exc.value.code == 2
    assert not (tmp_path / "m").exists()


def test_the_registry_command_never_takes_a_dead_server_for_a_missing_model(
    clean_retry_env, attempts, capsys
):
    from components.commands import registry as registry_cli

    dead = f"http://127.0.0.1:{free_port()}"
    argv = ["--params", str(REPO / "params.yaml"), "--model-name", "digits-classifier"]
    assert (
        registry_cli.main([*argv, "--tracking-uri", dead, "--tracking-retries", "0", "status"]) == 1
    )
    (line,) = capsys.readouterr().err.splitlines()
    assert f"MLflow tracking server {dead} did not answer after 0 retries" in line
    assert "no registered model" not in line


def test_the_cli_gives_up_on_a_dead_server_with_one_line(tmp_path):
    """End to end with the default settings (real waits): one line naming the server; the
    timeout is a generous outer bound, not the measure (that is the test above)."""
    dead = f"http://127.0.0.1:{free_port()}"
    env = {"MLFLOW_TRACKING_URI": dead}
    proc = run("verify", "models:/digits-classifier@champion", cwd=tmp_path, env=env)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == errors(proc.stderr), proc.stderr  # nothing else
    (line,) = errors(proc.stderr)
    assert f"MLflow tracking server {dead} did not answer after 3 retries" in line
    assert list(tmp_path.iterdir()) == []
