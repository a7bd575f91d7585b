"""Killed anywhere, rerun converges: the fault-injection matrix of the DVC pipeline.

Each row takes a copy of one prepared clone (ingest ... serving_image already reproduced
with tiny params), injects one fault into a real ``dvc repro`` against a real ``mlflow
server`` on 127.0.0.1, then reruns a plain ``dvc repro`` and checks that the end state is
the uninterrupted run's: every stage up to date, nothing half-written, exactly one registry
version per successful pipeline run, the same champion and aliases, the promotion lock
released, and every MLflow run that died marked KILLED or FAILED with its reason.

Faults are real: SIGKILL/SIGTERM through the failpoints (:mod:`components.faults.failpoints`) at
named places, SIGTERM of the C++ server process, the tracking server process stopped and
started again, a full artifact store (a small tmpfs where this machine may mount one).

``make test`` runs the fast rows; ``make test-faults`` runs them all and regenerates
``docs/faults.md`` from the outcomes (``PADDLE_MLOPS_FAULTS=all``,
``PADDLE_MLOPS_FAULTS_MATRIX=docs/faults.md``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.faults.failpoints import ENV as FAILPOINTS
from components.kernel.step import STEPS
from components.tracking.registry import TrackingRetry
from tests.conftest import (
    BIN,
    REPO,
    TINY_DIGITS,
    WIRING_LATENCY_BUDGET,
    clone_repo,
    cmdline,
    descendants,
    set_params,
    sh,
)

ALL = os.environ.get("PADDLE_MLOPS_FAULTS") == "all"
MATRIX_OUT = os.environ.get("PADDLE_MLOPS_FAULTS_MATRIX")
# the rows start after this stage and evaluate (the expensive ones: evaluate is not upstream of
# serving_image, so the prepared clone reproduces both)
PREPARED_UP_TO = "serving_image"


@dataclass(frozen=True)
class Row:
    id: str
    fault: str  # what is injected, for the matrix
    failpoints: str = ""  # PADDLE_MLOPS_FAILPOINTS for the faulty run
    force: str = ""  # a prepared stage the faulty run reproduces again (dvc repro -f -s)
    clear: tuple[str, ...] = ()  # removed first: a retraining that starts from scratch
    slow: bool = False  # only in make test-faults


ROWS = [
    Row("none", "no fault (the reference run)"),
    Row(
        "kill-track-mid-upload",
        "SIGKILL of track between two nested runs' artifact uploads",
        "track.mid_upload=kill",
    ),
    Row(
        "kill-register-after-version",
        "SIGKILL of register after the version is created, before the alias is set",
        "register.after_version=kill",
    ),
    Row(
        "kill-promote-between-aliases",
        "SIGKILL of promote holding the lock, previous-champion set, champion not yet",
        "promote.between_aliases=kill",
        slow=True,
    ),
    Row(
        "kill-promote-after-alias",
        "SIGKILL of promote after the champion alias moved, before history and holdout",
        "promote.after_alias=kill",
    ),
    Row(
        "enospc-register-output",
        "ENOSPC writing register's outputs (injected at the atomic-write layer)",
        "artifacts.write@register=enospc",
    ),
    Row(
        "tracking-down-track",
        "MLflow server stopped for 4 s as track starts, then started",
        slow=True,
    ),
    Row(
        "tracking-down-register",
        "MLflow server stopped as register starts, longer than the retry window, then started",
    ),
    Row(
        "artifact-store-full", "MLflow artifact store full (a 1 MiB tmpfs) during track", slow=True
    ),
    Row("race-two-pipelines", "a second pipeline run racing the first for promotion"),
    Row(
        "sigterm-server-infra",
        "SIGTERM of the C++ server during infra validation",
        force="serving_image",
    ),
    *[
        Row(
            f"kill-{stage}",
            f"SIGKILL of {stage} at its atomic write (outputs computed, not yet renamed)",
            f"artifacts.write@{stage}=kill",
            force=stage,
            slow=True,
        )
        for stage in ("ingest", "validate", "train", "export", "qat", "package", "evaluate")
    ],
    Row(
        "kill-train-mid-epoch",
        "SIGKILL of train after the first batch of epoch 2; the rerun resumes from the epoch-1"
        " checkpoint and must train the same model",
        "train.mid_epoch=kill",
        force="train",
        clear=("checkpoints/train", "outputs/train"),
        slow=True,
    ),
    Row(
        "kill-serving-image",
        "SIGKILL of serving_image at its atomic write",
        "artifacts.write@serving_image=kill",
        force="serving_image",
        slow=True,
    ),
    Row(
        "kill-deploy",
        "SIGKILL of deploy at its atomic write",
        "artifacts.write@deploy=kill",
        slow=True,
    ),
]
OUTCOMES: dict[str, dict[str, str]] = {}


# --------------------------------------------------------------------------- a tracking server
class Tracking:
    """An ``mlflow server`` on a fixed loopback port that a row can stop and start again."""

    def __init__(self, root: Path, artifacts: Path | None = None) -> None:
        from pipelines.containers import free_port

        self.root, self.port = root, free_port()
        self.artifacts = artifacts or root / "mlartifacts"
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        from pipelines.containers import MLFLOW_SERVER_ENV, _healthy, wait_for

        cmd = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--workers", "1"]
        cmd += ["--artifacts-destination", str(self.artifacts)]
        env = {**MLFLOW_SERVER_ENV, **os.environ}
        env["MLFLOW_BACKEND_STORE_URI"] = f"sqlite:///{self.root / 'mlflow.db'}"
        log = open(self.root / "mlflow-server.log", "a")  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        wait_for(lambda: _healthy(self.uri), "mlflow server", 120)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # as a crashed pod: no graceful drain
            self.proc.wait(timeout=30)
        self.proc = None

    @contextlib.contextmanager
    def running(self) -> Iterator[Tracking]:
        self.start()
        try:
            yield self
        finally:
            self.stop()


# --------------------------------------------------------------------------- the pipeline
TINY = {
    **TINY_DIGITS,
    "serving_image": {
        "builder": "none",
        "golden_samples": 32,
        "latency_requests": 10,
        **WIRING_LATENCY_BUDGET,
    },
    # a short retry window: the rows that stop the server outlast it on purpose
    "track": {"retry": {"retries": 3, "backoff_s": 1, "timeout_s": 20}},
    "registry": {"retry": {"retries": 3, "backoff_s": 1, "timeout_s": 20}, "lock_timeout_s": 60},
}


def dvc_env(repo: Path, uri: str, failpoints: str = "") -> dict[str, str]:
    """What a ``dvc repro`` of ``repo`` runs with: this venv first, the tracking server,
    failpoints armed only when asked."""
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"], "PYTHONPATH": str(repo)}
    env["MLFLOW_TRACKING_URI"] = uri
    env.pop(FAILPOINTS, None)
    if failpoints:
        env[FAILPOINTS] = failpoints
    return env


def repro(repo: Path, uri: str, *args: str, failpoints: str = "") -> subprocess.CompletedProcess:
    env = dvc_env(repo, uri, failpoints)
    return subprocess.run(
        ["dvc", "repro", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=900
    )


def repro_watching(
    repo: Path, uri: str, on_stage: dict[str, Callable[[subprocess.Popen], None]]
) -> subprocess.CompletedProcess:
    """``dvc repro`` that calls ``on_stage[name](proc)`` when DVC starts stage ``name``."""
    on_line = {f"Running stage '{stage}'": act for stage, act in on_stage.items()}
    return run_watching(["dvc", "repro"], repo, dvc_env(repo, uri), on_line, timeout_s=900)


def processes_in(repo: Path) -> list[str]:
    """Live processes working in ``repo`` or naming it (from /proc): what a run of its
    pipeline left running."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):  # gone meanwhile, or a zombie (no cwd)
            cwd = Path(os.readlink(proc / "cwd"))
            command = cmdline(int(proc.name))
            if cwd == repo or repo in cwd.parents or str(repo) in command:
                found.append(f"{proc.name} in {cwd}: {command}")
    return found


