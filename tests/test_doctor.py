"""``paddle-mlops doctor``: one line per check, exit 1 when ``make run`` would fail; real
Paddle, OpenVINO, DVC and a real ``mlflow server`` on 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from components.core.ports import free_port
from tests.conftest import REPO, run_module


def doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "components", "doctor", *args],
        cwd=REPO,
        env={**full, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def lines(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        status, _, rest = line.partition("  ")
        name = rest.partition(":")[0].strip()
        if name:
            out[name] = status.strip()
    return out


def test_doctor_passes_on_this_machine_and_says_what_it_found(server_binary):
    proc = doctor("--server-binary", str(server_binary))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = lines(proc.stdout)
    for name in ("python", "paddle", "gpu", "amp", "openvino", "cpu isa", "mlflow", "server"):
        assert name in found, (name, proc.stdout)
    assert found["paddle"] == "ok" and "works well" in proc.stdout  # run_check's verdict
    assert found["server"] == "ok" and found["openvino"] == "ok"
    assert "FAIL" not in proc.stdout


def test_a_broken_server_binary_fails_with_a_line_naming_it(tmp_path):
    broken = tmp_path / "paddle-mlops-server"
    broken.write_text("#!/bin/sh\necho 'cannot open libopenvino.so' >&2\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    proc = doctor("--server-binary", str(broken))
    assert proc.returncode == 1, proc.stdout
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("FAIL  server:"))
    assert str(broken) in line and "exited 3" in line and "make serving" in line
    assert proc.stdout.rstrip().endswith("1 check(s) failed: server")


def test_tracking_server_reachable_or_not(tmp_path, server_binary):
    from pipelines.containers import mlflow_server

    (tmp_path / "mlflow").mkdir()
    with mlflow_server(tmp_path / "mlflow") as uri:
        proc = doctor("--server-binary", str(server_binary), env={"MLFLOW_TRACKING_URI": uri})
    assert proc.returncode == 0, proc.stdout
    assert lines(proc.stdout)["mlflow"] == "ok" and "answers /health" in proc.stdout

    dead = f"http://127.0.0.1:{free_port()}"
    proc = doctor("--server-binary", str(server_binary), env={"MLFLOW_TRACKING_URI": dead})
    assert proc.returncode == 1
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("FAIL  mlflow:"))
    assert dead in line and "make mlflow-server" in line


def test_json_lists_every_check(server_binary):
    proc = doctor("--json", "--server-binary", str(server_binary))
    assert proc.returncode == 0, proc.stderr
    checks = json.loads(proc.stdout)
    assert {c["status"] for c in checks} <= {"ok", "warn", "fail"}
    assert all(set(c) == {"name", "status", "finding", "advice"} for c in checks)
    assert [c["name"] for c in checks][:2] == ["python", "paddle"]


def test_doctor_is_no_stage_dependency():
    """A command: editing it reruns nothing (it is imported by name, never by a step)."""
    text = (REPO / "dvc.yaml").read_text()
    assert "components/doctor.py" not in text
    assert Path(REPO / "components" / "doctor.py").is_file()


def test_help():
    proc = run_module("components", "doctor", "--help", timeout=120)
    assert proc.returncode == 0 and "paddle-mlops doctor" in proc.stdout


def test_no_wrk_fails_before_the_serving_config_search_would(monkeypatch, tmp_path):
    from components.doctor import check_wrk

    assert check_wrk(60.0).status == "ok"  # CI and `make run` install it
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    missing = check_wrk(60.0)
    assert missing.status == "fail" and "wrk" in missing.finding
    assert "package.tune.budget_s: 0" in missing.advice
    assert check_wrk(0.0).status == "ok"  # no search, no need


def test_signing_keys_are_checked_before_a_release_needs_them(monkeypatch, tmp_path):
    """deploy to a target with no trusted keys fails (it would refuse every version); a push
    without a signing key warns (released unsigned); a laptop run (push off, target none)
    needs neither."""
    import pytest

    from components.core.artifacts import StepError
    from components.doctor import check_signing
    from components.tracking.signing import KEY_ENV, TRUST_ENV, generate

    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(TRUST_ENV, raising=False)
    assert check_signing(False, "none").status == "ok"
    refused = check_signing(False, "podman")
    assert refused.status == "fail" and TRUST_ENV in refused.finding
    private, public = generate(tmp_path / "k")
    monkeypatch.setenv(TRUST_ENV, str(public))
    unsigned = check_signing(True, "podman")
    assert unsigned.status == "warn" and KEY_ENV in unsigned.finding
    monkeypatch.setenv(KEY_ENV, str(private))
    assert check_signing(True, "kubernetes").status == "ok"
    monkeypatch.setenv(KEY_ENV, str(public))  # not a private key
    with pytest.raises(StepError, match="not a usable PEM private key"):
        check_signing(True, "podman")


def test_dvc_is_found_beside_the_interpreter_when_the_venv_is_not_on_path(monkeypatch, tmp_path):
    """``.venv/bin/paddle-mlops doctor`` without the venv activated: its dvc is in .venv/bin,
    next to the interpreter, not on PATH."""
    from components.doctor import check_dvc

    beside = Path(sys.executable).parent / "dvc"
    assert beside.is_file(), "the tests run in the venv that holds dvc"
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    if shutil.which("dvc"):
        pytest.skip("a dvc outside the venv is on the system PATH")
    found = check_dvc()
    assert found.name == "dvc remote" and found.status != "fail", found  # dvc ran
    # an interpreter with no dvc beside it, and none on PATH: the line says where it looked
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    missing = check_dvc()
    assert missing.status == "fail" and f"nor in {tmp_path / 'bin'}" in missing.finding, missing
