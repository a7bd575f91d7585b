"""The loop after deploy, closed end to end in containers, as a user runs it.

A fresh clone of the project, the real DVC CLI, a real ``mlflow server``, a local OCI registry
(``docker-registry``) and the podman-deployed C++ server:

1. ``dvc repro`` trains, blesses, pushes and deploys v1; test-split traffic is replayed with
   its labels fed back: ``paddle-mlops monitor`` stays quiet.
2. A week of shifted traffic (inverted digits) is served with its labels fed back, and
   ``paddle-mlops harvest`` writes the logged, labelled samples into ``data/raw`` (to train):
   the monitor alarms on shifted traffic, and its alarm (``monitor.on_alarm: dvc``) runs ``dvc
   repro``, the reason recorded.
3. That retraining's v2 is blessed and deployed as a shadow beside v1; ``paddle-mlops judge``
   promotes it on the labelled live traffic (server and registry).
4. A deliberately worse v3 (a retrain that lost the week's data: it passes the offline gate on
   the pinned holdout, which holds no inverted digit) goes out as a canary and is rolled back
   by the judge within a bounded number of requests.

Throughout, a background client keeps sending requests: none may fail. At the end the log holds
every request exactly once as answered, and every version's answer to it at most once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from components.core.artifacts import read_json
from components.ml.data.prediction_log import LogReader
from components.ml.serving.kserve_client import KServeClient
from components.steps.deploy import DeployParams
from components.steps.deploy import run as deploy_run
from components.tracking.registry import Registry, RegistryParams
from components.tracking.registry import client as mlflow_client
from pipelines.containers import free_port, mlflow_server
from tests.conftest import (
    BIN,
    STAGES,
    TINY_DIGITS,
    WIRING_LATENCY_BUDGET,
    clone_repo,
    ran,
    set_params,
)

NAME = "closed-loop-digits"
INPUT_RATE = 0.5  # package.model_config.log_input_rate of this test's bundles
ROUND = 25  # requests of 4 samples between two judge runs
MAX_ROUNDS = 8  # the judge must decide within ROUND * MAX_ROUNDS requests


@pytest.fixture(scope="module")
def tracking(tmp_path_factory: pytest.TempPathFactory):
    with mlflow_server(tmp_path_factory.mktemp("loop-mlflow")) as uri:
        yield uri


class Project:
    """The clone, its commands run with the venv on PATH and the tracking server set."""

    def __init__(self, root: Path, tracking_uri: str):
        self.root = root
        self.env = {
            **os.environ,
            "PATH": BIN + os.pathsep + os.environ["PATH"],
            "PYTHONPATH": str(root),
            "MLFLOW_TRACKING_URI": tracking_uri,
        }
        self.timings: dict[str, float] = {}

    def __call__(self, *cmd: str, timing: str = "") -> subprocess.CompletedProcess[str]:
        start = time.monotonic()
        proc = subprocess.run(
            list(cmd), cwd=self.root, env=self.env, capture_output=True, text=True, timeout=1800
        )
        if timing:
            self.timings[timing] = round(time.monotonic() - start, 1)
        assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        return proc

    def cli(self, step: str, *args: str, timing: str = "") -> subprocess.CompletedProcess[str]:
        return self(sys.executable, "-m", "components", step, *args, timing=timing)


class Traffic:
    """Clients of the deployed server: every request has an id, its labels are fed back to
    one JSON Lines file, and every failure is kept (none is expected)."""

    def __init__(self, url: str, labels: Path):
        self.url = url
        self.labels = labels
        self._lock = threading.Lock()
        self.sent: list[str] = []
        self.errors: list[str] = []
        self.versions: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _one(self, client: KServeClient, rid: str, x: np.ndarray, y: np.ndarray) -> None:
        try:
            client.infer(NAME, {"image": x}, request_id=rid)
        except Exception as exc:  # noqa: BLE001 - every failure is the finding
            with self._lock:
                self.errors.append(f"{rid}: {exc!r}")
            return
        with self._lock:
            self.sent.append(rid)
            with self.labels.open("a") as out:
                out.write(json.dumps({"id": rid, "labels": y.tolist()}) + "\n")

    def replay(self, prefix: str, x: np.ndarray, y: np.ndarray, per_request: int = 4) -> int:
        """Requests of ``per_request`` samples over ``x``, in order: how many were sent."""
        client = KServeClient(self.url, timeout=60)
        n = 0
        for n, start in enumerate(range(0, len(x), per_request), 1):
            rows = slice(start, start + per_request)
            self._one(client, f"{prefix}-{n}", x[rows], y[rows])
        return n

    def background(self, x: np.ndarray, y: np.ndarray) -> None:
        """One sample every 50 ms, cycling through ``x``, until :meth:`stop`."""

        def loop() -> None:
            client = KServeClient(self.url, timeout=60)
            for i in range(200_000):  # bounded: ~3 hours at this pace
                if self._stop.is_set():
                    return
                j = i % len(x)
                self._one(client, f"bg-{i}", x[j : j + 1], y[j : j + 1])
                time.sleep(0.05)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)


def shifted(x: np.ndarray) -> np.ndarray:
    """Every other image inverted (the model's inputs are normalised to [-1, 1]: -x)."""
    out = x.copy()
    out[::2] = -out[::2]
    return out


def judge_until_decided(
    project: Project, traffic: Traffic, x: np.ndarray, y: np.ndarray, log_dir: str, url: str,
    out: Path, phase: str,
) -> tuple[dict, int]:  # fmt: skip
    """Rounds of live traffic, the judge after each, until it decides: (verdict, requests)."""
    requests = 0
    for r in range(MAX_ROUNDS):
        start = (r * ROUND * 4) % len(x)
        idx = (np.arange(ROUND * 4) + start) % len(x)
        requests += traffic.replay(f"{phase}-r{r}", x[idx], y[idx])
        time.sleep(0.3)  # the log writer's period (50 ms) and more
        project.cli(
            "judge", "--log", log_dir, "--labels", str(traffic.labels), "--server", url,
            "--judgement", str(out / f"r{r}"), timing=f"{phase}_judge_s",
        )  # fmt: skip
        verdict = read_json(out / f"r{r}" / "judgement.json")
        if verdict["action"] != "wait":
            return verdict, requests
    raise AssertionError(f"{phase}: no verdict after {requests} requests: {verdict}")


def served_versions(url: str) -> list[tuple[str, str]]:
    import urllib.request

    req = urllib.request.Request(
        f"{url}/v2/repository/index", b"{}", {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        index = json.loads(res.read())
    role = {True: "challenger", False: "champion"}
    return sorted(
        (m["version"], role[m.get("reason", "").startswith("challenger")])
        for m in index
        if m["state"] == "READY"
    )


@pytest.mark.containers  # the images: asked for once v1's first stages ran (below)
def test_monitor_alarm_retrains_judge_promotes_and_rolls_back_in_containers(
    tracking, oci_registry, digits_task, tmp_path, monkeypatch, request  # noqa: F811
):  # fmt: skip
    from components.tasks.image_data import builtin_digits

    repo = clone_repo(tmp_path / "repo")
    project = Project(repo, tracking)
    state, port = tmp_path / "state", free_port()
    container = f"paddle-mlops-loop-{os.getpid()}"
    set_params(repo, **TINY_DIGITS)  # tiny: the loop is under test, not the accuracy
    set_params(
        repo,
        train={"epochs": 5},
        # the offline gates are tested in test_gates/test_registry: here a few points of noise
        # between 5-epoch models must not decide, a broken model must
        register={"min_accuracy": 0.5, "max_regression": 3.0, "max_class_regression": 30.0},
        registry={"model_name": NAME},
        package={"model_config": {"log_input_rate": INPUT_RATE}},
        promote={"push": True},
        deploy={
            "target": "podman",
            "server_variant": "fp32",
            "local_port": port,
            "local_name": container,
            "local_state_dir": str(state),
            "rollout_timeout_s": 120,
        },
        monitor={"window": 400, "on_alarm": "dvc"},
        judge={"min_pairs": 100, "min_labelled": 100},
    )
    project.cli("ingest", "materialize", "--out", "data/raw/digits")
    project("dvc", "commit", "-f", "-q", "data.dvc")
    traffic: Traffic | None = None
    try:
        # 1. v1: the whole pipeline, deployed; in-distribution traffic keeps the monitor quiet.
        # The stages up to evaluate need no image: on a fresh machine they run while the
        # images build (serving_image's settings are read by serving_image and what follows)
        before = ran(project("dvc", "repro", "evaluate", timing="v1_before_images_s"))
        images = request.getfixturevalue("images")
        set_params(
            repo,
            serving_image={
                "image_repository": f"{oci_registry}/paddle-mlops/digits-server",
                "builder": "podman",
                "server_image": images["server"]["ref"],
                "variants": ["fp32"],
                "golden_samples": 16,
                "latency_requests": 5,
                **WIRING_LATENCY_BUDGET,
            },
        )
        after = ran(project("dvc", "repro", timing="v1_repro_s"))
        assert before + after == list(STAGES), (before, after)
        assert after[0] == "serving_image"
        deployment = read_json(repo / "outputs" / "deploy" / "deployment.json")
        url, log_dir = deployment["local"]["url"], deployment["local"]["prediction_log"]
        assert deployment["version"] == 1
        (x,), y = digits_task.eval_head(repo / "outputs" / "ingest", "test", 10_000)
        traffic = Traffic(url, tmp_path / "labels.jsonl")
        traffic.background(x, y)
        traffic.replay("test-a", x, y)
        traffic.replay("test-b", x[::-1].copy(), y[::-1].copy())
        time.sleep(0.3)
        # as the cluster's CronJob runs it: the reference from the registry alone
        project.cli("monitor", "--reference", "registry", "--log", log_dir,
                    "--labels", str(traffic.labels), "--report", str(tmp_path / "monitor1"),
                    timing="monitor_quiet_s")  # fmt: skip
        quiet = read_json(tmp_path / "monitor1" / "monitor.json")
        assert quiet["alarm"] is False and quiet["retrain"] is None, quiet["verdict"]["reasons"]
        assert quiet["window"]["version"] == "1" and quiet["window"]["labelled"] >= 300
        ran_checks = {c["name"] for c in quiet["verdict"]["checks"] if c["skipped"] is None}
        assert {"input:mean", "prediction:class_prior", "accuracy"} <= ran_checks, ran_checks
        client = mlflow_client(tracking)
        assert client.get_model_version(NAME, "1").tags["monitor_alarm"] == "false"

        # 2. the world shifts: digits arrive inverted. A week of such traffic, its labels fed
        # back, is harvested from the log into data/raw (an IDX pair, to train) and committed
        # as the README's data-growth path says; the alarm retrains on it, and the new version
        # goes out as a shadow of the champion (the operator's choice for every retrained one)
        images_raw, labels_raw = builtin_digits()
        (week_x,) = digits_task.preprocess(255 - images_raw[..., None])
        traffic.replay("week", week_x, labels_raw.astype(np.int64))
        time.sleep(0.3)
        original_files = [list(p) for p in project_params(repo)["ingest"]["idx_files"]]
        set_params(
            repo,
            promote={"auto_promote": False},
            deploy={"alias": "challenger", "challenger": "shadow", "challenger_fraction": 0.5},
        )
        project.cli("harvest", "--log", log_dir, "--labels", str(traffic.labels), "--name", "w49",
                    "--report", str(tmp_path / "harvest"), timing="harvest_s")  # fmt: skip
        harvest = read_json(tmp_path / "harvest" / "harvest.json")
        week = ("w49-images-idx3-ubyte", "w49-labels-idx1-ubyte")
        assert sorted(harvest["files"]) == sorted(week) and harvest["not_recovered"] == 0
        # about INPUT_RATE of the week's images were logged; the replayed test split was
        # (its preprocessing is what the snapshot holds): left out
        assert harvest["samples"] >= 0.3 * len(images_raw), harvest
        assert harvest["in_snapshot"] > 0
        project.timings["harvested_samples"] = harvest["samples"]
        assert project_params(repo)["ingest"]["split"]["files"] == {"w49-*": "train"}
        project("dvc", "commit", "-f", "-q", "data.dvc")
        xs = shifted(x)
        traffic.replay("shift", xs, y)
        time.sleep(0.3)
        proc = project.cli(
            "monitor", "--log", log_dir, "--labels", str(traffic.labels),
            "--report", str(tmp_path / "monitor2"), timing="monitor_alarm_and_retrain_s",
        )  # fmt: skip
        alarm = read_json(tmp_path / "monitor2" / "monitor.json")
        assert alarm["alarm"] is True, alarm["verdict"]
        assert alarm["retrain"]["exit_code"] == 0, proc.stderr[-3000:]
        line = alarm["retrain"]["reason"]
        assert line.startswith(f"monitor: ALARM {NAME} version 1: ") and line in proc.stderr
        kinds = {c["kind"] for c in alarm["verdict"]["checks"] if c["alarm"]}
        assert {"input_drift", "accuracy"} <= kinds, alarm["verdict"]["reasons"]
        assert client.get_model_version(NAME, "1").tags["monitor_alarm"] == "true"
        v2 = client.get_model_version(NAME, "2")
        assert v2.tags["retrain_reason"] == line
        assert client.get_run(v2.run_id).data.tags["retrain_reason"] == line
        registry = Registry(client, NAME, RegistryParams())
        assert registry.aliases()["champion"] == 1 and registry.aliases()["challenger"] == 2
        shadow = read_json(repo / "outputs" / "deploy" / "deployment.json")
        assert (shadow["version"], shadow["local"]["method"]) == (2, "challenger")
        assert served_versions(url) == [("1", "champion"), ("2", "challenger")]

        # 3. the judge promotes v2 on live labelled traffic (clients saw only v1's answers)
        verdict, requests = judge_until_decided(
            project, traffic, xs, y, log_dir, url, tmp_path / "judge2", "shadow"
        )
        project.timings["shadow_requests_to_verdict"] = requests
        assert (verdict["action"], verdict["champion"], verdict["challenger"]) == (
            "promote", "1", "2"
        ), verdict  # fmt: skip
        assert verdict["server"]["done"] == "promote"
        assert registry.aliases()["champion"] == 2
        assert registry.history()[-1]["action"] == "promote"
        assert "judge on live traffic" in registry.history()[-1]["reason"]
        traffic.replay("after-promote", xs[:4], y[:4])
        assert served_versions(url) == [("2", "champion")]

        # 4. a worse v3 (the week's data lost, another seed) passes the offline gate on the
        # pinned holdout, goes out as a canary, and the judge rolls it back on live traffic
        set_params(
            repo,
            train={"seed": 7},
            deploy={"alias": "challenger", "challenger": "canary", "challenger_fraction": 0.5},
        )
        params = project_params(repo)
        params["ingest"]["idx_files"] = original_files
        for name in week:
            del params["ingest"]["sha256"][name]
        (repo / "params.yaml").write_text(yaml_dump(params))
        project("dvc", "repro", timing="v3_repro_s")
        assert registry.aliases()["challenger"] == 3
        canary = read_json(repo / "outputs" / "deploy" / "deployment.json")
        assert (canary["version"], canary["local"]["policy"]) == (3, "canary")
        # what a cluster would get now (render only): the champion's pods with v3 beside
        cluster = DeployParams(
            target="none", manifests=["deployment"], alias="challenger", challenger="canary",
            challenger_fraction=0.5,
        )  # fmt: skip
        monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
        rendered = deploy_run(cluster, repo / "outputs" / "promote", tmp_path / "k8s-before")
        assert (rendered["version"], rendered["challenger"]["version"]) == (2, 3)
        assert "fetch-challenger" in (tmp_path / "k8s-before" / "deployment.yaml").read_text()
        verdict, requests = judge_until_decided(
            project, traffic, xs, y, log_dir, url, tmp_path / "judge3", "canary"
        )
        project.timings["canary_requests_to_rollback"] = requests
        assert (verdict["action"], verdict["champion"], verdict["challenger"]) == (
            "rollback", "2", "3"
        ), verdict  # fmt: skip
        assert requests <= ROUND * MAX_ROUNDS
        assert served_versions(url) == [("2", "champion")]
        assert registry.aliases()["champion"] == 2
        assert registry.version(3).tags["judged"] == "reject"
        assert registry.history()[-1]["action"] == "reject"
        # ...and after the verdict: the same deploy converges on the champion alone
        rendered = deploy_run(cluster, repo / "outputs" / "promote", tmp_path / "k8s-after")
        assert rendered["version"] == 2 and "rolled back" in rendered["challenger"]["refused"]
        assert "challenger" not in (tmp_path / "k8s-after" / "deployment.yaml").read_text()
    finally:
        if traffic is not None:
            traffic.stop()
        for name in (container, f"{container}-previous"):
            subprocess.run(["podman", "rm", "--force", name], capture_output=True)

    # throughout: every request answered, and logged exactly once as answered; every version's
    # answer at most once; the inputs of about INPUT_RATE of them
    assert traffic.errors == [], traffic.errors[:5]
    records = list(LogReader(Path(log_dir)))
    answered = Counter(r.id for r in records if r.answered)
    sent = set(traffic.sent)
    assert set(answered) == sent and max(answered.values()) == 1
    per_version = Counter((r.id, r.version) for r in records)
    assert max(per_version.values()) == 1
    assert {r.role for r in records if not r.answered} <= {"champion", "challenger"}
    with_inputs = sum(1 for r in records if r.answered and r.inputs)
    n = len(sent)
    bound = 5 * (n * INPUT_RATE * (1 - INPUT_RATE)) ** 0.5
    assert abs(with_inputs - n * INPUT_RATE) <= bound, (with_inputs, n)
    project.timings["requests"] = n
    project.timings["log_records"] = len(records)
    print("closed loop timings:", json.dumps(project.timings))


def project_params(repo: Path) -> dict:
    import yaml

    return yaml.safe_load((repo / "params.yaml").read_text())


def yaml_dump(params: dict) -> str:
    import yaml

    return yaml.safe_dump(params, sort_keys=False)
