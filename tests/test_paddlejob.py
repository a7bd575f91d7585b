"""The PaddleJob backend of the train task: template, schema check, launcher, compiled DAG.

No Kubernetes cluster and no training-operator exist on the machines these tests run on:
nothing here starts a real PaddleJob or a real pod. What is tested instead:

- the launcher (``pipelines/paddlejob/``) runs for real, with the real ``kubernetes``
  client configured from a real kubeconfig, against ``FakeApiServer``: an HTTP server on
  127.0.0.1 that answers the requests the launcher makes (create/get/delete of
  ``kubeflow.org/v1`` ``paddlejobs``, the pod list by the operator's job-name label, pod
  logs) the way the API server and the operator (training-operator release-1.9: its
  condition types, reasons and messages) would over a job's lifecycle, and plays global
  rank 0 by writing the train CLI's outputs into the job's directory. It records every
  request, so the tests assert the contract: methods, URL paths, query parameters, that the
  POSTed body passes the PaddleJob schema check, that logs are fetched and shown once, that
  a failure raises with the operator's message, that the job is deleted in every case where
  the launcher owns it and can reach the API (first thing on SIGTERM), that a retry of the
  same KFP run reuses or replaces the job of the same name instead of duplicating it (after a
  real SIGKILL of the previous attempt, in a subprocess), that another run never touches it,
  and that pods that cannot start or cannot be scheduled fail the launch early. No outcome
  depends on this host's speed: the in-process launches run on :class:`VirtualClock` (the
  launcher's time moves only when it sleeps), so what it decides by time follows from the
  number of its polls; a request's own timeout is proven with an endpoint that never answers
  until the test lets it (a fetch without the bound would hang, not finish); what happens in
  which order, and how often, is read off the fake's record of requests;
- the rendered manifest and the checker (``components.kube.check``) on good and bad PaddleJobs;
- the pipeline compiled for the PaddleJob backend, with the real KFP compiler.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from components.core.artifacts import StepError, sha256_file
from components.kube.check import (
    PLACEHOLDER_DIGEST,
    check_manifests,
    load_manifests,
    manifest_files,
    manifest_problems,
)
from components.ml.data import snapshot
from pipelines import paddlejob as pj
from tests.conftest import REPO

NS = "paddle-mlops"
JOBS_PATH = f"/apis/kubeflow.org/v1/namespaces/{NS}/paddlejobs"
IMAGE = "registry.example.com/paddle-mlops/components@sha256:" + "ab" * 32
GPU_IMAGE = "registry.example.com/paddle-mlops/components-gpu@sha256:" + "cd" * 32
TOKEN = "launcher-token"
RESOURCES = {"cpu_request": "2", "cpu_limit": "4", "memory_request": "2Gi", "memory_limit": "8Gi"}
LOG_LINES = 6  # per pod, revealed two per status read
TASK = {"name": "digits", "options": {"conv_channels": [6, 16]}}
RUN = "8d2c1f4e-5b7a-4c39-9e61-0f3b2a7d6c15"  # the KFP run's id ({{$.pipeline_job_uuid}})
# what tqdm writes into a failing rank's log before the error: one line, updated with \r
PROGRESS = "train:  10%|#         | 1/10\rtrain:  50%|#####     | 5/10\rtrain: 100%|##########|"


def train_section(nnodes: int = 2, nproc: int = 1, backend: str = "paddlejob") -> dict:
    return {
        "epochs": 3,
        "batch_size": 64,
        "distributed": {"backend": backend, "nnodes": nnodes, "nproc": nproc},
    }


# --------------------------------------------------------------------------- the fake API server

# the operator's conditions (pkg/controller.v1/paddlepaddle/paddlepaddle_controller.go,
# pkg/util/status.go: reason = kind + reason, the messages of collective mode)
MESSAGES = {
    "Created": "PaddleJob {name} is created.",
    "Running": "PaddleJob {ns}/{name} is running.",
    "Succeeded": "PaddleJob {ns}/{name} successfully completed.",
    "Failed": "PaddleJob {name} is failed because 1 Worker replica(s) failed.",
}
SUCCESS = [["Created"], ["Created", "Running"], ["Created", "Running"], ["Created", "Succeeded"]]
FAILURE = [["Created"], ["Created", "Running"], ["Created", "Failed"]]
RUNNING = [["Created"], ["Created", "Running"]]  # never ends


def timestamp(pod: int, line: int) -> str:
    """The kubelet's RFC 3339 with nanoseconds, trailing zeros trimmed (so lexical order is
    not time order: 00Z, 00.12Z, ... 00.6Z, 01.08Z)."""
    ns = line * 120_000_000 + pod * 1_000
    sec, frac = divmod(ns, 1_000_000_000)
    digits = f"{frac:09d}".rstrip("0")
    return f"2026-01-01T00:00:{sec:02d}" + (f".{digits}" if digits else "") + "Z"


def log_line(pod: str, line: int) -> str:
    return f"{pod}: epoch {line} loss {1.0 / (line + 1):.3f}"


class FakeApiServer:
    """The API server with the training-operator, as far as the launcher sees them."""

    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self.jobs: dict[str, dict[str, Any]] = {}
        self.scripts: dict[str, list[list[str]]] = {}
        self.steps: dict[str, int] = {}
        self.requests: list[dict[str, Any]] = []
        self.script = SUCCESS  # for the next job created
        self.hold = False  # True: jobs stay at their current step
        self.create_error: tuple[int, str] | None = None
        self.seen_at_create: dict[str, dict[str, Any]] = {}
        self.created: list[str] = []  # names, each time a POST created a job
        self.uids: dict[str, str] = {}  # name -> the uid of the last job of that name
        # deleted jobs: their pods stay listed, terminating (propagation Background)
        self.gone: dict[str, dict[str, Any]] = {}
        self.unavailable = False  # True: every request gets 503 (the API server is down)
        self.unanswered = False  # True: every connection is closed without an answer
        self.unavailable_gets: set[int] = set()  # these reads of a job (1-based) get 503
        self.job_gets = 0  # reads of a job, answered or not
        self.on_get: Callable[[int], None] | None = None  # called with each job read's number
        # a hang detector: later reads of a job get 403 (not retried), so a launcher that
        # would poll forever fails its test instead of hanging it
        self.max_job_gets = 1000
        # set: pods' logs are answered only once it is set (a log endpoint that hangs); the
        # server fixture sets it at the end
        self.log_gate: threading.Event | None = None
        self.delete_error: tuple[int, str] | None = None
        self.pod_statuses: dict[int, dict[str, Any]] = {}  # replica index -> its pod's status
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"fake": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True  # a slow answer does not hold up the shutdown
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def kubeconfig(self, path: Path, url: str | None = None) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": url or self.url}}],
                    "users": [{"name": "launcher", "user": {"token": TOKEN}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "launcher"}}
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    def calls(self, method: str | None = None, path: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.requests
            if (method is None or r["method"] == method) and (path is None or r["path"] == path)
        ]

    # ------------------------------------------------------------------ the job's lifecycle

    def status(self, name: str) -> dict[str, Any]:
        script = self.scripts[name]
        types = script[min(self.steps[name], len(script) - 1)]
        conditions = []
        for kind in types:
            message = MESSAGES[kind].format(name=name, ns=NS)
            conditions.append(
                {
                    "type": kind,
                    "status": "True",
                    "reason": f"PaddleJob{kind}",
                    "message": message,
                    "lastUpdateTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            )
        return {"conditions": conditions}

    def terminal(self, name: str) -> str | None:
        script = self.scripts[name]
        last = script[min(self.steps[name], len(script) - 1)][-1]
        return last if last in ("Succeeded", "Failed") else None

    def run_dir(self, job: dict[str, Any]) -> Path:
        (container,) = job["spec"]["paddleReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
        (env,) = [e for e in container["env"] if e["name"] == pj.RUN_DIR_ENV]
        return Path(env["value"])

    def cli_paths(self, job: dict[str, Any]) -> dict[str, Path]:
        """The train CLI's paths, as the kubelet expands $(PADDLE_MLOPS_RUN_DIR) in args."""
        (container,) = job["spec"]["paddleReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
        run_dir = str(self.run_dir(job))
        paths = {}
        for arg in container["args"]:
            flag, _, value = arg.partition("=")
            paths[flag.lstrip("-")] = Path(value.replace(f"$({pj.RUN_DIR_ENV})", run_dir))
        return paths

    def rank0(self, job: dict[str, Any], done: bool) -> None:
        """What global rank 0 writes: a checkpoint per epoch, then the outputs."""
        paths = self.cli_paths(job)
        paths["checkpoints"].mkdir(parents=True, exist_ok=True)
        (paths["checkpoints"] / "last.pdckpt").write_bytes(b"epoch state")
        if done:
            paths["model"].mkdir(parents=True, exist_ok=True)
            (paths["model"] / "model.pdparams").write_bytes(b"weights")
            paths["metrics"].parent.mkdir(parents=True, exist_ok=True)
            paths["metrics"].write_text(json.dumps({"best_val_accuracy": 0.98, "epochs_run": 3}))
            paths["plots"].parent.mkdir(parents=True, exist_ok=True)
            paths["plots"].write_text("epoch,val_accuracy\n1,0.9\n2,0.95\n3,0.98\n")

    def pods(self, name: str) -> list[dict[str, Any]]:
        job = self.jobs[name] if name in self.jobs else self.gone[name]
        step = self.steps[name]
        if step < 1:
            return []
        end = self.terminal(name)
        replicas = job["spec"]["paddleReplicaSpecs"]["Worker"]["replicas"]
        phase = (
            "Pending"
            if step == 1
            else {"Succeeded": "Succeeded", "Failed": "Failed"}.get(end or "", "Running")
        )
        terminating = {} if name in self.jobs else {"deletionTimestamp": "2026-01-01T00:01:00Z"}
        return [
            {
                "metadata": {
                    **terminating,
                    "name": f"{name}-worker-{i}",
                    "namespace": NS,
                    "uid": f"pod-uid-{name}-{i}",
                    "labels": {
                        pj.JOB_NAME_LABEL: name,
                        "training.kubeflow.org/replica-type": "worker",
                        "training.kubeflow.org/replica-index": str(i),
                    },
                },
                "spec": {"containers": [{"name": pj.CONTAINER, "image": IMAGE}]},
                "status": {"phase": phase} if end else self.pod_statuses.get(i, {"phase": phase}),
            }
            for i in range(replicas)
        ]

    def log(self, pod: str) -> str:
        name, _, index = pod.rpartition("-worker-")
        visible = min(2 * self.steps[name], LOG_LINES)
        lines = [f"{timestamp(int(index), j)} {log_line(pod, j)}" for j in range(visible)]
        if self.terminal(name) == "Failed" and index == "1":
            lines.append(f"{timestamp(1, LOG_LINES)} {PROGRESS}")
            lines.append(f"{timestamp(1, LOG_LINES + 1)} error: rank 1: loss is nan")
        # more than asked for (it ignores sinceSeconds): the launcher must not repeat lines
        return "\n".join(lines) + ("\n" if lines else "")

    # ------------------------------------------------------------------ HTTP

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(req.path)
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        with self.lock:
            self.requests.append(
                {
                    "method": method,
                    "path": url.path,
                    "query": parse_qs(url.query),
                    "body": body,
                    "authorization": req.headers.get("Authorization"),
                }
            )
            if not self.unanswered:
                code, payload = self.route(method, url.path, parse_qs(url.query), body)
            if self.unanswered:  # (set by a hook of this very request, too)
                req.close_connection = True
                return
        if url.path.endswith("/log") and self.log_gate is not None:
            self.log_gate.wait()
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        try:
            req.send_response(code)
            kind = "text/plain" if isinstance(payload, str) else "application/json"
            req.send_header("Content-Type", kind)
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        except OSError:  # the client gave up (its timeout, a signal)
            pass

    def route(
        self, method: str, path: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any]:
        item = re.fullmatch(r"/apis/kubeflow\.org/v1/namespaces/([^/]+)/paddlejobs/([^/]+)", path)
        if item and method == "GET":
            self.job_gets += 1
            if self.job_gets > self.max_job_gets:
                message = f"hang detector: more than {self.max_job_gets} reads of a job"
                return _status(403, message, "Forbidden")
            if self.on_get:
                self.on_get(self.job_gets)
            if self.job_gets in self.unavailable_gets:
                return _status(503, "the server is currently unable to handle the request")
        if self.unavailable:
            return _status(503, "the server is currently unable to handle the request")
        if m := re.fullmatch(r"/apis/kubeflow\.org/v1/namespaces/([^/]+)/paddlejobs", path):
            return self.create(m.group(1), body) if method == "POST" else _status(405, "")
        if m := item:
            name = m.group(2)
            if name not in self.jobs:
                return _status(404, f'paddlejobs.kubeflow.org "{name}" not found', "NotFound")
            if method == "DELETE":
                if self.delete_error:
                    return _status(*self.delete_error, "InternalError")
                uid = ((body or {}).get("preconditions") or {}).get("uid")
                theirs = self.jobs[name]["metadata"]["uid"]
                if uid and uid != theirs:
                    message = f"Precondition failed: UID in precondition: {uid}, UID in object "
                    return _status(409, f"{message}meta: {theirs}", "Conflict")
                self.gone[name] = self.jobs.pop(name)
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
            if not self.hold and self.terminal(name) is None:
                self.steps[name] += 1
                self.rank0(self.jobs[name], done=self.terminal(name) == "Succeeded")
            return 200, {**self.jobs[name], "status": self.status(name)}
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", path):
            selector = query.get("labelSelector", [""])[0]
            key, _, name = selector.partition("=")
            known = name in self.jobs or name in self.gone
            pods = self.pods(name) if key == pj.JOB_NAME_LABEL and known else []
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", path):
            return 200, self.log(m.group(2))
        return _status(404, f"no route {method} {path}", "NotFound")

    def create(self, namespace: str, body: dict[str, Any]) -> tuple[int, Any]:
        if self.create_error:
            code, message = self.create_error
            return _status(code, message, "Forbidden")
        name = body["metadata"]["name"]
        if name in self.jobs:
            return _status(409, f'paddlejobs.kubeflow.org "{name}" already exists', "AlreadyExists")
        job = self.plant(body, namespace)
        self.created.append(name)
        paths = self.cli_paths(job)
        self.seen_at_create[name] = {
            "params": yaml.safe_load(paths["params"].read_text()),
            "data": sorted(p.name for p in paths["data"].iterdir()),
            "checkpoints": paths["checkpoints"].exists(),
        }
        return 201, job

    def log_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"].endswith("/log")]

    def job_reads(self, name: str) -> list[int]:
        """The indexes in :attr:`requests` of the reads of job ``name``, answered or not."""
        path = f"{JOBS_PATH}/{name}"
        return [i for i, r in enumerate(self.requests) if (r["method"], r["path"]) == ("GET", path)]

    def seen_uid(self, name: str) -> str:
        """The uid the API server gave the last job of that name."""
        return self.uids[name]

    def plant(self, body: dict[str, Any], namespace: str = NS) -> dict[str, Any]:
        """The job as the API server stores it (what ``create`` does, without its checks)."""
        job = copy.deepcopy(body)
        job["metadata"].update(namespace=namespace, uid=f"uid-{len(self.requests)}")
        name = job["metadata"]["name"]
        self.uids[name] = job["metadata"]["uid"]
        self.jobs[name], self.steps[name], self.scripts[name] = job, 0, self.script
        return job


class _Handler(BaseHTTPRequestHandler):
    fake: FakeApiServer

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        self.fake.handle(self, "GET")

    def do_POST(self) -> None:  # noqa: N802
        self.fake.handle(self, "POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self.fake.handle(self, "DELETE")


def _status(code: int, message: str, reason: str = "") -> tuple[int, dict[str, Any]]:
    return code, {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    fake = FakeApiServer(tmp_path / "shared")
    fake.mount.mkdir()
    fake.thread.start()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a cluster
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
    try:
        yield fake
    finally:
        if fake.log_gate is not None:
            fake.log_gate.set()  # the log requests still held finish
        fake.httpd.shutdown()
        fake.httpd.server_close()
        fake.thread.join(timeout=5)


def write_snapshot(data: Path, splits: tuple[str, ...] = ("train", "val", "test")) -> Path:
    """A snapshot's files as bytes (the launcher only copies them and checks their sha256):
    ``snapshot.json`` pinning one shard per split, ``labels.json``, ``manifest.json``."""
    (data / "shards").mkdir(parents=True, exist_ok=True)
    shards = []
    for split in splits:
        path = data / "shards" / f"u1-{split}-0000.parquet"
        path.write_bytes(split.encode() * 100)
        shards.append(
            {"path": f"shards/{path.name}", "sha256": sha256_file(path), "rows": 100,
             "bytes": path.stat().st_size, "split": split, "unit": "u1"}
        )  # fmt: skip
    snapshot.write_manifest(data, {"shards": shards})
    (data / "labels.json").write_text('{"names": ["a", "b"], "format": "image"}')
    (data / "manifest.json").write_text('{"created_at": "now"}')
    return data


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An ingested data set (a snapshot), as bytes."""
    return write_snapshot(tmp_path / "artifacts" / "data")


class VirtualClock:
    """The launcher's clock in the in-process launches (``pj.launch(clock=...)``): its time
    moves only when the launcher sleeps, by what it sleeps, and nothing really waits. Every
    deadline the launcher keeps (timeout_s, api_outage_s, unschedulable_timeout_s, ...) then
    falls on a poll that follows from the params alone, however fast this host answers."""

    def __init__(self) -> None:
        self.start = self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def settings(server: FakeApiServer, **overrides: Any) -> dict[str, Any]:
    return {
        "namespace": NS,
        "mount_path": str(server.mount),
        "poll_interval_s": 0.02,
        # safety nets only (a launch on the real clock: kfp_main, the attempts in their own
        # processes): no test waits for them
        "timeout_s": 600,
        "delete_timeout_s": 60,
        **overrides,
    }


def outputs(tmp_path: Path) -> pj.Outputs:
    root = tmp_path / "artifacts" / "out"
    root.mkdir(parents=True, exist_ok=True)
    return pj.Outputs(
        model=root / "model",
        checkpoints=root / "checkpoints",
        metrics=root / "metrics",
        plots=root / "plots",
    )


def launch_args(
    server: FakeApiServer,
    data_dir: Path,
    tmp_path: Path,
    train: dict | None = None,
    env: dict | None = None,
    run: str = RUN,
    **overrides: Any,
) -> dict[str, Any]:
    return {
        "task": TASK,
        "train": train or train_section(),
        "paddlejob": settings(server, **overrides),
        "worker_resources": RESOURCES,
        "data_dir": data_dir,
        "outputs": outputs(tmp_path),
        "env": {pj.IMAGE_ENV: IMAGE, pj.GPU_IMAGE_ENV: GPU_IMAGE} if env is None else env,
        "run": run,
    }


def launch(
    server: FakeApiServer,
    data_dir: Path,
    tmp_path: Path,
    clock: VirtualClock | None = None,
    **kwargs: Any,
) -> pj.LaunchResult:
    """One attempt of the launcher task of KFP run ``run`` (default :data:`RUN`), on ``clock``
    (a new :class:`VirtualClock` by default)."""
    args = launch_args(server, data_dir, tmp_path, **kwargs)
    return pj.launch(**args, clock=clock or VirtualClock())


def job_name(data_dir: Path, train: dict | None = None, run: str = RUN) -> str:
    return f"paddle-mlops-train-{pj.job_key(TASK, train or train_section(), data_dir, run)}"


# an attempt of the launcher in its own process (arguments as JSON in argv[1])
ATTEMPT = """
import json, logging, sys
from pathlib import Path
from pipelines import paddlejob as pj
from pipelines.paddlejob import launcher
logging.basicConfig(level=logging.INFO)
args = json.loads(sys.argv[1])
launcher.TERM_LOGS_S = args.pop("term_logs_s", pj.TERM_LOGS_S)
args["outputs"] = pj.Outputs(**{k: Path(v) for k, v in args["outputs"].items()})
pj.launch(**args)
"""


def attempt_process(args: dict[str, Any], data_dir: Path, log_file: Path) -> subprocess.Popen:
    """:data:`ATTEMPT` with ``args`` in its own process, output to ``log_file``."""
    args = {
        **args,
        "data_dir": str(data_dir),
        "outputs": {k: str(v) for k, v in vars(args["outputs"]).items()},
    }
    with log_file.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-c", ATTEMPT, json.dumps(args)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def killed_attempt(
    server: FakeApiServer, data_dir: Path, tmp_path: Path, run: str = RUN, **overrides: Any
) -> str:
    """An attempt of the launcher task SIGKILLed once it created its job (OOM-killed, its
    node lost: no cleanup ran); returns the job's name. The job stays where it is while
    ``server.hold``. (The attempt's paddlejob.timeout_s starts after the create: it is
    killed long before.)"""
    args = launch_args(server, data_dir, tmp_path, run=run, **overrides)
    name = job_name(data_dir, args["train"], run)
    log_file = tmp_path / f"attempt-{run}.log"
    proc = attempt_process(args, data_dir, log_file)
    try:
        deadline = time.monotonic() + 60
        while name not in server.created:
            assert proc.poll() is None, f"the attempt ended: {log_file.read_text()}"
            assert time.monotonic() < deadline, f"no job after 60 s: {log_file.read_text()}"
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return name


# --------------------------------------------------------------------------- the lifecycle


def test_a_succeeded_job_is_created_followed_logged_copied_and_deleted(
    server, data_dir, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="pipelines.paddlejob")
    clock = VirtualClock()
    result = launch(server, data_dir, tmp_path, clock=clock)
    name = job_name(data_dir)
    assert (result.job, result.namespace, result.state, result.created) == (
        name,
        NS,
        "Succeeded",
        True,
    )

    # one create, at the collection URL of the namespace, with the client's credentials
    (create,) = server.calls("POST")
    assert create["path"] == JOBS_PATH
    assert all(r["authorization"] == f"Bearer {TOKEN}" for r in server.requests)
    body = create["body"]
    check_manifests([body], require_digest=True, what="the POSTed PaddleJob")
    assert (body["apiVersion"], body["kind"], body["metadata"]["name"]) == (
        "kubeflow.org/v1",
        "PaddleJob",
        name,
    )
    assert set(body["spec"]["paddleReplicaSpecs"]) == {"Worker"}  # collective mode
    assert body["spec"]["paddleReplicaSpecs"]["Worker"]["replicas"] == 2
    assert body["metadata"]["annotations"][pj.RUN_ANNOTATION] == RUN  # its owner
    # the data and params were on the volume before the job existed
    seen = server.seen_at_create[name]
    assert seen["params"] == {"task": TASK, "train": train_section()}
    assert seen["data"] == ["labels.json", "manifest.json", "shards", "snapshot.json"]

    # status read at the job's URL until it ended; pods by the operator's label; logs
    assert len(server.calls("GET", f"{JOBS_PATH}/{name}")) == len(SUCCESS) - 1
    # the launcher waited for nothing but its poll interval, between two status reads
    assert clock.sleeps == [0.02] * (len(SUCCESS) - 2)
    listed = server.calls("GET", f"/api/v1/namespaces/{NS}/pods")
    assert listed and all(
        r["query"]["labelSelector"] == [f"training.kubeflow.org/job-name={name}"] for r in listed
    )
    logs = [r for r in server.requests if r["path"].endswith("/log")]
    assert {r["path"] for r in logs} == {
        f"/api/v1/namespaces/{NS}/pods/{name}-worker-{i}/log" for i in range(2)
    }
    assert all(r["query"]["container"] == ["paddle"] for r in logs)
    # the client sends Python's bool; the API server parses it with strconv.ParseBool
    assert all(r["query"]["timestamps"] in (["true"], ["True"]) for r in logs)
    later = logs[2:]  # after the first read of each pod
    assert later and all(int(r["query"]["sinceSeconds"][0]) >= 1 for r in later)
    # every line of every pod in the task's log, once, in order
    shown = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[")]
    for i in range(2):
        pod = f"{name}-worker-{i}"
        assert [m for m in shown if m.startswith(f"[{pod}]")] == [
            f"[{pod}] {log_line(pod, j)}" for j in range(LOG_LINES)
        ]
    messages = caplog.text
    assert f"PaddleJob {name}: Running=True PaddleJobRunning" in messages
    assert f"PaddleJob {NS}/{name} successfully completed." in messages

    # deleted last, its pods with it; only the object it created (its uid)
    assert server.requests[-1]["method"] == "DELETE"
    assert server.requests[-1]["path"] == f"{JOBS_PATH}/{name}"
    assert server.requests[-1]["query"]["propagationPolicy"] == ["Background"]
    assert server.requests[-1]["body"]["preconditions"] == {"uid": server.seen_uid(name)}
    assert server.jobs == {}

    # rank 0's outputs are the artifacts; the job's directory is gone
    out = outputs(tmp_path)
    assert (out.model / "model.pdparams").read_bytes() == b"weights"
    assert (out.checkpoints / "last.pdckpt").exists()
    assert json.loads(out.metrics.read_text())["best_val_accuracy"] == 0.98
    assert out.plots.read_text().startswith("epoch,val_accuracy")
    assert result.metrics == {"best_val_accuracy": 0.98, "epochs_run": 3}
    assert not (server.mount / "paddlejob-runs" / name).exists()


def test_a_failed_job_raises_with_the_operators_message_and_is_deleted(
    server, data_dir, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="pipelines.paddlejob")
    server.script = FAILURE
    name = job_name(data_dir)
    with pytest.raises(StepError) as err:
        launch(server, data_dir, tmp_path)
    text = str(err.value)
    assert f"PaddleJob {NS}/{name} failed: PaddleJobFailed" in text
    assert f"PaddleJob {name} is failed because 1 Worker replica(s) failed." in text
    # the end of the failed pod's log, after a progress bar's \r updates (one line), in the
    # error and in the task's log; the bar as a terminal shows it
    pod = f"{name}-worker-1"
    assert "\n  train: 100%|##########|\n  error: rank 1: loss is nan" in text
    shown = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"[{pod}]")]
    assert shown == [f"[{pod}] {log_line(pod, j)}" for j in range(2 * (len(FAILURE) - 1))] + [
        f"[{pod}] train: 100%|##########|",
        f"[{pod}] error: rank 1: loss is nan",
    ]
    assert "\r" not in text
    assert server.requests[-1]["method"] == "DELETE" and server.jobs == {}
    # the job's directory stays: its checkpoints are what a retry resumes from
    assert (server.mount / "paddlejob-runs" / name / "checkpoints" / "last.pdckpt").exists()
    assert not outputs(tmp_path).model.exists()


def test_a_job_that_does_not_finish_in_time_raises_and_is_deleted(server, data_dir, tmp_path):
    """The job never ends: the launcher reads its status every poll_interval_s until
    timeout_s has passed on its clock, then stops and deletes it."""
    server.script = RUNNING
    name = job_name(data_dir)
    clock = VirtualClock()
    with pytest.raises(StepError, match=r"did not finish within 1 s \(paddlejob\.timeout_s\)"):
        launch(server, data_dir, tmp_path, clock=clock, poll_interval_s=0.25, timeout_s=1)
    # reads at 0, 0.25, 0.5, 0.75 and 1 s: the one at the deadline is the last
    assert len(server.job_reads(name)) == 1 + 4
    assert clock.sleeps == [0.25] * 4 and clock.now - clock.start == 1.0
    assert server.requests[-1] == {
        **server.requests[-1],
        "method": "DELETE",
        "path": f"{JOBS_PATH}/{name}",
    }
    assert server.jobs == {}


def test_keep_job_leaves_the_finished_job(server, data_dir, tmp_path):
    launch(server, data_dir, tmp_path, keep_job=True, keep_run_dir=True)
    assert not server.calls("DELETE") and list(server.jobs) == [job_name(data_dir)]
    assert (server.mount / "paddlejob-runs" / job_name(data_dir) / "model").is_dir()


def test_the_hpo_steps_adopted_overlay_sets_the_staged_params(server, data_dir, tmp_path):
    """The launcher stands in for train, whose ``--hpo`` input applies a search's adopted
    overlay: the workers' params.yaml holds the overlaid keys, and the job's name hashes them;
    an overlay that was not adopted changes nothing; an unknown key is one line naming it."""
    hpo = tmp_path / "hpo"
    hpo.mkdir()
    overlay = {
        "adopted": True,
        "params": {"train.batch_size": 16, "task.options.conv_channels": [8, 16]},
        "study": "hpo-digits-0123",
        "trial": 7,
    }
    (hpo / "overlay.yaml").write_text(yaml.safe_dump(overlay))
    args = launch_args(server, data_dir, tmp_path, keep_job=True, keep_run_dir=True)
    pj.launch(**args, hpo_dir=hpo, clock=VirtualClock())
    overlaid_train = {**train_section(), "batch_size": 16}
    overlaid_task = {**TASK, "options": {"conv_channels": [8, 16]}}
    name = f"paddle-mlops-train-{pj.job_key(overlaid_task, overlaid_train, data_dir, RUN)}"
    assert list(server.jobs) == [name] != [job_name(data_dir)]
    staged = yaml.safe_load((server.mount / "paddlejob-runs" / name / "params.yaml").read_text())
    assert staged == {"task": overlaid_task, "train": overlaid_train}

    not_adopted = {**overlay, "adopted": False, "reason": "hpo: kept current params"}
    (hpo / "overlay.yaml").write_text(yaml.safe_dump(not_adopted))
    assert pj.overlaid(TASK, train_section(), hpo) == (TASK, train_section())
    assert pj.overlaid(TASK, train_section(), None) == (TASK, train_section())

    (hpo / "overlay.yaml").write_text(
        yaml.safe_dump({**overlay, "params": {"train.batch_sise": 16}})
    )
    with pytest.raises(StepError) as info:
        pj.launch(**args, hpo_dir=hpo, clock=VirtualClock())
    assert str(info.value) == (
        f"{hpo / 'overlay.yaml'}: params: train.batch_sise: no such key (did you mean "
        "train.batch_size?) in params.yaml"
    )


def test_a_refused_create_names_the_api_servers_reason(server, data_dir, tmp_path):
    server.create_error = (403, 'paddlejobs.kubeflow.org is forbidden: User "x" cannot create')
    with pytest.raises(StepError, match=r"create PaddleJob paddle-mlops/.*HTTP 403.*forbidden"):
        launch(server, data_dir, tmp_path)
    assert not server.jobs


# --------------------------------------------------------------------------- KFP retries


def test_a_retry_reattaches_to_the_job_its_killed_attempt_left_running(
    server, data_dir, tmp_path, caplog
):
    """The previous attempt of this run's task was SIGKILLed (OOM, its node lost) while its
    job ran: no cleanup. KFP's retry of the task (the same run) attaches to that job instead
    of starting a second one, and cleans it up at the end."""
    caplog.set_level(logging.INFO, logger="pipelines.paddlejob")
    server.hold = True
    name = killed_attempt(server, data_dir, tmp_path)
    assert list(server.jobs) == [name] and not server.calls("DELETE")
    assert server.jobs[name]["metadata"]["annotations"][pj.RUN_ANNOTATION] == RUN
    server.hold = False
    result = launch(server, data_dir, tmp_path)  # the retry: the same run, the same params
    assert result.created is False and result.state == "Succeeded"
    creates = server.calls("POST")
    assert [r["path"] for r in creates] == [JOBS_PATH, JOBS_PATH]
    assert creates[0]["body"] == creates[1]["body"]  # the same deterministic name and spec
    assert server.created == [name]  # the second POST got 409 AlreadyExists
    assert "reusing PaddleJob" in caplog.text
    assert server.requests[-1]["method"] == "DELETE" and server.jobs == {}
    assert (outputs(tmp_path).model / "model.pdparams").exists()


def test_a_retry_replaces_a_failed_job_and_resumes_from_its_checkpoints(server, data_dir, tmp_path):
    server.script = FAILURE
    with pytest.raises(StepError, match="failed"):
        launch(server, data_dir, tmp_path, keep_job=True)  # e.g. a node lost mid-run
    name = job_name(data_dir)
    assert server.seen_at_create[name]["checkpoints"] is False
    server.script = SUCCESS
    result = launch(server, data_dir, tmp_path)
    assert result.created is True and server.created == [name, name]
    methods = [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in server.requests]
    retry = methods[methods.index(("POST", "paddlejobs"), 1) :]
    # 409, read it (Failed), delete, wait until gone, create again
    assert retry[:5] == [
        ("POST", "paddlejobs"),
        ("GET", name),
        ("DELETE", name),
        ("GET", name),
        ("POST", "paddlejobs"),
    ]
    # the new job starts on the same directory: the train step resumes from the checkpoint
    assert server.seen_at_create[name]["checkpoints"] is True
    assert server.jobs == {}


def test_a_retry_replaces_a_running_job_of_another_spec(server, data_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pipelines.paddlejob")
    server.hold = True
    with pytest.raises(StepError, match="did not finish"):
        launch(server, data_dir, tmp_path, timeout_s=0.1, keep_job=True, shm_size="2Gi")
    server.hold = False
    result = launch(server, data_dir, tmp_path)  # shm_size 1Gi: another spec, the same name
    assert result.created is True
    assert "replacing PaddleJob" in caplog.text and "another spec" in caplog.text
    first, *_, last = server.calls("POST")
    assert first["body"]["metadata"]["name"] == last["body"]["metadata"]["name"]
    assert first["body"]["metadata"]["annotations"] != last["body"]["metadata"]["annotations"]


# --------------------------------------------------------------------------- runs and owners


def test_the_job_name_is_the_same_within_a_run_and_another_in_another_run(data_dir, tmp_path):
    key = pj.job_key(TASK, train_section(), data_dir, "run-a")
    assert key == pj.job_key(TASK, train_section(), data_dir, "run-a")  # KFP's retries
    assert key != pj.job_key(TASK, train_section(), data_dir, "run-b")  # another run
    assert key != pj.job_key(TASK, train_section(nnodes=3), data_dir, "run-a")
    # the data it trains on: another train shard is another job; the test split is not read
    other = write_snapshot(tmp_path / "other")
    assert pj.job_key(TASK, train_section(), other, "run-a") == key
    (other / "shards" / "u1-test-0000.parquet").write_bytes(b"more test data")
    write_snapshot_pins(other)
    assert pj.job_key(TASK, train_section(), other, "run-a") == key
    (other / "shards" / "u1-train-0000.parquet").write_bytes(b"more training data")
    write_snapshot_pins(other)
    assert pj.job_key(TASK, train_section(), other, "run-a") != key
    # the longest prefix still makes DNS-1035 names of at most 63 for the pods and Services
    longest = f"{'p' * pj.MAX_PREFIX}-{key}-worker-9999"
    assert len(longest) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", longest)


def write_snapshot_pins(data: Path) -> None:
    """Pin the shards' current bytes in ``snapshot.json`` (as ingest would)."""
    doc = json.loads((data / "snapshot.json").read_text())
    for shard in doc["shards"]:
        path = data / shard["path"]
        shard.update(sha256=sha256_file(path), bytes=path.stat().st_size)
    (data / "snapshot.json").write_text(json.dumps(doc))


def test_staging_copies_what_the_train_step_reads_and_checks_every_shard(data_dir, tmp_path):
    """snapshot.json, labels.json, manifest.json and the train and val shards go to the
    volume, each shard checked against its pinned sha256; the test split stays behind."""
    run_dir = tmp_path / "volume" / "run"
    pj.stage(run_dir, data_dir, {"task": TASK, "train": train_section()})
    staged = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
    assert staged == [
        "data/labels.json",
        "data/manifest.json",
        "data/shards/u1-train-0000.parquet",
        "data/shards/u1-val-0000.parquet",
        "data/snapshot.json",
        "params.yaml",
    ]
    for name in ("snapshot.json", "shards/u1-train-0000.parquet"):
        assert (run_dir / "data" / name).read_bytes() == (data_dir / name).read_bytes()

    # a train shard that is not the one snapshot.json pins: one line naming it, nothing staged
    (data_dir / "shards" / "u1-train-0000.parquet").write_bytes(b"flipped bits" * 40)
    bad = tmp_path / "volume" / "bad"
    with pytest.raises(StepError) as info:
        pj.stage(bad, data_dir, {"task": TASK, "train": train_section()})
    message = str(info.value)
    assert "u1-train-0000.parquet: shard sha256 is" in message and "\n" not in message
    assert not (bad / "data").exists()
    (data_dir / "shards" / "u1-train-0000.parquet").write_bytes(b"train" * 100)  # as pinned
    (data_dir / "shards" / "u1-val-0000.parquet").unlink()
    with pytest.raises(StepError, match="u1-val-0000.parquet: shard missing"):
        pj.stage(bad, data_dir, {"task": TASK, "train": train_section()})


def test_a_data_set_that_is_not_a_snapshot_is_refused_in_one_line(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "train.npz").write_bytes(b"train" * 100)
    with pytest.raises(StepError, match="no snapshot manifest"):
        pj.job_key(TASK, train_section(), old, "run-a")


def test_concurrent_runs_of_the_same_training_get_their_own_jobs_and_directories(
    server, data_dir, tmp_path
):
    """Run A's job is running (its launcher alive or not) when run B, with the same params
    and data, starts: B creates its own job; B's success deletes B's job and directory only."""
    server.hold = True
    a = killed_attempt(server, data_dir, tmp_path, run="run-a")
    a_dir = server.mount / "paddlejob-runs" / a
    server.hold = False  # B's job advances (only reads of A's job would advance A's)
    result = launch(server, data_dir, tmp_path, run="run-b")
    b = job_name(data_dir, run="run-b")
    assert result.job == b != a and result.created is True
    assert list(server.jobs) == [a] and not server.calls("DELETE", f"{JOBS_PATH}/{a}")
    assert server.jobs[a]["metadata"]["annotations"][pj.RUN_ANNOTATION] == "run-a"
    assert (a_dir / "data" / "snapshot.json").is_file() and (a_dir / "params.yaml").is_file()
    assert not (server.mount / "paddlejob-runs" / b).exists()
    assert [r["body"]["metadata"]["name"] for r in server.calls("POST")] == [a, b]


@pytest.mark.parametrize("theirs", ["run-b", None])
def test_a_job_of_the_name_owned_by_another_run_is_neither_reused_nor_deleted(
    server, data_dir, tmp_path, theirs
):
    name = job_name(data_dir)
    params = pj.typed(settings(server))
    body = pj.render(
        pj.load_template(pj.template_path(params)),
        name=name,
        params=params,
        topo=pj.Topology(nnodes=2, nproc=1),
        image=IMAGE,
        run_dir=server.mount / "paddlejob-runs" / name,
        worker_resources=RESOURCES,
        run=theirs or "",
    )
    if theirs is None:  # e.g. kubectl apply -f of a rendered manifest
        del body["metadata"]["annotations"][pj.RUN_ANNOTATION]
    planted = server.plant(body)
    owner = f"run {theirs!r}" if theirs else "no run"
    with pytest.raises(pj.ForeignJob, match=rf"{name} exists but belongs to {owner}.*left alone"):
        launch(server, data_dir, tmp_path)
    assert server.jobs == {name: planted}
    assert not server.calls("DELETE") and len(server.calls("POST")) == 1  # 409, then left


def test_an_unsubstituted_run_placeholder_is_refused_before_any_request(server, data_dir, tmp_path):
    from kfp import dsl

    with pytest.raises(StepError, match="placeholder that was not substituted"):
        launch(server, data_dir, tmp_path, run=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    with pytest.raises(StepError, match="the KFP run's id is empty"):
        launch(server, data_dir, tmp_path, run=" ")
    assert server.requests == []


# --------------------------------------------------------------------------- the API server


@pytest.mark.parametrize("outage", ["HTTP 503", "no answer"])
def test_an_api_outage_leaves_the_job_running_for_a_retry_to_reattach(
    server, data_dir, tmp_path, caplog, outage
):
    """The API server goes away after the second status read: after paddlejob.api_outage_s
    the launcher fails without deleting the job; the retry of the task reattaches to it."""
    caplog.set_level(logging.WARNING, logger="pipelines.paddlejob")
    name = job_name(data_dir)
    flag = "unavailable" if outage == "HTTP 503" else "unanswered"
    server.on_get = lambda n: setattr(server, flag, n >= 2) if n == 2 else None
    with pytest.raises(pj.JobLeftRunning) as err:
        launch(server, data_dir, tmp_path, poll_interval_s=0.25, api_outage_s=1)
    text = str(err.value)
    assert f"PaddleJob {NS}/{name}: its status could not be read for 1 s" in text
    assert "(paddlejob.api_outage_s 1)" in text and "left running" in text
    # the outage began at the second read (0.25 s); the reads at 0.5, 0.75 and 1 s were
    # retried, the one at 1.25 s (api_outage_s after the first failure) ended the launch
    assert len(server.job_reads(name)) == 2 + 4
    assert caplog.text.count("; retrying") == 4
    assert ("HTTP 503" if flag == "unavailable" else "no answer from the API server") in text
    assert not server.calls("DELETE") and list(server.jobs) == [name]
    assert (server.mount / "paddlejob-runs" / name / "data").is_dir()
    # the API server is back: KFP retries the task
    setattr(server, flag, False)
    server.on_get = None
    caplog.set_level(logging.INFO, logger="pipelines.paddlejob")
    result = launch(server, data_dir, tmp_path, poll_interval_s=0.25, api_outage_s=1)
    assert result.created is False and result.state == "Succeeded"
    assert "reusing PaddleJob" in caplog.text and server.jobs == {}


def test_a_short_api_outage_is_ridden_out(server, data_dir, tmp_path, caplog):
    server.unavailable_gets = set(range(2, 10))  # eight failed status reads in a row
    result = launch(server, data_dir, tmp_path)  # paddlejob.api_outage_s: 300 s
    assert result.state == "Succeeded" and server.jobs == {}
    assert caplog.text.count("HTTP 503") == 8 and "retrying" in caplog.text


def test_api_timeout_s_bounds_each_request(server, data_dir, tmp_path, caplog):
    """The pods' logs never answer (until the test ends): each fetch gives up after
    paddlejob.api_timeout_s, once (urllib3 does not send it again), and the job's status
    decides. A fetch without that bound would hang the launch: the safety net lets the logs
    answer after 120 s, and a fetch answered fails the test. (The other requests, answered
    at once by the fake, have the same 1 s.)"""
    caplog.set_level(logging.INFO, logger="pipelines.paddlejob")
    gate = server.log_gate = threading.Event()
    safety_net = threading.Timer(120, gate.set)
    safety_net.start()
    # the job runs until the launcher has asked for two logs (it always reaches the end)
    server.on_get = lambda n: setattr(server, "hold", n > 2 and len(server.log_requests()) < 2)
    try:
        result = launch(server, data_dir, tmp_path, api_timeout_s=1.0)
    finally:
        safety_net.cancel()
    assert not gate.is_set(), "the logs were let through: a fetch hung until the safety net"
    assert result.state == "Succeeded" and server.jobs == {}
    fetches = server.log_requests()
    assert len(fetches) >= 2  # 2 passes x 2 pods, unless a pod list gave up too
    # each fetch the API server got ended with the read timeout, once, and showed nothing
    messages = [r.getMessage() for r in caplog.records]
    timed_out = [
        m
        for m in messages
        if m.startswith("log of pod ") and "Read timed out. (read timeout=1.0)" in m
    ]
    assert len(timed_out) == len(fetches), timed_out
    assert not [m for m in messages if m.startswith("[")]


def test_no_answer_to_the_create_is_an_error_naming_the_job(
    server, data_dir, tmp_path, monkeypatch
):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    nowhere = server.kubeconfig(tmp_path / "kubeconfig-nowhere", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("KUBECONFIG", str(nowhere))
    name = job_name(data_dir)
    with pytest.raises(pj.ApiError) as err:
        launch(server, data_dir, tmp_path)
    assert str(err.value).startswith(
        f"create PaddleJob {NS}/{name}: no answer from the API server ("
    )
    assert err.value.status is None and err.value.retryable


def test_a_failed_delete_after_a_success_is_logged_not_raised(server, data_dir, tmp_path, caplog):
    server.delete_error = (500, "etcdserver: request timed out")
    name = job_name(data_dir)
    result = launch(server, data_dir, tmp_path)
    assert result.state == "Succeeded" and result.metrics["best_val_accuracy"] == 0.98
    assert (outputs(tmp_path).model / "model.pdparams").read_bytes() == b"weights"
    (delete,) = server.calls("DELETE")
    assert list(server.jobs) == [name]  # left to ttlSecondsAfterFinished
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        f"could not delete PaddleJob {NS}/{name}: delete PaddleJob {NS}/{name}: HTTP 500 "
        "Internal Server Error: etcdserver: request timed out (ttlSecondsAfterFinished "
        "removes it)"
    ]


def test_a_failure_while_staging_is_cleaned_up_too(server, data_dir, tmp_path, monkeypatch):
    """A retry whose staging fails (the volume is full: the failpoint paddlejob.stage raises
    ENOSPC at the write of the job's params.yaml) deletes the job its killed attempt left
    running: the task fails, its job must not run on."""
    from components.faults import failpoints

    server.hold = True
    name = killed_attempt(server, data_dir, tmp_path)
    uid = server.seen_uid(name)
    run_dir = server.mount / "paddlejob-runs" / name

    monkeypatch.setenv(failpoints.ENV, "paddlejob.stage=enospc")
    with pytest.raises(
        StepError, match=f"staging the job's inputs into {run_dir} failed: .*No space"
    ):
        launch(server, data_dir, tmp_path)
    (delete,) = server.calls("DELETE")
    assert delete["path"] == f"{JOBS_PATH}/{name}" and delete["body"]["preconditions"] == {
        "uid": uid
    }
    assert server.jobs == {} and len(server.calls("POST")) == 1  # no second create


# --------------------------------------------------------------------------- SIGTERM


def test_sigterm_deletes_the_job_first_then_fetches_logs_within_a_bound(server, data_dir, tmp_path):
    """KFP cancels the run: SIGTERM reaches the launcher's process while it reads the job's
    status (the pods are running). The job goes first; then the logs, for TERM_LOGS_S at
    most, though the pods' logs never answer and every other request may take an hour
    (paddlejob.api_timeout_s): the process ends on its own while the logs still hang. The
    launcher runs in its own process, as in its pod (a signal to the test process would hit
    whatever else it has loaded)."""
    server.script = RUNNING
    gate = server.log_gate = threading.Event()
    term_logs_s = 3.0
    args = {
        **launch_args(server, data_dir, tmp_path, timeout_s=7200, api_timeout_s=3600),
        "term_logs_s": term_logs_s,
    }
    name = job_name(data_dir)
    marks: dict[str, int] = {}
    log_file = tmp_path / "attempt.log"
    proc = attempt_process(args, data_dir, log_file)

    def cancel(n: int) -> None:
        if n == 2:  # the pods run from this read on
            marks["index"] = len(server.requests)
            proc.send_signal(signal.SIGTERM)

    server.on_get = cancel
    try:
        proc.wait(timeout=120)  # a safety net: the bound ends it within term_logs_s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    text = log_file.read_text()
    assert not gate.is_set()
    assert proc.returncode != 0 and "received signal 15" in text, text[-3000:]
    after = [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in server.requests[marks["index"] :]]
    assert after[0] == ("DELETE", name), after
    assert server.requests[marks["index"]]["body"]["preconditions"] == {
        "uid": server.seen_uid(name)
    }
    # then the logs: the pods, the first pod's log until the bound (the request's own
    # timeout is what is left of TERM_LOGS_S), and no time left for the second pod's
    assert after[1:] == [("GET", "pods"), ("GET", "log")], after
    (read_timeout,) = re.findall(
        rf"log of pod {name}-worker-0: no answer from the API server .*"
        r"Read timed out\. \(read timeout=([0-9.]+)\)",
        text,
    )
    assert 0 < float(read_timeout) <= term_logs_s
    assert f"no time left for the logs of {name}-worker-1" in text, text[-3000:]
    assert server.jobs == {}


def test_the_sigterm_handler_is_restored_after_a_launch(server, data_dir, tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    launch(server, data_dir, tmp_path)
    assert signal.getsignal(signal.SIGTERM) is before


# --------------------------------------------------------------------------- pods that cannot run


def waiting_status(reason: str, message: str) -> dict[str, Any]:
    """A pod whose container the kubelet cannot start (as the API server returns it)."""
    return {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [
            {
                "name": pj.CONTAINER,
                "image": IMAGE,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ],
    }


def unschedulable_status(message: str) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }


@pytest.mark.parametrize("reason", sorted(pj.NOT_STARTING))
def test_a_pod_that_cannot_start_fails_the_launch_at_once(server, data_dir, tmp_path, reason):
    server.script = RUNNING
    message = f'Back-off pulling image "{IMAGE}": not found ({reason})'
    server.pod_statuses = {1: waiting_status(reason, message)}
    name = job_name(data_dir)
    with pytest.raises(StepError) as err:
        launch(server, data_dir, tmp_path, timeout_s=60)
    assert str(err.value) == (
        f"PaddleJob {NS}/{name}: pod {name}-worker-1 cannot start: its container paddle is "
        f"waiting with {reason}: {message}"
    )
    # at once: the pods listed after the first status read showed the reason; no status
    # read followed, only the cleanup (the end of the logs, then the job's deletion)
    (read,) = server.job_reads(name)
    after = [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in server.requests[read + 1 :]]
    assert after == [("GET", "pods"), ("GET", "pods"), ("DELETE", name)]
    assert server.jobs == {}


def test_a_pod_that_stays_unschedulable_fails_the_launch_after_its_timeout(
    server, data_dir, tmp_path, caplog
):
    server.script = RUNNING
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    server.pod_statuses = {0: unschedulable_status(message), 1: unschedulable_status(message)}
    name = job_name(data_dir)
    with pytest.raises(StepError) as err:
        launch(
            server,
            data_dir,
            tmp_path,
            poll_interval_s=0.25,
            timeout_s=60,
            unschedulable_timeout_s=1,
        )
    assert str(err.value) == (
        f"PaddleJob {NS}/{name}: pod {name}-worker-0 was unschedulable for 1 s "
        f"(paddlejob.unschedulable_timeout_s 1): {message}"
    )
    # not on sight, not at timeout_s: seen unschedulable at 0 s (warned once), waited for at
    # 0.25, 0.5 and 0.75 s, failed at the read 1 s later; then only the cleanup
    assert caplog.text.count(f"pod {name}-worker-0 is unschedulable") == 1
    reads = server.job_reads(name)
    assert len(reads) == 1 + 4
    assert ("GET", f"{JOBS_PATH}/{name}") not in [
        (r["method"], r["path"]) for r in server.requests[reads[-1] + 1 :]
    ]
    assert server.requests[-1]["method"] == "DELETE" and server.jobs == {}


def test_a_pod_unschedulable_for_a_while_is_waited_for(server, data_dir, tmp_path, caplog):
    """The cluster autoscaler adds a node: the pods are scheduled before the timeout."""
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    server.script = [["Created"]] * 4 + SUCCESS[1:]
    server.pod_statuses = {0: unschedulable_status(message), 1: unschedulable_status(message)}
    server.on_get = lambda n: server.pod_statuses.clear() if n == 4 else None
    result = launch(server, data_dir, tmp_path, unschedulable_timeout_s=3)
    assert result.state == "Succeeded"
    assert "is unschedulable" in caplog.text


# --------------------------------------------------------------------------- pod logs


def test_log_lines_are_split_at_newlines_only_and_continuations_kept(caplog):
    """tqdm's \r updates stay in their line (shown as a terminal shows it), a piece without
    a kubelet timestamp continues the line before, and nothing is shown twice."""
    caplog.set_level(logging.INFO, logger="pipelines.paddlejob")
    logs = pj.PodLogs(kube=None, job="j", tail=20)  # type: ignore[arg-type]
    first = (
        "2026-01-01T00:00:01.5Z a\n"
        f"2026-01-01T00:00:02Z {PROGRESS}\n"
        "continued, no timestamp\n"
        "2026-13-01T00:00:02Z not a timestamp either\n"
    )
    logs._emit("p", first)
    # the next fetch overlaps (sinceSeconds has a margin); its new lines follow
    logs._emit(
        "p",
        first
        + "2026-01-01T00:00:02Z b at the same time\n"
        + "2026-01-01T02:00:03+02:00 c, with an offset\n"
        + "2026-01-01T00:00:02.999999999Z older than c\n"
        + "2026-01-01T00:00:04Z error: rank 0: loss is nan\n",
    )
    assert [r.getMessage() for r in caplog.records] == [
        "[p] a",
        "[p] train: 100%|##########|",
        "[p] continued, no timestamp",
        "[p] 2026-13-01T00:00:02Z not a timestamp either",
        "[p] b at the same time",
        "[p] c, with an offset",
        "[p] error: rank 0: loss is nan",
    ]
    assert logs.excerpt().endswith("\n  error: rank 0: loss is nan")


# ------------------------------------------------------------------ refused before a request


@pytest.mark.parametrize(
    ("train", "overrides", "env", "message"),
    [
        (
            train_section(backend="auto"),
            {},
            None,
            "train.distributed.backend is 'auto', but this pipeline was compiled for 'paddlejob'",
        ),
        (train_section(nnodes=0), {}, None, "train.distributed.nnodes: expected an integer >= 1"),
        (
            train_section(nproc=4),
            {"gpus_per_worker": 2},
            None,
            "nproc is 4 but paddlejob.gpus_per_worker is 2",
        ),
        (None, {"replicas": 3}, None, "paddlejob: unknown field(s) ['replicas']"),
        (
            train_section(nnodes=2),
            {"restart_policy": "OnFailure", "backoff_limit": 3},
            None,
            "paddlejob.restart_policy is 'OnFailure' but train.distributed.nnodes is 2: with "
            "more than one node only 'Never' works",
        ),
        (
            train_section(nnodes=3),
            {"restart_policy": "ExitCode"},
            None,
            "paddlejob.restart_policy is 'ExitCode' but train.distributed.nnodes is 3",
        ),
        (None, {"timeout_s": "1h"}, None, "paddlejob.timeout_s: expected a number"),
        (
            None,
            {},
            {pj.IMAGE_ENV: IMAGE, pj.PVC_ENV: "other-claim"},
            "paddlejob.pvc is 'paddle-mlops-shared' but the pipeline was compiled with "
            "'other-claim'",
        ),
        (
            None,
            {},
            {pj.IMAGE_ENV: "registry.example.com/paddle-mlops/components:latest"},
            "the mutable tag :latest",
        ),
        (None, {}, {}, "no worker image"),
        (None, {"gpus_per_worker": 1}, {pj.IMAGE_ENV: IMAGE}, "$PADDLE_MLOPS_GPU_IMAGE"),
    ],
)
def test_bad_params_are_refused_before_any_request(
    server, data_dir, tmp_path, train, overrides, env, message
):
    with pytest.raises(StepError) as err:
        launch(server, data_dir, tmp_path, train=train, env=env, **overrides)
    assert message in str(err.value)
    assert server.requests == []


def test_a_single_node_may_be_restarted_by_the_operator(server, data_dir, tmp_path):
    result = launch(
        server,
        data_dir,
        tmp_path,
        train=train_section(nnodes=1),
        restart_policy="OnFailure",
        backoff_limit=2,
    )
    assert result.state == "Succeeded"
    (create,) = server.calls("POST")
    worker = create["body"]["spec"]["paddleReplicaSpecs"]["Worker"]
    assert (worker["replicas"], worker["restartPolicy"]) == (1, "OnFailure")
    assert create["body"]["spec"]["runPolicy"]["backoffLimit"] == 2


def test_an_unmounted_volume_is_refused(server, data_dir, tmp_path):
    with pytest.raises(StepError, match=r"paddlejob.mount_path .*not a directory.*claim"):
        launch(server, data_dir, tmp_path, mount_path=str(tmp_path / "not-mounted"))
    assert server.requests == []


def test_the_kfp_component_body_logs_the_metrics_kfp_shows(server, data_dir, tmp_path, monkeypatch):
    """kfp_main with KFP's own artifact classes, as the executor hands them over."""
    from kfp import dsl

    monkeypatch.setenv(pj.IMAGE_ENV, IMAGE)
    root = tmp_path / "kfp"
    args = {
        "task": TASK,
        # through protobuf Struct every number is a float
        "train": {**train_section(), "distributed": {"backend": "paddlejob", "nnodes": 2.0}},
        "paddlejob": settings(server),
        "worker_resources": RESOURCES,
        "run": RUN,
        "data": dsl.Dataset(uri=str(data_dir)),
        "validation": dsl.Artifact(uri=str(tmp_path / "validation")),
        "hpo": dsl.Artifact(uri=str(tmp_path / "hpo")),  # no search ran: no overlay
        "model": dsl.Model(uri=str(root / "model")),
        "checkpoints": dsl.Artifact(uri=str(root / "checkpoints")),
        "metrics": dsl.Metrics(uri=str(root / "metrics")),
        "plots": dsl.Artifact(uri=str(root / "plots")),
    }
    pj.kfp_main(args)
    assert args["metrics"].metadata == {"best_val_accuracy": 0.98, "epochs_run": 3.0}
    assert (root / "model" / "model.pdparams").exists() and (root / "plots").is_file()
    assert server.calls("POST")[0]["body"]["spec"]["paddleReplicaSpecs"]["Worker"]["replicas"] == 2


# --------------------------------------------------------------------------- the manifest


def rendered(nnodes: int, gpus: int) -> dict:
    params = pj.typed({"gpus_per_worker": gpus})
    return pj.render(
        pj.load_template(pj.template_path(params)),
        name="paddle-mlops-train-0123456789ab",
        params=params,
        topo=pj.Topology(nnodes=nnodes, nproc=1),
        image=GPU_IMAGE if gpus else IMAGE,
        run_dir=Path("/mnt/shared/paddlejob-runs/paddle-mlops-train-0123456789ab"),
        worker_resources=RESOURCES,
        run=RUN,
    )


@pytest.mark.parametrize("gpus", [0, 2])
def test_the_rendered_job_passes_the_checker_with_a_real_digest(gpus):
    doc = rendered(nnodes=2, gpus=gpus)
    check_manifests([doc], require_digest=True, what=f"PaddleJob, {gpus} GPUs per worker")
    worker = doc["spec"]["paddleReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2 and worker["restartPolicy"] == "Never"
    pod = worker["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "paddle"
    assert container["ports"] == [{"name": "master", "containerPort": 36543}]
    limits = container["resources"]["limits"]
    assert limits.get("nvidia.com/gpu") == (gpus or None)
    assert (limits["cpu"], limits["memory"]) == ("4", "8Gi")  # params.yaml resources.train
    run_dir = "/mnt/shared/paddlejob-runs/paddle-mlops-train-0123456789ab"
    assert {"name": pj.RUN_DIR_ENV, "value": run_dir} in container["env"]
    # the ranks bind to the pod's address (the train step reads POD_IP)
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert pod_ip in container["env"]
    (shared,) = [v for v in pod["volumes"] if v["name"] == "shared"]
    assert shared["persistentVolumeClaim"] == {"claimName": "paddle-mlops-shared"}
    assert doc["spec"]["runPolicy"] == {
        "cleanPodPolicy": "None",
        "backoffLimit": 0,
        "activeDeadlineSeconds": 86400,
        "ttlSecondsAfterFinished": 86400,
    }
    assert doc["metadata"]["annotations"][pj.SPEC_ANNOTATION] == pj.spec_sha256(doc)


def test_the_template_carries_the_placeholder_digest_only():
    docs = load_manifests(manifest_files(REPO / "k8s" / "paddlejob"))
    check_manifests(docs)  # the templates' placeholders pass without require_digest
    (job,) = [d for d in docs if d["kind"] == "PaddleJob"]
    problems = manifest_problems([job], require_digest=True)
    assert problems == [
        "PaddleJob/paddle-mlops-train: spec.paddleReplicaSpecs.Worker.template.spec"
        ".containers[paddle].image: image 'registry.example.com/paddle-mlops/components@"
        f"{PLACEHOLDER_DIGEST}': the placeholder digest, not the image's"
    ]
    (pvc,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["metadata"]["name"] == pj.PaddleJobParams().pvc


def test_the_checker_rejects_an_unknown_field_and_a_wrong_type_naming_them():
    doc = rendered(nnodes=2, gpus=0)
    doc["spec"]["paddleReplicaSpecs"]["Worker"]["replica"] = 3
    doc["spec"]["runPolicy"]["backoffLimit"] = "3"
    container = doc["spec"]["paddleReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    container["ports"][0]["containerPort"] = "36543"
    container["gpus"] = 1
    problems = manifest_problems([doc], require_digest=True)
    where = "PaddleJob/paddle-mlops-train-0123456789ab: spec."
    assert problems == [
        f"{where}paddleReplicaSpecs.Worker: Additional properties are not allowed "
        "('replica' was unexpected)",
        f"{where}paddleReplicaSpecs.Worker.template.spec.containers[0]: Additional properties "
        "are not allowed ('gpus' was unexpected)",
        f"{where}paddleReplicaSpecs.Worker.template.spec.containers[0].ports[0].containerPort: "
        "'36543' is not of type 'integer'",
        f"{where}runPolicy.backoffLimit: '3' is not of type 'integer'",
    ]
    with pytest.raises(StepError, match="4 problem"):
        check_manifests([doc])


def test_the_checker_applies_the_operators_webhook_rules_and_the_hardening_policy():
    doc = rendered(nnodes=2, gpus=0)
    doc["metadata"]["name"] = "Paddle_Job"
    doc["spec"]["paddleReplicaSpecs"]["Chief"] = doc["spec"]["paddleReplicaSpecs"]["Worker"]
    container = doc["spec"]["paddleReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    container["name"] = "trainer"
    del container["securityContext"]["capabilities"]
    text = "\n".join(manifest_problems([doc]))
    assert "spec.paddleReplicaSpecs: 'Chief' is not one of ['Master', 'Worker']" in text
    assert "metadata.name: 'Paddle_Job' is not a DNS-1035 label" in text
    assert "spec.paddleReplicaSpecs.Worker.template.spec.containers: must have a container " in text
    assert (
        "spec.paddleReplicaSpecs.Worker.template.spec.containers[trainer]"
        ".securityContext.capabilities.drop: must include ALL" in text
    )
    assert "Probe" not in text  # batch pods: no probes required


def test_a_template_with_a_master_replica_is_refused():
    template = pj.load_template(pj.template_path(pj.PaddleJobParams()))
    specs = template["spec"]["paddleReplicaSpecs"]
    specs["Master"] = copy.deepcopy(specs["Worker"])
    with pytest.raises(StepError, match="Worker only .*parameter-server mode"):
        pj.render(
            template,
            name="x",
            params=pj.PaddleJobParams(),
            topo=pj.Topology(2, 1),
            image=IMAGE,
            run_dir=Path("/mnt/shared/x"),
            worker_resources=RESOURCES,
            run=RUN,
        )


# --------------------------------------------------------------------------- the compiled DAG


def _all_tasks(spec: dict) -> dict[str, dict]:
    tasks = dict(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        tasks.update(component.get("dag", {}).get("tasks", {}))
    return tasks


@pytest.fixture(scope="module")
def compiled_paddlejob(tmp_path_factory) -> tuple[dict, dict]:
    from pipelines.training import compile_pipeline

    tmp = tmp_path_factory.mktemp("kfp-paddlejob")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"]["distributed"] = {"backend": "paddlejob", "nnodes": 2}
    params["paddlejob"] = {"pvc": "team-shared", "mount_path": "/mnt/team"}
    (tmp / "params.yaml").write_text(yaml.safe_dump(params))
    out = compile_pipeline(tmp / "training.yaml", params_file=tmp / "params.yaml")
    spec, platform = yaml.safe_load_all(out.read_text())
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def test_the_paddlejob_pipeline_trains_in_the_launcher_and_wires_it_downstream(
    compiled_paddlejob,
):
    from components.kernel.kfp import source_type
    from components.kernel.step import all_steps, load

    spec, executors = compiled_paddlejob
    tasks = _all_tasks(spec)
    assert "train-op" not in tasks and "paddlejob-train-op" in tasks
    launcher = tasks["paddlejob-train-op"]
    assert {"ingest-op", "validate-op"} <= set(launcher["dependentTasks"])
    assert launcher["inputs"]["artifacts"]["validation"]["taskOutputArtifact"] == {
        "outputArtifactKey": "report",
        "producerTask": "validate-op",
    }
    # every consumer of train's outputs reads the launcher's, by the same output names
    consumers = {
        (name, port): a["taskOutputArtifact"]["outputArtifactKey"]
        for name, t in tasks.items()
        for port, a in t.get("inputs", {}).get("artifacts", {}).items()
        if a.get("taskOutputArtifact", {}).get("producerTask") == "paddlejob-train-op"
    }
    declared = {
        (f"{step.name.replace('_', '-')}-op", port.name): port.source.split(".")[1]
        for step in all_steps()
        for port in step.inputs
        if (port.source or "").startswith("train.")
    }
    assert consumers == declared and ("export-op", "model") in consumers
    # the launcher's interface is the train step's, plus its own parameters
    train = load("train")
    component = spec["components"]["comp-paddlejob-train-op"]
    outputs = component["outputDefinitions"]["artifacts"]
    assert {k: v["artifactType"]["schemaTitle"] for k, v in outputs.items()} == {
        p.name: f"system.{p.kfp}" for p in train.outputs
    }
    inputs = component["inputDefinitions"]
    assert {k: v["artifactType"]["schemaTitle"] for k, v in inputs["artifacts"].items()} == {
        p.name: f"system.{source_type(p)}" for p in train.inputs
    }
    assert set(inputs["parameters"]) == {*train.sections, "paddlejob", "worker_resources", "run"}
    # the KFP run's id, substituted by the backend: the job's name and owner
    run = launcher["inputs"]["parameters"]["run"]["runtimeValue"]["constant"]
    assert run == "{{$.pipeline_job_uuid}}"
    assert "paddlejob" in spec["root"]["inputDefinitions"]["parameters"]
    # the volume, compiled in from params (the same values the launcher checks at run time)
    (mount,) = executors["exec-paddlejob-train-op"]["pvcMount"]
    assert (mount["constant"], mount["mountPath"]) == ("team-shared", "/mnt/team")
    container = spec["deploymentSpec"]["executors"]["exec-paddlejob-train-op"]["container"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env[pj.PVC_ENV] == "team-shared" and env[pj.MOUNT_ENV] == "/mnt/team"
    assert {pj.IMAGE_ENV, pj.GPU_IMAGE_ENV} <= set(env)
    workers = launcher["inputs"]["parameters"]["worker_resources"]["runtimeValue"]["constant"]
    assert workers == {
        k: str(v)
        for k, v in yaml.safe_load((REPO / "params.yaml").read_text())["resources"]["train"].items()
    }


def test_the_shipped_paddlejob_section_is_the_launchers_defaults():
    """One source of defaults, once params.yaml has the section (as for the steps')."""
    import dataclasses

    shipped = yaml.safe_load((REPO / "params.yaml").read_text())
    if "paddlejob" not in shipped:
        pytest.skip("params.yaml has no paddlejob section yet: the launcher's defaults apply")
    params = pj.typed(shipped["paddlejob"])
    assert params == pj.PaddleJobParams(), [
        (f.name, getattr(params, f.name), getattr(pj.PaddleJobParams(), f.name))
        for f in dataclasses.fields(params)
        if getattr(params, f.name) != getattr(pj.PaddleJobParams(), f.name)
    ]


def test_pipeline_params_pass_the_paddlejob_section_only_to_its_pipeline():
    from pipelines.training import SECTIONS, pipeline_params

    params = {s: {} for s in SECTIONS} | {"resources": {}, "paddlejob": {"pvc": "x", "image": None}}
    assert "paddlejob" not in pipeline_params(params)  # backend auto: the train task
    params["train"] = train_section()
    assert pipeline_params(params)["paddlejob"] == {"pvc": "x"}  # nulls dropped
    assert "paddlejob" not in pipeline_params(params, backend="step")
    with pytest.raises(ValueError, match=r"\['paddlejobs'\]"):
        pipeline_params({**params, "paddlejobs": {}})