# --------------------------------------------------------------------------- the end state
def end_state(
    repo: Path | None, uri: str, name: str, experiment: str, outputs: tuple[Path, ...] = ()
) -> dict:
    """What a user checks after a run: stages, leftovers, registry and MLflow runs. With
    ``repo`` None (a KFP run: no ``dvc status``), leftovers are looked for in ``outputs``."""
    from mlflow import MlflowClient

    stale: dict = {}
    if repo is not None:
        status = sh(repo, "dvc", "status", "--json", "dvc.yaml")  # the digits pipeline
        stale = json.loads(status.stdout or "{}")
        outputs = tuple(repo / d for d in ("outputs", "metrics", "plots", "checkpoints"))
    leftovers = sorted(
        str(p.relative_to(root.parent))
        for root in outputs
        for p in root.rglob("*")
        if p.name.startswith(".") and (".tmp" in p.name or ".old-" in p.name)
    )
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    model = client.get_registered_model(name)
    versions = client.search_model_versions(f"name='{name}'")
    locks = client.search_registered_models(f"name='{name}--promotion-lock'")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    history = json.loads(model.tags.get("champion_history", "[]"))
    return {
        "stale_stages": stale,
        "leftovers": leftovers,
        "versions": sorted(int(v.version) for v in versions),
        "orphaned": sorted(int(v.version) for v in versions if v.tags.get("orphaned")),
        "adopted": sorted(int(v.version) for v in versions if v.tags.get("adopted_by_runs")),
        "served": {int(v.version): v.tags.get("served_sha256", "") for v in versions},
        "aliases": {k: int(v) for k, v in model.aliases.items()},
        "lock_held": bool(locks),
        "holdout_version": model.tags.get("holdout_version"),
        "promotions": [(e["action"], e["version"]) for e in history],
        "run_status": {r.info.run_id: r.info.status for r in runs},
        "failure_reasons": {
            r.info.run_id: r.data.tags.get("failure_reason", "")
            for r in runs
            if r.info.status != "FINISHED"
        },
        "finished_parents": sum(r.info.status == "FINISHED" for r in parents),
    }


MODEL_FILES = (".pdparams", ".pdiparams", ".pdmodel", ".onnx", ".npz", ".bin", ".xml")


