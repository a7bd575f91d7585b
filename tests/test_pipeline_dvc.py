"""The whole pipeline through the real DVC CLI in a temporary git repository.

This is what a user does: clone, materialise data/raw (tracked by data.dvc), ``dvc repro``,
read metrics and plots, change a param, push and pull data, and read the MLflow run back.

The same repository then closes the loop of ``make run`` on a laptop with ``deploy.target:
local`` (params.yaml's default): a repro reruns track to deploy (no model is made again) and
returns while the built C++ server serves the verified champion; the summary's curl answers;
``traffic`` fills the prediction log ``monitor`` judges; nothing is left to reproduce;
``deploy stop`` leaves no process. Then the podman release's params come back for the tests
after them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from components.core.artifacts import sha256_file, sha256_tree
from components.ml.data import snapshot
from components.ml.serving.kserve_client import KServeClient
from components.tracking.registry import LINEAGE_TAGS
from pipelines.containers import free_port
from tests.conftest import (
    STAGES,
    STEP_RUNS,
    TINY_DIGITS,
    WIRING_LATENCY_BUDGET,
    alive,
    clone_repo,
    ran,
    set_params,
    sh,
)
from tests.test_hpo_step import TINY as TINY_HPO

LOCAL_NAME = f"paddle-mlops-dvc-test-{os.getpid()}"
CLI = (sys.executable, "-m", "components")


def search_baseline_wins(repo: Path) -> None:
    """The hpo step on, tiny (tests/test_hpo_step.py's TINY budget): a space whose only other
    value (a learning rate of 1e-6) cannot win, so the baseline wins and no adoption seeds
    run; the search, its trials and train's overlay still go through dvc."""
    set_params(repo, hpo=TINY_HPO["hpo"])
    params = yaml.safe_load((repo / "params.yaml").read_text())
    current = params["train"]["learning_rate"]
    params["hpo"]["space"] = {
        "train.learning_rate": {"type": "categorical", "choices": [current, 1.0e-6]}
    }
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture(scope="module")
def repo(
    tmp_path_factory: pytest.TempPathFactory, server_binary: Path, images, oci_registry
) -> Iterator[Path]:
    repo = clone_repo(tmp_path_factory.mktemp("clone"))
    # tiny params: the point is the wiring, not the accuracy
    set_params(
        repo,
        **{
            # TINY_DIGITS's deploy (target none) and serving_image are replaced below
            **{k: v for k, v in TINY_DIGITS.items() if k not in ("deploy", "serving_image")},
            # the real search, short: what dvc repro ships is the tuned config, validated
            # (a trial count bounds it, not a time: the same trials on every host)
            "package": {
                "tune": {"budget_s": 900, "max_trials": 3, "concurrencies": [1, 4], "repeats": 1}
            },
        },
        serving_image={
            "golden_samples": 32,
            "latency_requests": 10,
            "image_repository": f"{oci_registry}/paddle-mlops/digits-server",
            "builder": "podman",
            "server_image": images["server"]["ref"],  # the clone has no build/images.json
            **WIRING_LATENCY_BUDGET,
        },
        # the release path end to end (issue 30): pushed to a local OCI registry, signed with
        # the session's key (tests/conftest.py), verified and served on this machine
        promote={"push": True},
        deploy={
            "target": "podman",
            "server_variant": "fp32",
            "local_port": free_port(),
            "local_name": LOCAL_NAME,
            "rollout_timeout_s": 120,
        },
    )
    search_baseline_wins(repo)
    try:
        yield repo
    finally:
        sh(repo, *CLI, "deploy", "stop", check=False)  # the local target's server, if it runs
        for name in (LOCAL_NAME, f"{LOCAL_NAME}-previous"):
            subprocess.run(["podman", "rm", "--force", name], capture_output=True)


def test_fresh_clone_materialises_data_byte_identically(repo):
    assert not (repo / "data" / "raw").exists()
    sh(
        repo,
        sys.executable,
        "-m",
        "components.steps.ingest",
        "materialize",
        "--out",
        "data/raw/digits",
    )
    # what `make data` does: cache it, and prove the hash equals the committed data.dvc
    sh(repo, "dvc", "commit", "-f", "-q", "data.dvc")
    sh(repo, "git", "diff", "--exit-code", "--", "data.dvc")
    status = sh(repo, "dvc", "status", "data.dvc")
    assert "up to date" in status.stdout, status.stdout


def test_repro_runs_every_stage_and_writes_the_contract(repo):
    proc = sh(repo, "dvc", "repro")
    assert ran(proc) == list(STAGES)
    train = json.loads((repo / "metrics" / "train.json").read_text())
    evaluate = json.loads((repo / "metrics" / "evaluate.json").read_text())
    assert {"best_val_accuracy", "epochs_run", "samples_per_second", "amp_effective"} <= set(train)
    assert train["amp_effective"] == "off" and train["epochs_run"] == 3
    # the search ran as a stage (hpo.enabled), and train depends on the overlay it wrote
    overlay = yaml.safe_load((repo / "outputs" / "hpo" / "overlay.yaml").read_text())
    assert overlay == {"adopted": False, "params": {}}  # what train applies: nothing
    decision = yaml.safe_load((repo / "outputs" / "hpo" / "decision.yaml").read_text())
    assert decision["adopted"] is False
    assert decision["reason"].startswith("hpo: kept current params: the best trial")
    hpo = json.loads((repo / "metrics" / "hpo.json").read_text())
    assert hpo["enabled"] and (hpo["trials"], hpo["complete"], hpo["fail"]) == (2, 2, 0)
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    deps = {d["path"]: d for d in lock["train"]["deps"]}
    assert (
        deps["outputs/hpo/overlay.yaml"]["md5"]
        == hashlib.md5((repo / "outputs" / "hpo" / "overlay.yaml").read_bytes()).hexdigest()
    )
    assert {o["path"] for o in lock["hpo"]["outs"]} >= {"outputs/hpo", "metrics/hpo.json"}
    assert {"accuracy", "macro_f1", "latency_ms_b1", "latency_ms_b64"} <= set(evaluate)
    assert evaluate["accuracy"] > 0.5
    # package searched the serving config (package.tune): the bundle ships its choice, and
    # infra validation served exactly that
    bundle = repo / "outputs" / "package"
    table = json.loads((bundle / "tune.json").read_text())
    shipped = json.loads((bundle / "model_config.json").read_text())
    assert {k: shipped[k] for k in table["chosen_settings"]} == table["chosen_settings"]
    assert len(table["trials"]) == 3  # max_trials
    infra = json.loads((repo / "outputs" / "serving_image" / "infra.json").read_text())
    assert infra["infra_validated"] and infra["model_config"] == shipped

    shown = json.loads(sh(repo, "dvc", "metrics", "show", "--json").stdout)
    data = json.dumps(shown)
    assert "best_val_accuracy" in data and "latency_ms_b64" in data
    sh(repo, "dvc", "plots", "show", "-o", "plots_html")
    html = (repo / "plots_html" / "index.html").read_text()
    assert "val_accuracy" in html and "confusion" in html.lower()


def test_repro_leaves_a_champion_with_lineage_in_the_registry(repo):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    model = client.get_registered_model("digits-classifier")
    assert int(model.aliases["champion"]) == int(model.aliases["challenger"]) == 1
    tags = client.get_model_version("digits-classifier", "1").tags
    for key in LINEAGE_TAGS:
        assert tags[key], key
    assert tags["ge_success"] == "true" and tags["qat_gate_passed"] == "true"
    assert tags["infra_validated"] == "true"
    assert "/paddle-mlops/digits-server:" in tags["serving_image"]
    blessing = json.loads((repo / "outputs" / "register" / "blessing.json").read_text())
    assert blessing["blessed"] is True
    # the serving-config search's summary and table are in the package step's run
    run_id = json.loads((repo / "outputs" / "track" / "run.json").read_text())["run_id"]
    experiment = client.get_run(run_id).info.experiment_id
    (package,) = client.search_runs(
        [experiment], f"tags.mlflow.parentRunId = '{run_id}' and tags.step = 'package'"
    )
    assert package.data.metrics["tune_trials"] >= 1 and "tune_elapsed_s" in package.data.metrics
    assert "tune.json" in {a.path for a in client.list_artifacts(package.info.run_id)}
    # the first champion pins its test split as the holdout of every later blessing
    assert model.tags["holdout_version"] == "1"
    test_sha = snapshot.load(repo / "outputs" / "ingest").split_sha256("test")
    assert model.tags["holdout_sha256"] == tags["test_split_sha256"] == test_sha


def test_repro_signs_pushes_and_serves_a_verified_champion(repo):
    """promote.push against a local registry: promote signed the bundle, the provenance and
    the image; deploy verified them before serving; `paddle-mlops verify` says what holds."""
    promotion = json.loads((repo / "outputs" / "promote" / "promotion.json").read_text())
    assert promotion["pushed"] and promotion["signed_by"] and promotion["image_signature"]
    deployment = json.loads((repo / "outputs" / "deploy" / "deployment.json").read_text())
    assert deployment["deployed"] and deployment["verified"]["verified"] is True
    assert deployment["verified"]["image"]["ref"] == deployment["image"]
    out = sh(repo, "paddle-mlops", "verify", "models:/digits-classifier@champion").stdout
    assert "models:/digits-classifier/1: verified" in out
    assert out.count(promotion["signed_by"][:16]) == 3  # provenance, bundle, image
    answer = KServeClient(deployment["local"]["url"]).metadata("digits-classifier")
    assert "1" in answer["versions"]


@pytest.fixture(scope="module")
def podman_params(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the podman release's params.yaml waits while the local target is tested."""
    return tmp_path_factory.mktemp("podman-params") / "params.yaml"


def test_local_target_reruns_from_track_and_returns_while_it_serves(repo, podman_params):
    """``deploy.target: local`` on free ports (the podman server keeps its own): no model is
    made again (track records every params section, so track and the steps after it rerun);
    ``dvc repro`` returns while the champion is served."""
    shutil.copy(repo / "params.yaml", podman_params)
    set_params(
        repo, deploy={"target": "local", "local_port": free_port(), "local_grpc_port": free_port()}
    )
    # sh() captures stdout/stderr: a server holding dvc's pipes would keep it waiting
    proc = sh(repo, "dvc", "repro")
    assert ran(proc) == list(STAGES[STAGES.index("track") :])
    record = json.loads((repo / "outputs" / "deploy" / "deployment.json").read_text())
    assert record["deployed"] is True and record["target"] == "local"
    assert record["verified"]["verified"] is True  # signed provenance, the session's keys
    local = record["local"]
    assert local["method"] == "restart" and alive(local["pid"])
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


def test_traffic_feeds_the_monitor(repo):
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


def test_nothing_is_left_to_reproduce(repo):
    """Served, traffic logged, monitored: the pipeline is still up to date."""
    proc = sh(repo, "dvc", "repro")
    assert ran(proc) == []
    assert "Data and pipelines are up to date" in proc.stdout
    assert "up to date" in sh(repo, "dvc", "status", "dvc.yaml").stdout


def test_a_search_that_adopts_nothing_leaves_train_up_to_date(repo):
    """Another search (another space: another study) that adopts nothing writes its own
    decision.yaml, but overlay.yaml, train's dependency, byte for byte as it was: train is not
    stale (issue 41). Only the hpo stage runs here (2 tiny trials)."""
    hpo = repo / "outputs" / "hpo"
    overlay = (hpo / "overlay.yaml").read_bytes()
    before = yaml.safe_load((hpo / "decision.yaml").read_text())
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["hpo"]["space"]["train.learning_rate"]["choices"][1] = 1.0e-7  # cannot win either
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert ran(sh(repo, "dvc", "repro", "--single-item", "hpo")) == ["hpo"]
    after = yaml.safe_load((hpo / "decision.yaml").read_text())
    assert after["adopted"] is False and after["study"] != before["study"]
    assert (hpo / "overlay.yaml").read_bytes() == overlay
    status = sh(repo, "dvc", "status", "train").stdout
    assert "Data and pipelines are up to date" in status, status


def test_stop_leaves_no_process_and_a_stale_pid_file_is_said(repo, podman_params):
    record = json.loads((repo / "outputs" / "deploy" / "deployment.json").read_text())
    pid, pid_file = record["local"]["pid"], Path(record["local"]["pid_file"])
    sh(repo, *CLI, "deploy", "stop")
    assert not alive(pid) and not pid_file.exists()
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
    shutil.copy(podman_params, repo / "params.yaml")  # the podman release, for the tests below


def test_changing_train_params_reruns_train_and_downstream_only(repo):
    set_params(repo, train={"learning_rate": 0.002})
    search_baseline_wins(repo)
    proc = sh(repo, "dvc", "repro")
    # the search reads the train section (its trials are train runs): it searches again
    assert ran(proc) == list(STAGES[STAGES.index("hpo") :])


def test_mlflow_run_holds_params_metrics_curves_and_artifacts(repo, tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("digits")
    assert exp is not None
    runs = client.search_runs(
        [exp.experiment_id],
        "tags.mlflow.parentRunId IS NULL",
        order_by=["attributes.start_time DESC"],
    )
    # one per pipeline execution that changed something: the first, deploy.target local
    # (track records the params), train's learning rate
    assert len(runs) == 3
    parent = runs[0]
    run_json = json.loads((repo / "outputs" / "track" / "run.json").read_text())
    assert parent.info.run_id == run_json["run_id"]
    tags = parent.data.tags
    assert len(tags["git_sha"]) >= 40 and len(tags["data_sha256"]) == 64
    assert len(tags["params_sha256"]) == 64 and tags["task"] == "digits"
    assert parent.data.params["train.learning_rate"] == "0.002"
    # the hardware is recorded: runs from different CPUs can be told apart
    from components.core.artifacts import machine

    here = machine()
    assert tags["machine.cpu"] == here["cpu_model"] and tags["machine.cores"] == str(
        here["usable_cores"]
    )
    assert tags["machine.isa"] == (",".join(here["isa"]) or "none")
    assert tags["versions.paddle"] and tags["versions.openvino"]
    assert parent.data.metrics["test.accuracy"] > 0.5
    history = client.get_metric_history(parent.info.run_id, "training/val_accuracy")
    assert sorted(m.step for m in history) == [1, 2, 3]
    # the experiment opens on its runs (MLflow 3's kind), not on the GenAI overview
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"

    children = client.search_runs(
        [exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert sorted(c.data.tags["step"] for c in children) == sorted(STEP_RUNS)
    by_step = {c.data.tags["step"]: c for c in children}
    # each step run carries its step's own times (dvc repro runs every stage via Step.call;
    # the stages the second repro skipped keep the first one's, as their manifests do)
    from datetime import datetime

    def ms(iso: str) -> int:
        return round(datetime.fromisoformat(iso).timestamp() * 1000)

    for step in STAGES[: STAGES.index("track")]:
        manifest = json.loads((repo / "outputs" / step / "manifest.json").read_text())
        run = by_step[step]
        assert run.info.start_time == ms(manifest["started_at"]), step
        assert run.info.end_time == ms(manifest["finished_at"]), step
    # the pipeline run starts with the first step this execution ran (train: the params
    # changed); the outputs it kept (ingest, validate) do not pull its start back
    assert parent.info.start_time == by_step["train"].info.start_time
    assert parent.info.start_time > by_step["validate"].info.end_time
    assert parent.info.end_time == by_step["promote"].info.end_time
    assert by_step["promote"].data.tags["promoted"] in ("true", "false")
    assert by_step["register"].data.tags["blessing_reasons"]
    assert by_step["validate"].data.metrics["success"] == 1.0
    assert by_step["qat"].data.tags["machine.cpu"] == here["cpu_model"]
    # the QAT gate's paired counts on val reach MLflow
    qat_metrics = by_step["qat"].data.metrics
    assert {"gate_worse", "gate_better", "gate_p_value", "gate_samples"} <= set(qat_metrics)
    # the second run was blessed against the champion on test and on the pinned holdout
    for data in ("test", "holdout"):
        assert 0.0 <= by_step["register"].data.metrics[f"blessing.{data}.p_value"] <= 1.0

    def files(run_id: str, path: str = "") -> set[str]:
        out = set()
        for f in client.list_artifacts(run_id, path):
            out |= files(run_id, f.path) if f.is_dir else {f.path}
        return out

    parent_files = files(parent.info.run_id)
    assert {"plots/train.csv", "plots/confusion.csv", "metrics/qat.json"} <= parent_files
    # the packaged bundle is the run's MLflow model (a LoggedModel), byte for byte
    import mlflow

    model = client.get_logged_model(run_json["model_id"])
    assert model.source_run_id == parent.info.run_id
    assert model.tags["bundle_sha256"] == parent.data.tags["bundle_sha256"]
    root = mlflow.artifacts.download_artifacts(
        artifact_uri=model.artifact_location,
        dst_path=str(tmp_path),
        tracking_uri=f"sqlite:///{repo / 'mlflow.db'}",
    )
    model_files = sha256_tree(root)
    assert {
        "MLmodel",
        "artifacts/bundle/model.json",
        "artifacts/bundle/model.pdiparams",
        "artifacts/bundle/signature.json",
        "artifacts/bundle/legacy/model.pdmodel",
        "artifacts/bundle/int8/openvino/model.xml",
    } <= set(model_files)
    bundle = sha256_tree(repo / "outputs" / "package")
    assert {f"artifacts/bundle/{k}": v for k, v in bundle.items()}.items() <= model_files.items()
    validate_files = files(by_step["validate"].info.run_id)
    assert "great_expectations/data_docs/index.html" in validate_files
    assert "great_expectations/result.json" in validate_files
    assert "manifest.json" in files(by_step["ingest"].info.run_id)


def test_failed_validation_stops_the_pipeline(repo):
    set_params(repo, validate={"class_fraction_max": 0.05})
    proc = sh(repo, "dvc", "repro", check=False)
    assert proc.returncode != 0
    assert ran(proc) == ["validate"]
    assert "column 'fraction'" in proc.stderr and "train split" in proc.stderr
    set_params(repo, validate={"class_fraction_max": 0.5})


def test_push_and_pull_raw_data_through_a_remote(repo, tmp_path):
    remote = tmp_path / "remote"
    sh(repo, "dvc", "remote", "add", "-d", "--local", "storage", str(remote))
    sh(repo, "dvc", "push", "data.dvc")
    before = sha256_tree(repo / "data" / "raw")
    shutil.rmtree(repo / "data" / "raw")
    shutil.rmtree(repo / ".dvc" / "cache")
    sh(repo, "dvc", "pull", "data.dvc")
    assert sha256_tree(repo / "data" / "raw") == before
    assert "up to date" in sh(repo, "dvc", "status", "data.dvc").stdout


def test_push_and_pull_the_snapshot_through_a_remote(repo, tmp_path):
    """The ingested snapshot is a DVC output like any other: pushed, pulled, up to date."""
    remote = tmp_path / "remote"
    sh(repo, "dvc", "remote", "add", "-f", "-d", "--local", "storage", str(remote))
    sh(repo, "dvc", "commit", "-f", "-q", "ingest")  # the raw-data test emptied the cache
    sh(repo, "dvc", "push", "ingest")
    data = repo / "outputs" / "ingest"
    before = sha256_tree(data)
    assert any(name.startswith("shards/") for name in before)
    shutil.rmtree(data)
    shutil.rmtree(repo / ".dvc" / "cache")
    sh(repo, "dvc", "pull", "ingest")
    assert sha256_tree(data) == before
    snapshot.verify(snapshot.load(data))
    assert "up to date" in sh(repo, "dvc", "status", "ingest").stdout


def test_a_week_of_new_data_reingests_only_the_new_files(repo):
    """What the README tells a user: add the week's files, record them, dvc repro. The old
    IDX pair's shards stay byte for byte, only the new pair is read, no sample moves."""
    import numpy as np
    import yaml

    from components.steps.ingest import write_idx
    from components.tasks.image_data import builtin_digits

    data = repo / "outputs" / "ingest"
    old = snapshot.load(data)
    old_shards = {s.path: s.sha256 for s in old.shards}
    old_split = {k: s for s in snapshot.SPLITS for k in snapshot.split_keys(data, [s]).tolist()}

    images, labels = builtin_digits()
    raw = repo / "data" / "raw" / "digits"
    week = {"w49-images-idx3-ubyte": np.flip(images[:180], axis=2)}
    write_idx(raw / "w49-images-idx3-ubyte", week["w49-images-idx3-ubyte"])
    write_idx(raw / "w49-labels-idx1-ubyte", labels[:180].astype(np.uint8))
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["ingest"]["idx_files"].append(["w49-images-idx3-ubyte", "w49-labels-idx1-ubyte"])
    for name in ("w49-images-idx3-ubyte", "w49-labels-idx1-ubyte"):
        params["ingest"]["sha256"][name] = sha256_file(raw / name)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(repo, "dvc", "commit", "-f", "-q", "data.dvc")
    proc = sh(repo, "dvc", "repro", "ingest")
    assert ran(proc) == ["ingest"]

    new = snapshot.load(data)
    assert len(new.doc["units"]) == 2
    reused = json.loads((data / "manifest.json").read_text())["reused_units"]
    assert reused == ["digits-images-idx3-ubyte+digits-labels-idx1-ubyte"]  # w49 was read
    for path, sha in old_shards.items():  # the old unit's shards, byte for byte
        assert sha256_file(data / path) == sha, path
    new_split = {k: s for s in snapshot.SPLITS for k in snapshot.split_keys(data, [s]).tolist()}
    assert not [k for k, s in old_split.items() if new_split[k] != s]
    assert len(new_split) > len(old_split)
