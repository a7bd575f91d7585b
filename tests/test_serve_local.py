"""``deploy.target: local`` (params.yaml's default) closes the loop of ``make run`` on a laptop:
``dvc repro`` returns while the built C++ server serves the verified champion; the summary's
curl answers; ``traffic`` fills the prediction log ``monitor`` judges; nothing is left to
reproduce; ``deploy stop`` leaves no process. Tiny params: the wiring is under test."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from components.core.ports import free_port
from tests.conftest import STAGES, TINY_DIGITS, clone_repo, ran, set_params, sh

CLI = (sys.executable, "-m", "components")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, server_binary: Path):
    repo = clone_repo(tmp_path_factory.mktemp("serve-local"))
    sh(repo, *CLI[:2], "components.steps.ingest", "materialize", "--out", "data/raw/digits")
    set_params(
        repo,
        **{
            **TINY_DIGITS,
            "deploy": {
                "target": "local",
                "local_port": free_port(),
                "local_grpc_port": free_port(),
            },
        },
        serving_image={"builder": "none", "golden_samples": 16, "latency_requests": 5},
    )
    try:
        yield repo
    finally:
        sh(repo, *CLI, "deploy", "stop", check=False)


def test_repro_returns_while_the_champion_is_served(repo):
    # sh() captures stdout/stderr: a server holding dvc's pipes would keep it waiting
    proc = sh(repo, "dvc", "repro")
    assert ran(proc) == list(STAGES)
    record = json.loads((repo / "outputs" / "deploy" / "deployment.json").read_text())
    assert record["deployed"] is True and record["target"] == "local"
    assert record["verified"]["verified"] is True  # signed provenance, the session's keys
    local = record["local"]
    assert local["method"] == "restart" and _alive(local["pid"])
    assert Path(local["pid_file"]).is_file() and Path(local["log_file"]).is_file()
    status = sh(repo, *CLI, "deploy", "status")
    assert f"v{record['version']} served at {local['url']}" in status.stderr


def test_the_summary_fits_and_its_curl_answers(repo):
    text = sh(repo, *CLI, "summary").stdout
    lines = text.splitlines()
    assert 5 <= len(lines) <= 25, text
    assert max(map(len, lines)) <= 120, text
    assert "missing" not in text, text
    for expected in ("digits", "int8:", "gates:", "make mlflow-ui", "data_docs/index.html"):
        assert expected in text, (expected, text)
    curl = next(line.strip() for line in lines if line.strip().startswith("curl "))
    answer = subprocess.run(shlex.split(curl), cwd=repo, capture_output=True, text=True)
    assert answer.returncode == 0, answer.stderr
    body = json.loads(answer.stdout)
    assert body["model_name"] == "digits-classifier", body
    (logits,) = body["outputs"]
    assert logits["shape"] == [1, 10] and len(logits["data"]) == 10


def test_traffic_feeds_the_monitor_and_nothing_is_left_to_reproduce(repo):
    sh(repo, *CLI, "traffic", "--samples", "120")
    labels = (repo / ".deploy" / "labels.jsonl").read_text().splitlines()
    assert len(labels) == 30  # 120 samples, 4 a request
    command = sh(repo, *CLI, "summary", "--monitor-command").stdout.strip()
    args = shlex.split(command)
    log, labels = ".deploy/predictions", ".deploy/labels.jsonl"
    assert args[1:] == ["monitor", "--log", log, "--labels", labels]
    sh(repo, *CLI, *args[1:])
    report = json.loads((repo / "outputs" / "monitor" / "monitor.json").read_text())
    assert report["window"]["items"] >= 120 and report["window"]["labelled"] == 120, report
    assert ran(sh(repo, "dvc", "repro")) == []
    assert "up to date" in sh(repo, "dvc", "status", "dvc.yaml").stdout


def test_stop_leaves_no_process_and_a_stale_pid_file_is_said(repo):
    record = json.loads((repo / "outputs" / "deploy" / "deployment.json").read_text())
    pid, pid_file = record["local"]["pid"], Path(record["local"]["pid_file"])
    sh(repo, *CLI, "deploy", "stop")
    assert not _alive(pid) and not pid_file.exists()
    # a pid file whose process is gone: removed, and said so
    gone = subprocess.Popen(["true"])
    gone.wait()
    state = {**json.loads(json.dumps(record["local"])), "pid": gone.pid}
    pid_file.write_text(
        json.dumps(
            {
                "pid": state["pid"], "port": 1, "model": "m", "version": 1, "model_dir": "x",
                "binary": state["binary"], "binary_sha256": "", "argv": [], "model_control": True,
            }
        )
    )  # fmt: skip
    status = sh(repo, *CLI, "deploy", "status", check=False)
    assert status.returncode == 3 and "stale pid file" in status.stderr, status.stderr
    assert not pid_file.exists()
    assert os.environ.get("PADDLE_MLOPS_TRUSTED_KEYS")  # what the pipeline verified against