def made(repo: Path, stage: str) -> dict[str, str]:
    """The sha256 of the data and model files a stage's manifest lists (not its reports,
    which hold timings); of a ``.pdparams`` file, of its arrays (the pickle also holds
    the process's parameter names, which differ between a fresh and a resumed process)."""
    import hashlib

    manifest = json.loads((repo / "outputs" / stage / "manifest.json").read_text())
    out = {}
    for name, entry in manifest.get("outputs", {}).items():
        if not name.endswith(MODEL_FILES):
            continue
        out[name] = entry["sha256"]
        if name.endswith(".pdparams"):
            import paddle

            state = paddle.load(str(repo / "outputs" / stage / entry["path"]))
            digest = hashlib.sha256()
            for key in sorted(k for k, v in state.items() if hasattr(v, "numpy")):
                digest.update(key.encode())
                digest.update(state[key].numpy().tobytes())
            out[name] = digest.hexdigest()
    return out


def assert_converged(state: dict, reference: dict, successful_runs: int = 1) -> None:
    assert state["stale_stages"] == {}, state["stale_stages"]
    assert state["leftovers"] == [], state["leftovers"]
    assert state["orphaned"] == [], f"versions left by dead runs: {state['orphaned']}"
    assert not state["lock_held"], "the promotion lock was left held"
    assert "RUNNING" not in state["run_status"].values(), state["run_status"]
    for run_id, reason in state["failure_reasons"].items():
        assert reason, f"run {run_id} ended {state['run_status'][run_id]} without a reason"
    # one registry version and one finished pipeline run per successful run, no duplicates
    assert state["versions"] == list(range(1, successful_runs + 1))
    assert state["finished_parents"] == successful_runs, (
        state["run_status"],
        state["failure_reasons"],
    )
    if successful_runs == 1:
        for key in ("aliases", "holdout_version", "promotions"):
            assert state[key] == reference[key], key


def assert_clean_run(reference: dict) -> None:
    """The uninterrupted run (row ``none``, made by the ``reference`` fixture) ends in the
    state the rows converge to, with nothing to converge from: it converged as a row must
    after its rerun; every stage the prepared clone had not run ran once, the others not
    again; every MLflow run finished (none died); its one registry version is the champion,
    promoted once, with its holdout pinned and what it serves recorded; and no process of
    the run is left."""
    assert_converged(reference, reference)
    # the prepared clone ran serving_image, evaluate and what they depend on
    ran = re.findall(r"Running stage '(\w+)'", reference["stdout"])
    assert ran == list(STEPS[STEPS.index(PREPARED_UP_TO) + 1 :]), ran
    assert set(reference["run_status"].values()) == {"FINISHED"}, reference["failure_reasons"]
    assert reference["versions"] == [1] and reference["adopted"] == []
    assert reference["aliases"] == {"champion": 1, "challenger": 1}, reference["aliases"]
    assert reference["promotions"] == [("promote", 1)], reference["promotions"]
    assert reference["holdout_version"] == "1"
    assert reference["served"][1], "the champion's served_sha256 is not recorded"
    assert processes_in(reference["repo"]) == []


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, server_binary: Path) -> Path:
    """A clone with ingest ... serving_image and evaluate reproduced (the rows copy it)."""
    repo = clone_repo(tmp_path_factory.mktemp("faults-prepared"))
    set_params(repo, **TINY)
    sh(
        repo,
        sys.executable,
        "-m",
        "components.steps.ingest",
        "materialize",
        "--out",
        "data/raw/digits",
    )
    proc = repro(repo, "sqlite:///unused.db", PREPARED_UP_TO, "evaluate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "prepared")
    return repo


@pytest.fixture(scope="module")
def tracking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tracking]:
    with Tracking(tmp_path_factory.mktemp("faults-mlflow")).running() as t:
        yield t


@pytest.fixture(scope="module")
def reference(prepared: Path, tracking: Tracking, tmp_path_factory) -> dict:
    repo, name, experiment = row_repo(prepared, tmp_path_factory, "none")
    proc = repro(repo, tracking.uri)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = end_state(repo, tracking.uri, name, experiment)
    assert state["aliases"].get("champion") == 1 and state["versions"] == [1]
    OUTCOMES.setdefault("none", {})["dvc"] = "converged (reference)"
    return {**state, "repo": repo, "stdout": proc.stdout}


def row_repo(prepared: Path, factory: pytest.TempPathFactory, row: str) -> tuple[Path, str, str]:
    """A copy of the prepared clone whose registry model and experiment are the row's own."""
    repo = factory.mktemp(f"row-{row}") / "repo"
    shutil.copytree(prepared, repo, symlinks=True)
    name, experiment = f"faults-{row}", f"faults-{row}"
    set_params(repo, registry={"model_name": name}, track={"experiment": experiment})
    return repo, name, experiment


@pytest.fixture(scope="module", autouse=True)
def matrix() -> Iterator[None]:
    yield
    if MATRIX_OUT:
        write_matrix(Path(MATRIX_OUT))


NOT_RUN = {"dvc": "not run", "kfp": "not covered"}


def _machine() -> str:
    """The CPU model and core count of this run (the matrix says where it was made)."""
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores"


