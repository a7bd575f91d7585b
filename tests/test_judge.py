"""The judge: a challenger beside the champion, promoted or rolled back on live evidence.

The verdict function on evidence built to the point (service levels first, then the paired
gates with labels, agreement without), then the step's CLI on a real server's log, acting on
that server.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import yaml

from components.ml.decisions.gates import PairedLimits
from components.ml.decisions.judging import Evidence, JudgeLimits, judge
from components.ml.serving.server import RunningServer
from tests.conftest import REPO, fp32_bundle, run_module, untrained_export
from tests.test_prediction_log import _infer, _post

NAME = "digits"
LIMITS = JudgeLimits(
    min_pairs=100, min_labelled=100, min_agreement=0.95, max_error_rate=0.01,
    max_p99_latency_ms=100.0, slo_min_requests=20,
)  # fmt: skip
PAIRED = PairedLimits(alpha=0.1, max_drop=0.0, max_class_drop=2.0, min_class_flips=3)
CLASSES = [str(i) for i in range(10)]


def _evidence(n: int, wrong: float, labelled: bool, seed: int = 0) -> Evidence:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    champion = y.copy()
    challenger = np.where(rng.random(n) < wrong, (y + 1) % 10, y)
    return Evidence(
        champion.tolist(), challenger.tolist(), y.tolist() if labelled else [None] * n,
        challenger_requests=n, challenger_latency_us=[2000] * n,
    )  # fmt: skip


def test_a_service_level_breach_rolls_back_before_any_statistics():
    ev = _evidence(5, 0.0, labelled=False)  # far too few pairs for a verdict...
    ev.challenger_requests, ev.challenger_errors = 25, 3  # ...but 12 % of answers failed
    j = judge(ev, LIMITS, PAIRED, CLASSES)
    assert j.action == "rollback" and "error rate 0.120" in j.reasons[0]
    ev = _evidence(5, 0.0, labelled=False)
    ev.challenger_requests, ev.challenger_latency_us = 25, [2000] * 20 + [400_000] * 5
    j = judge(ev, LIMITS, PAIRED, CLASSES)
    assert j.action == "rollback" and "p99 latency" in j.reasons[0]


def test_labels_decide_by_the_blessing_rules():
    worse = judge(_evidence(400, 0.05, labelled=True), LIMITS, PAIRED, CLASSES)
    assert worse.action == "rollback" and "McNemar" in worse.reasons[0]
    same = judge(_evidence(400, 0.0, labelled=True), LIMITS, PAIRED, CLASSES)
    assert same.action == "promote" and same.evidence["labelled_pairs"] == 400


def test_without_labels_agreement_decides_and_too_little_evidence_waits():
    assert judge(_evidence(400, 0.01, False), LIMITS, PAIRED, CLASSES).action == "promote"
    assert judge(_evidence(400, 0.2, False), LIMITS, PAIRED, CLASSES).action == "rollback"
    wait = judge(_evidence(50, 0.2, False), LIMITS, PAIRED, CLASSES)
    assert wait.action == "wait" and "fewer than judge.min_pairs" in wait.reasons[0]


@pytest.fixture(scope="module")
def golden(digits_task, digits_data):
    return digits_task.read_split(digits_data, "test")


@pytest.mark.parametrize(("policy", "worse"), [("canary", True), ("shadow", False)])
def test_the_judge_acts_on_the_running_server(
    policy, worse, server_binary, exported, digits_task, digits_data, golden, tmp_path
):
    """A worse challenger (random weights) under canary is rolled back; an equal one (the
    champion's own model as v2) under shadow is promoted; labels fed back for every request."""
    v1 = fp32_bundle(exported, tmp_path / "v1")
    v2_export = untrained_export(tmp_path / "u", digits_task, digits_data, 5) if worse else exported
    v2 = fp32_bundle(v2_export, tmp_path / "v2")
    log_dir, labels = tmp_path / "log", tmp_path / "labels.jsonl"
    server = RunningServer(
        server_binary, v1, "fp32", NAME, tmp_path / "server.log",
        extra_args=[f"--prediction-log-dir={log_dir}", "--model-control=true"],
    )  # fmt: skip
    server.wait_ready(60)
    raw, y = golden
    (x,) = digits_task.preprocess(raw)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["judge"] |= {"min_pairs": 100, "min_labelled": 100}
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    try:
        status, _ = _post(server.port, f"/v2/repository/models/{NAME}/load", {"parameters": {
            "model_dir": str(v2), "version": "2", "role": "challenger", "policy": policy,
            "fraction": "0.5" if policy == "canary" else "1"}})  # fmt: skip
        assert status == 200
        with labels.open("w") as out:
            for start in range(0, 4 * 120, 4):
                rows = np.arange(start, start + 4) % len(x)
                rid = f"{policy}-{start}"
                _infer(server.port, x[rows], rid)
                out.write(json.dumps({"id": rid, "labels": y[rows].tolist()}) + "\n")
        time.sleep(0.2)
        proc = run_module(
            "components", "judge", "--params", str(params_file), "--log", str(log_dir),
            "--labels", str(labels), "--server", f"http://127.0.0.1:{server.port}",
            "--model-name", NAME, "--judgement", str(tmp_path / "judge"),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        doc = json.loads((tmp_path / "judge" / "judgement.json").read_text())
        assert (doc["champion"], doc["challenger"]) == ("1", "2")
        assert doc["evidence"]["labelled_pairs"] >= 100
        want = "rollback" if worse else "promote"
        assert doc["action"] == want, doc["reasons"]
        assert [ln for ln in proc.stderr.splitlines() if f"judge: {want.upper()}" in ln]
        served = {_infer(server.port, x[:4], f"after-{i}")[0] for i in range(10)}
        assert served == ({"1"} if worse else {"2"})
        status, index = _post(server.port, "/v2/repository/index", {"ready": True})
        assert [m["version"] for m in index] == (["1"] if worse else ["2"])
    finally:
        assert server.stop() == 0


def test_a_challenger_given_at_start_needs_no_model_control(
    server_binary, exported, digits_task, digits_data, golden, tmp_path
):
    """How a Kubernetes pod runs a canary (k8s/serving, deploy.challenger on a cluster): both
    versions from the command line, no repository API; its log judged as on podman."""
    v1 = fp32_bundle(exported, tmp_path / "v1")
    v2 = fp32_bundle(untrained_export(tmp_path / "u", digits_task, digits_data, 5), tmp_path / "v2")
    log_dir, labels = tmp_path / "log", tmp_path / "labels.jsonl"
    flags = [f"--challenger-model-dir={v2}", "--challenger-policy=canary",
             "--challenger-fraction=0.5"]  # fmt: skip
    bad = RunningServer(server_binary, v1, "fp32", NAME, tmp_path / "bad.log", extra_args=flags)
    assert bad.proc.wait(60) == 1  # no --challenger-version: refused, readably
    bad.stop()
    assert "--challenger-model-dir needs --challenger-version" in (tmp_path / "bad.log").read_text()
    server = RunningServer(
        server_binary, v1, "fp32", NAME, tmp_path / "server.log",
        extra_args=[f"--prediction-log-dir={log_dir}", *flags, "--challenger-version=2"],
    )  # fmt: skip
    server.wait_ready(60)
    raw, y = golden
    (x,) = digits_task.preprocess(raw)
    try:
        deadline = time.monotonic() + 60
        while True:  # ready serves the champion; the challenger follows it
            status, index = _post(server.port, "/v2/repository/index", {"ready": True})
            if len(index) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [(m["version"], m["reason"]) for m in index] == [
            ("1", ""), ("2", "challenger (canary 0.500000)")
        ]  # fmt: skip
        status, _ = _post(server.port, f"/v2/repository/models/{NAME}/unload", {})
        assert status == 400  # and no model control: the API stays closed
        answered = []
        with labels.open("w") as out:
            for start in range(0, 4 * 120, 4):
                rows = np.arange(start, start + 4) % len(x)
                answered.append(_infer(server.port, x[rows], f"k-{start}")[0])
                out.write(json.dumps({"id": f"k-{start}", "labels": y[rows].tolist()}) + "\n")
        assert 30 <= answered.count("2") <= 90  # about half, Binomial(120, 0.5) +- 5.5 sigma
        time.sleep(0.2)
        params = yaml.safe_load((REPO / "params.yaml").read_text())
        params["judge"] |= {"min_pairs": 100, "min_labelled": 100}
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        proc = run_module(
            "components", "judge", "--params", str(tmp_path / "params.yaml"), "--log",
            str(log_dir), "--labels", str(labels), "--model-name", NAME,
            "--judgement", str(tmp_path / "judge"),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        doc = json.loads((tmp_path / "judge" / "judgement.json").read_text())
        assert (doc["action"], doc["champion"], doc["challenger"]) == ("rollback", "1", "2")
        assert doc["server"] == {}  # told no server: the verdict is for deploy to apply
    finally:
        assert server.stop() == 0