def write_matrix(dest: Path, outcomes: dict[str, dict[str, str]] | None = None) -> None:
    """The matrix of this run's outcomes only (``OUTCOMES``): a row that did not run says
    so; nothing is carried over from an earlier matrix."""
    outcomes = OUTCOMES if outcomes is None else outcomes
    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# Fault-injection matrix",
        "",
        "Generated by `make test-faults` (tests/test_faults.py); do not edit by hand. Each",
        "row injects one fault into a `dvc repro` of the digits pipeline (tiny params) against",
        "a real MLflow server, then reruns `dvc repro` and checks that the end state is the",
        "uninterrupted run's (stages up to date, no half-written outputs, one registry version",
        "per successful run, same champion/aliases/holdout/history, promotion lock released,",
        "every dead MLflow run KILLED/FAILED with a reason).",
        "",
        "The KFP column does the same with the local KFP DAG (`python -m pipelines.training",
        "local`, kfp.local, task cache on as on a KFP backend, task retries with a 1 s first",
        "backoff): the fault, then a rerun of the DAG, which is a new pipeline run (a new MLflow",
        "run); the same end state, with no `dvc status` (leftovers are looked for in the",
        "rerun's task outputs). A version that a dead pipeline run left is adopted by the rerun",
        "when it holds the same model (register's content key), else marked `orphaned`.",
        "Every cell is an outcome of the run below; a row that did not run says `not run`.",
        "",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit or '?'}, "
        f"{_machine()}.",
        "",
        "| row | fault | dvc repro | KFP local DAG | in CI |",
        "|---|---|---|---|---|",
    ]
    for row in ROWS:
        got = {**NOT_RUN, **outcomes.get(row.id, {})}
        ci = "slow: make test-faults" if row.slow else "make test"
        if row.id in KFP_ROWS:
            ci += " (KFP: slow)"
        lines.append(f"| `{row.id}` | {row.fault} | {got['dvc']} | {got['kfp']} | {ci} |")
    dest.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _stop_for(tracking: Tracking, seconds: float) -> Callable[[subprocess.Popen | None], None]:
    def act(_: subprocess.Popen | None) -> None:
        time.sleep(1.0)  # the stage is importing its libraries
        tracking.stop()
        time.sleep(seconds)
        tracking.start()

    return act


# --------------------------------------------------------------------------- the rows
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_fault_then_rerun_converges(
    row: Row,
    prepared: Path,
    tracking: Tracking,
    reference: dict,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    if row.slow and not ALL:
        pytest.skip("slow row: make test-faults")
    if row.id == "none":  # the reference fixture ran it: its end state, checked here
        assert_clean_run(reference)
        return
    try:
        with contextlib.ExitStack() as stack:
            _row(row, prepared, tracking, reference, tmp_path_factory, stack)
    except AssertionError as exc:  # the matrix says so, then the test fails
        OUTCOMES.setdefault(row.id, {})["dvc"] = did_not_converge(exc)
        raise


def did_not_converge(exc: AssertionError) -> str:
    """A matrix cell for a row whose end state was not the reference's: the first line."""
    first = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else "assertion"
    return f"**did not converge**: {first}".replace("|", "/")


def _row(
    row: Row,
    prepared: Path,
    tracking: Tracking,
    reference: dict,
    tmp_path_factory: pytest.TempPathFactory,
    stack: contextlib.ExitStack,
) -> None:
    repo, name, experiment = row_repo(prepared, tmp_path_factory, row.id)
    uri = tracking.uri
    successful_runs = 1
    first: subprocess.CompletedProcess
    detail = ""

    if row.id == "tracking-down-track":
        first = repro_watching(repo, uri, {"track": _stop_for(tracking, 4.0)})
        detail = "rode it out (retries)" if first.returncode == 0 else "failed, "
    elif row.id == "tracking-down-register":
        window = TrackingRetry(**TINY["registry"]["retry"]).window_s()  # 1 + 2 + 4 s
        first = repro_watching(repo, uri, {"register": _stop_for(tracking, window + 15.0)})
        assert first.returncode != 0, "register outlived a server down past its retry window"
        assert "did not answer after 3 retries" in first.stdout, first.stdout[-3000:]
        assert "Traceback" not in first.stdout, first.stdout[-3000:]
        detail = "one readable error line, "
    elif row.id == "artifact-store-full":
        full = stack.enter_context(_full_artifact_store(tmp_path_factory))
        uri = full.uri
        first = repro(repo, uri)
        assert first.returncode != 0, "track succeeded with a full artifact store"
        assert "Traceback" not in first.stdout + first.stderr, first.stderr[-3000:]
        subprocess.run(["mount", "-o", "remount,size=512m", str(full.artifacts)], check=True)
        detail = "track failed readably, "
    elif row.id == "race-two-pipelines":
        other, _, _ = row_repo(prepared, tmp_path_factory, row.id + "-b")
        set_params(other, registry={"model_name": name}, track={"experiment": experiment})
        results: dict[str, subprocess.CompletedProcess] = {}
        threads = [
            threading.Thread(target=lambda r=r, k=k: results.__setitem__(k, repro(r, uri)))
            for k, r in (("a", repo), ("b", other))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=900)
        first = results["a"]
        for k in ("a", "b"):
            print(f"race {k}: exit {results[k].returncode}\n{results[k].stdout[-4000:]}")
        assert results["b"].returncode == 0, results["b"].stdout + results["b"].stderr
        successful_runs = 2
    elif row.id == "sigterm-server-infra":
        first = _sigterm_server_during(repo, uri, row.force)
        assert first.returncode != 0, "serving_image passed with its server killed"
        assert "Traceback" not in first.stdout + first.stderr
        detail = "infra validation failed readably, "
    else:
        for path in row.clear:
            shutil.rmtree(repo / path)
        args = ["-f", "-s", row.force] if row.force else []
        first = repro(repo, uri, *args, failpoints=row.failpoints)
        assert first.returncode != 0, f"the fault did not stop the run:\n{first.stdout}"
        if "enospc" in row.failpoints:
            text = first.stdout + first.stderr
            assert "No space left on device" in text and "Traceback" not in text, text[-3000:]
            detail = "one readable error line, "

    again = repro(repo, uri)
    assert again.returncode == 0, again.stdout + again.stderr
    state = end_state(repo, uri, name, experiment)
    assert_converged(state, reference, successful_runs)
    if row.force:  # what the killed stage made again is what the uninterrupted run made
        assert made(repo, row.force) == made(reference["repo"], row.force)
    if row.id == "race-two-pipelines":
        assert state["aliases"]["champion"] in (1, 2)
        assert [a for a, _ in state["promotions"]].count("promote") >= 1
    dead = sorted(set(s for s in state["run_status"].values() if s != "FINISHED"))
    count = sum(s != "FINISHED" for s in state["run_status"].values())
    closed = f" ({count} dead MLflow run(s) marked {'/'.join(dead)})" if dead else ""
    OUTCOMES.setdefault(row.id, {})["dvc"] = f"{detail}converged after a plain rerun{closed}"


def _sigterm_server_during(repo: Path, uri: str, stage: str) -> subprocess.CompletedProcess:
    """``dvc repro -f -s stage`` with every C++ server it starts sent SIGTERM as soon as it
    appears (while infra validation waits for it to load and answer)."""
    env = dvc_env(repo, uri)
    proc = subprocess.Popen(
        ["dvc", "repro", "-f", "-s", stage],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 600
    signalled: set[int] = set()
    while proc.poll() is None and time.monotonic() < deadline:
        for pid in descendants(proc.pid):
            if pid not in signalled and "paddle-mlops-server" in cmdline(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                signalled.add(pid)
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=600)
    assert signalled, "no C++ server was started by serving_image"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@contextlib.contextmanager
def _full_artifact_store(factory: pytest.TempPathFactory) -> Iterator[Tracking]:
    """A tracking server whose artifact store is a 1 MiB tmpfs (the logged model does not
    fit); skips where this machine may not mount one."""
    root = factory.mktemp("faults-full-store")
    store = root / "store"
    store.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(store)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        OUTCOMES.setdefault("artifact-store-full", {})["dvc"] = "not run: no tmpfs mount here"
        pytest.skip(f"cannot mount a tmpfs: {mount.stderr.strip()}")
    try:
        with Tracking(root, artifacts=store).running() as tracking:
            yield tracking
    finally:
        subprocess.run(["umount", "-l", str(store)], check=False)


# --------------------------------------------------------------------------- the KFP column
@dataclass(frozen=True)
class KfpRow:
    """A row of the matrix run through the local KFP DAG (the KFP cell of ``ROWS[id]``)."""

    id: str
    failpoints: str = ""
    fresh_cache: bool = False  # its own pipeline root: the faulty run trains from scratch
    stop_tracking_at: str = ""  # the task whose start stops the MLflow server ...
    stop_for_s: float = 0.0  # ... for this long


KFP_ROW_LIST = [
    KfpRow("kill-register-after-version", "register.after_version=kill"),
    KfpRow("kill-promote-after-alias", "promote.after_alias=kill"),
    KfpRow("kill-track-mid-upload", "track.mid_upload=kill"),
    KfpRow("kill-train-mid-epoch", "train.mid_epoch=kill", fresh_cache=True),
    KfpRow("tracking-down-track", stop_tracking_at="track-op", stop_for_s=4.0),
    KfpRow(
        "tracking-down-register",
        stop_tracking_at="register-op",
        stop_for_s=TrackingRetry(**TINY["registry"]["retry"]).window_s() + 15.0,
    ),
    KfpRow("race-two-pipelines"),
    KfpRow("kill-promote-between-aliases", "promote.between_aliases=kill"),
    KfpRow("enospc-register-output", "artifacts.write@register=enospc"),
    KfpRow("kill-deploy", "artifacts.write@deploy=kill"),
    # a cached task never runs: these faulty runs start from an empty cache
    *[
        KfpRow(f"kill-{stage.replace('_', '-')}", f"artifacts.write@{stage}=kill", fresh_cache=True)
        for stage in STEPS[: STEPS.index(PREPARED_UP_TO) + 1]
    ],
]
KFP_ROWS = {r.id: r for r in KFP_ROW_LIST}
KFP_RETRY_BACKOFF_S = 1  # the DAG's task retries: 1, 2, 4 s (30, 60, 120 s in production)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_watching(
    cmd: list[str],
    cwd: Path,
    env: dict[str, str],
    on_line: dict[str, Callable[[subprocess.Popen], None]],
    timeout_s: float = 1200,
) -> subprocess.CompletedProcess:
    """``cmd`` whose output lines are watched: ``on_line[text](proc)`` runs (in a thread)
    when a line (colour codes removed) first contains ``text``."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    actions: list[threading.Thread] = []
    pending = dict(on_line)
    assert proc.stdout is not None
    for line in proc.stdout:
        line = _ANSI.sub("", line)
        lines.append(line)
        for text in [t for t in pending if t in line]:
            t = threading.Thread(target=pending.pop(text), args=(proc,), daemon=True)
            t.start()
            actions.append(t)
    proc.wait(timeout=timeout_s)
    for t in actions:
        t.join(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines), "")


def kfp_run(
    code: Path,
    params_file: Path,
    root: Path,
    uri: str,
    failpoints: str = "",
    on_line: dict[str, Callable[[subprocess.Popen], None]] | None = None,
) -> tuple[subprocess.CompletedProcess, list[Path]]:
    """One local KFP run of the DAG in ``code`` (a clone) under ``root``: its result and the
    pipeline-run directories it made."""
    before = set(root.glob("paddle-mlops-training-*"))
    cmd = [sys.executable, "-m", "pipelines.training", "local", "--params", str(params_file)]
    cmd += ["--pipeline-root", str(root), "--retry-backoff-s", str(KFP_RETRY_BACKOFF_S)]
    proc = run_watching(cmd, code, dvc_env(code, uri, failpoints), on_line or {})
    return proc, sorted(set(root.glob("paddle-mlops-training-*")) - before)


def kfp_params(code: Path, dest: Path, row: str) -> tuple[Path, str, str]:
    """The clone's params.yaml (tiny), with the row's own registry model and experiment."""
    import yaml

    params = yaml.safe_load((code / "params.yaml").read_text())
    name = experiment = f"kfp-{row}"
    params["registry"]["model_name"] = name
    params["track"]["experiment"] = experiment
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return dest / "params.yaml", name, experiment


def _kfp_failed(proc: subprocess.CompletedProcess) -> str:
    tasks = sorted(set(re.findall(r"Task '([\w-]+)' finished with status FAILURE", proc.stdout)))
    retries = proc.stdout.count("Retrying in")
    return f"{', '.join(tasks) or 'a task'} failed" + (
        f" ({retries} task retries)" if retries else ""
    )


@pytest.fixture(scope="module")
def kfp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pipeline root (and task cache) the KFP rows share."""
    return tmp_path_factory.mktemp("kfp-root")


@pytest.fixture(scope="module")
def kfp_reference(
    prepared: Path, tracking: Tracking, kfp_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    """An uninterrupted local KFP run (it fills the task cache the rows start from)."""
    params, name, experiment = kfp_params(prepared, tmp_path_factory.mktemp("kfp-none"), "none")
    proc, runs = kfp_run(prepared, params, kfp_root, tracking.uri)
    assert proc.returncode == 0, proc.stdout[-6000:]
    state = end_state(None, tracking.uri, name, experiment, tuple(runs))
    assert state["aliases"].get("champion") == 1 and state["versions"] == [1], state
    assert_converged(state, state)
    OUTCOMES.setdefault("none", {})["kfp"] = "converged (reference)"
    return state


# skipped before its fixtures are set up: make test does not pay for the KFP reference run
@pytest.mark.skipif(not ALL, reason="slow row (KFP): make test-faults")
@pytest.mark.timeout(1800)  # two local runs of the DAG (a full one for a fresh cache)
@pytest.mark.parametrize("krow", KFP_ROW_LIST, ids=[f"kfp-{r.id}" for r in KFP_ROW_LIST])
def test_kfp_fault_then_rerun_converges(
    krow: KfpRow,
    prepared: Path,
    tracking: Tracking,
    kfp_root: Path,
    kfp_reference: dict,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The KFP cell of a row: the fault in a local KFP run, then a rerun of the DAG (a new
    pipeline run), then the uninterrupted run's end state."""
    try:
        _kfp_row(krow, prepared, tracking, kfp_root, kfp_reference, tmp_path_factory)
    except AssertionError as exc:
        OUTCOMES.setdefault(krow.id, {})["kfp"] = did_not_converge(exc)
        raise


def _kfp_row(
    krow: KfpRow,
    code: Path,
    tracking: Tracking,
    kfp_root: Path,
    reference: dict,
    factory: pytest.TempPathFactory,
) -> None:
    work = factory.mktemp(f"kfp-{krow.id}")
    params, name, experiment = kfp_params(code, work, krow.id)
    root = work / "root" if krow.fresh_cache else kfp_root
    root.mkdir(exist_ok=True)
    uri = tracking.uri
    on_line: dict[str, Callable[[subprocess.Popen], None]] = {}
    if krow.stop_tracking_at:
        on_line[f"Executing task '{krow.stop_tracking_at}'"] = _stop_for(tracking, krow.stop_for_s)
    if krow.id == "race-two-pipelines":
        results: dict[str, tuple[subprocess.CompletedProcess, list[Path]]] = {}
        threads = [
            threading.Thread(
                target=lambda k=k: results.__setitem__(k, kfp_run(code, params, root, uri))
            )
            for k in ("a", "b")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=1200)
        firsts = [results["a"][0], results["b"][0]]
    else:
        first, _ = kfp_run(code, params, root, uri, krow.failpoints, on_line)
        firsts = [first]
    ok = sum(p.returncode == 0 for p in firsts)
    if krow.failpoints:
        assert ok == 0, f"the fault did not stop the pipeline run:\n{firsts[0].stdout[-4000:]}"
    if len(firsts) == 2:
        detail = f"{ok} of 2 racing runs succeeded, "
    elif not ok:
        detail = f"pipeline run failed ({_kfp_failed(firsts[0])}), "
    elif "Retrying in" in firsts[0].stdout:
        detail = f"the run rode it out ({_kfp_failed(firsts[0])}, then succeeded), "
    else:
        detail = "the run rode it out (MLflow client retries), "

    again, runs = kfp_run(code, params, root, uri)
    assert again.returncode == 0, again.stdout[-6000:]
    successful_runs = ok + 1
    state = end_state(None, uri, name, experiment, tuple(runs))
    assert_converged(state, reference, successful_runs)
    if successful_runs > 1:  # several successful runs: a champion among their versions
        assert state["aliases"]["champion"] in state["versions"]
        assert [a for a, _ in state["promotions"]].count("promote") >= 1
        assert state["holdout_version"] in {str(v) for v in state["versions"]}
    if krow.fresh_cache:  # trained again from scratch: the uninterrupted run's model
        assert state["served"][1] == reference["served"][1], "retrained another model"
    dead = sorted(set(s for s in state["run_status"].values() if s != "FINISHED"))
    count = sum(s != "FINISHED" for s in state["run_status"].values())
    closed = f"; {count} dead MLflow run(s) marked {'/'.join(dead)}" if dead else ""
    adopted = (
        f", its version v{', v'.join(map(str, state['adopted']))} adopted by the rerun"
        if state["adopted"]
        else ""
    )
    same = ", same model retrained" if krow.fresh_cache else ""
    OUTCOMES.setdefault(krow.id, {})["kfp"] = (
        f"{detail}converged after a rerun of the DAG{adopted}{same}{closed}"
    )


# --------------------------------------------------------------------------- the pieces
def test_a_dead_owner_is_recognised_on_this_host_and_by_age_elsewhere() -> None:
    from components.tracking.liveness import HOST_TAG, PID_TAG, START_TAG, dead_owner, owner_tags

    now = time.time()
    assert dead_owner(owner_tags(), now - 10**6, 60) is None  # this process: alive, any age
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = {**owner_tags(), PID_TAG: str(child.pid), START_TAG: ""}
    assert "is gone" in (dead_owner(gone, now, 3600) or "")
    reused = {**owner_tags(), START_TAG: "1"}  # our pid, another start time: pid reuse
    assert "is gone" in (dead_owner(reused, now, 3600) or "")
    elsewhere = {HOST_TAG: "another-node", PID_TAG: "1", START_TAG: "1"}
    assert dead_owner(elsewhere, now - 30, 60) is None
    assert "over the 60 s limit" in (dead_owner(elsewhere, now - 120, 60) or "")


def test_failpoints_are_inert_unless_armed_and_reject_a_bad_spec(monkeypatch) -> None:
    from components.faults import failpoints

    monkeypatch.delenv(failpoints.ENV, raising=False)
    failpoints.hit("artifacts.write")  # unarmed: nothing happens
    monkeypatch.setenv(failpoints.ENV, "artifacts.write@train=enospc")
    failpoints.set_step("evaluate")
    failpoints.hit("artifacts.write")  # armed for another step
    failpoints.set_step("train")
    with pytest.raises(OSError, match="No space left"):
        failpoints.hit("artifacts.write", "outputs/train")
    monkeypatch.setenv(failpoints.ENV, "artifacts.write=explode")
    with pytest.raises(ValueError, match="PADDLE_MLOPS_FAILPOINTS"):
        failpoints.hit("artifacts.write")
    failpoints.set_step("")
    # corrupt: the point's own code corrupts its data; a point that holds none refuses it
    monkeypatch.setenv(failpoints.ENV, "export.parity=corrupt")
    assert failpoints.corrupts("export.parity") is True
    assert failpoints.corrupts("qat.after_finetune") is False
    monkeypatch.setenv(failpoints.ENV, "artifacts.write=corrupt")
    with pytest.raises(ValueError, match="artifacts.write=corrupt: this point holds nothing"):
        failpoints.hit("artifacts.write")
    monkeypatch.setenv(failpoints.ENV, "paddlejob.stage=enospc")
    with pytest.raises(OSError, match="No space left"):
        failpoints.corrupts("paddlejob.stage")  # the other actions act at any point


def test_a_full_disk_and_an_unreachable_server_are_one_readable_line(tmp_path) -> None:
    """What the step CLIs print instead of a traceback (components.kernel.cli.run_cli)."""
    import errno

    from mlflow import MlflowClient

    from components.kernel.cli import readable_failure
    from pipelines.containers import free_port

    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.json"))
    assert "x.json: No space left on device" in (readable_failure(full) or "")
    assert readable_failure(ValueError("a bug")) is None  # a bug keeps its traceback

    port = free_port()
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    try:
        with pytest.raises(Exception) as caught:
            MlflowClient(f"http://127.0.0.1:{port}").search_experiments()
        line = readable_failure(caught.value) or ""
    finally:
        del os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
    assert f"server http://127.0.0.1:{port} did not answer after 0 retries" in line, line
    assert "\n" not in line


def test_the_matrix_holds_this_runs_outcomes_only(tmp_path) -> None:
    """A rewritten matrix never carries a cell over from the file it replaces."""
    dest = tmp_path / "faults.md"
    first, second = ROWS[1].id, ROWS[2].id
    write_matrix(dest, {first: {"dvc": "converged (12 s)"}, second: {"kfp": "converged"}})
    write_matrix(dest, {second: {"dvc": "converged (9 s)"}})
    text = dest.read_text(encoding="utf-8")
    rows = {line.split(" | ")[0].strip("| `"): line for line in text.splitlines()
            if line.startswith("| `")}  # fmt: skip
    assert "converged (12 s)" not in text and "| converged |" not in text
    assert "| not run | not covered |" in rows[first]
    assert "| converged (9 s) | not covered |" in rows[second]
    assert "Run: " in text and "cores." in text


def test_the_matrix_in_docs_lists_every_row() -> None:
    """docs/faults.md is the harness's output (make test-faults), not prose: a row added
    here and not run there shows up as missing."""
    text = (REPO / "docs" / "faults.md").read_text(encoding="utf-8")
    assert "Generated by `make test-faults`" in text
    for row in ROWS:
        assert f"| `{row.id}` |" in text, f"docs/faults.md lacks row {row.id}: make test-faults"


def test_a_killed_writer_leaves_no_output_and_its_temporary_is_swept(tmp_path) -> None:
    from components.core.artifacts import sweep_dead_temporaries

    dest = tmp_path / "out" / "metrics.json"
    code = (
        f"from components.core.artifacts import write_json; write_json({str(dest)!r}, {{'a': 1}})"
    )
    env = {**os.environ, FAILPOINTS: "artifacts.write=kill", "PYTHONPATH": str(REPO)}
    killed = subprocess.run([sys.executable, "-c", code], env=env, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert not dest.exists()  # nothing that looks finished
    left = [p for p in dest.parent.iterdir() if p.name.startswith(".metrics.json.")]
    assert len(left) == 1  # the killed writer's temporary, with its pid in the name
    live = dest.parent / f".metrics.json.{os.getpid()}.abcdef.tmp"  # a live writer's
    live.mkdir()
    assert sweep_dead_temporaries(dest.parent) == left
    assert live.exists() and not left[0].exists()


def test_a_dead_runs_version_is_adopted_if_it_is_the_same_model_else_marked(tmp_path) -> None:
    """register's convergence rule across pipeline runs, on a real (SQLite) registry: the
    version of a pipeline run that died is adopted by a run with the same content key, marked
    ``orphaned`` otherwise (unless an alias serves it); live and complete ones are left."""
    from mlflow import MlflowClient

    from components.tracking.liveness import FAILURE_TAG, PID_TAG, START_TAG, owner_tags
    from components.tracking.registration import (
        ADOPTED_TAG,
        CONTENT_KEY_TAG,
        ORPHAN_TAG,
        settle_dead_registrations,
    )

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri, uri)
    experiment = client.create_experiment("e", artifact_location=str(tmp_path / "artifacts"))
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = {**owner_tags(), PID_TAG: str(child.pid), START_TAG: ""}
    client.create_registered_model("m")

    def version(key: str, owner: dict, status: str = "FINISHED", **tags: str) -> tuple[str, str]:
        run = client.create_run(experiment)
        client.set_terminated(run.info.run_id, status)
        mv = client.create_model_version(
            "m",
            source=f"{run.info.artifact_uri}/model",
            run_id=run.info.run_id,
            tags={CONTENT_KEY_TAG: key, **owner, **tags},
        )
        return run.info.run_id, mv.version

    other, v_other = version("k-other", gone)  # register died, another model
    same, v_same = version("k-same", gone, blessed="true", status="FAILED")  # died in promote
    live, v_live = version("k-same", owner_tags())  # a register still running (this process)
    served, v_served = version("k-other", gone, "FAILED", blessed="true")  # promoted, then died
    client.set_registered_model_alias("m", "champion", v_served)
    done, v_done = version("k-same", gone, blessed="true")  # a successful run's
    legacy, v_legacy = version("k-same", {})  # no owner tags: not ours to judge

    assert settle_dead_registrations(client, "m", "rerun", "k-same", 600) == int(v_same)
    tags = {v.version: v.tags for v in client.search_model_versions("name='m'")}
    assert "its register died before blessing it" in tags[v_other][ORPHAN_TAG]
    assert tags[v_same][ADOPTED_TAG] == "rerun" and "blessed" not in tags[v_same]
    for v in (v_same, v_live, v_served, v_done, v_legacy):
        assert ORPHAN_TAG not in tags[v], v
    for run_id, status in ((other, "FAILED"), (same, "FAILED"), (served, "FAILED")):
        run = client.get_run(run_id)
        assert run.info.status == status and run.data.tags[FAILURE_TAG], run_id
    for run_id in (live, done, legacy):
        assert client.get_run(run_id).info.status == "FINISHED"
    # a retried register of the adopting run finds it again (no second version)
    assert settle_dead_registrations(client, "m", "rerun", "k-same", 600) == int(v_same)
    # the adopter owns it now: while its run lives, nobody else adopts it
    rerun = client.create_run(experiment)
    client.set_model_version_tag("m", v_same, ADOPTED_TAG, rerun.info.run_id)
    client.set_model_version_tag("m", v_same, "blessed", "true")
    assert settle_dead_registrations(client, "m", "third", "k-same", 600) is None
