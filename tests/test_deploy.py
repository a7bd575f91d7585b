"""The deploy step and the model fetcher: the registry's champion is what is served.

The rendering tests check what the cluster would get; the podman test runs the whole path on
this machine with real parts: an OCI registry (``docker-registry``) on 127.0.0.1, a real
``mlflow server``, the serving images built and pushed by the pipeline's own steps, and the
server containers the deploy step starts. The local test does the same with the built C++
server binary as a process on this machine (``deploy.target: local``): a newly promoted,
signed version is loaded into the running process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml

from components.core.artifacts import StepError, read_json, sha256_tree, write_json
from components.core.deploy_target import VERSION_LABEL, Release
from components.kernel.step import REPO
from components.kube.check import check_manifests
from components.kube.images import image_repository
from components.kube.render import FETCH_CONTAINERS, SERVER_CONTAINERS, render
from components.ml.data.prediction_log import LogReader
from components.ml.decisions.monitoring import RETRAIN_REASON_ENV
from components.ml.serving.kserve_client import KServeClient
from components.ml.serving.runtime import ModelFiles, PaddlePredictor
from components.steps.deploy import DeployParams
from components.steps.deploy import run as deploy_run
from components.steps.promote import PromoteParams
from components.steps.register import RegisterParams
from components.steps.serving_image import ServingImageParams
from components.steps.serving_image import run as serving_image_run
from components.tracking.registry import Registry, RegistryParams
from components.tracking.registry import client as mlflow_client
from pipelines.containers import free_port
from tests.conftest import (
    WIRING_LATENCY_BUDGET,
    fp32_bundle,
    track_register_promote,
    untrained_export,
)
from tests.test_registry import TASK_OPTIONS

DIGEST = "sha256:" + "ab" * 32
COMPONENTS = "registry.example.com/paddle-mlops/components@sha256:" + "cd" * 32
REL = Release(
    model="digits-classifier",
    version=7,
    image=f"registry.example.com/paddle-mlops/digits-server@{DIGEST}",
    model_uri="models:/digits-classifier/7",
    bundle_sha256="ef" * 32,
)


def _containers(doc: dict) -> list[dict]:
    if doc["kind"] == "Deployment":
        spec = doc["spec"]["template"]["spec"]
        return spec.get("initContainers", []) + spec["containers"]
    if doc["kind"] == "ServingRuntime":
        return doc["spec"]["containers"]
    if doc["kind"] == "ClusterStorageContainer":
        return [doc["spec"]["container"]]
    return []


@pytest.mark.parametrize(
    ("ref", "repository"),
    [
        (
            "localhost/paddle-mlops/digits-server:0123456789ab",
            "localhost/paddle-mlops/digits-server",
        ),
        ("127.0.0.1:5000/a/b:tag", "127.0.0.1:5000/a/b"),
        ("127.0.0.1:5000/a/b", "127.0.0.1:5000/a/b"),
        (f"r.example.com/a/b@{DIGEST}", "r.example.com/a/b"),
    ],
)
def test_image_repository_drops_the_tag_not_the_registry_port(ref, repository):
    assert image_repository(ref) == repository


def test_rendered_manifests_pin_the_version_and_pass_the_cluster_checks():
    rendered = render(REL, DeployParams(namespace="ml-prod"), REPO / "k8s", COMPONENTS)
    assert sorted(rendered) == ["deployment", "kserve"]
    for docs in rendered.values():
        # strict Kubernetes schemas, KServe's models, hardening, and every image by digest
        check_manifests(docs, require_digest=True)
        for doc in docs:
            assert doc["metadata"]["labels"][VERSION_LABEL] == "7"
            if not doc["kind"].startswith("Cluster"):
                assert doc["metadata"]["namespace"] == "ml-prod"
            for c in _containers(doc):
                if c["name"] in SERVER_CONTAINERS:
                    assert c["image"] == REL.image
                    assert "--model-version=7" in c["args"]
                    assert "--model-dir=/mnt/models" in c["args"]
                if c["name"] in FETCH_CONTAINERS:
                    assert c["image"] == COMPONENTS
                    assert "@" not in " ".join(c.get("args", []))  # no alias left
        text = yaml.safe_dump_all(docs)
        assert "@champion" not in text and "sha256:0000" not in text

    deployment = next(d for d in rendered["deployment"] if d["kind"] == "Deployment")
    init = deployment["spec"]["template"]["spec"]["initContainers"][0]
    assert init["args"] == ["models:/digits-classifier/7", "/mnt/models"]
    # the server reads what the init container verified, not files baked into the image
    server = deployment["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    assert mounts["/mnt/models"]["readOnly"] is True
    # its settings are the bundle's model_config.json: nothing rendered restates them
    assert not [d for docs in rendered.values() for d in docs if d["kind"] == "ConfigMap"]
    assert "envFrom" not in server
    assert "SERVING_" not in yaml.safe_dump_all([d for v in rendered.values() for d in v])

    isvc = next(d for d in rendered["kserve"] if d["kind"] == "InferenceService")
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == "models:/digits-classifier/7"


def test_a_changed_version_changes_the_pod_template_so_the_pods_roll():
    params = DeployParams(manifests=["deployment"])
    one = render(REL, params, REPO / "k8s", COMPONENTS)["deployment"]
    other = dataclasses.replace(REL, version=8, model_uri="models:/digits-classifier/8")
    two = render(other, params, REPO / "k8s", COMPONENTS)["deployment"]

    def template(docs):
        return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]

    assert template(one) != template(two)


def test_a_cluster_challenger_runs_in_the_champions_pods_with_flags_the_server_takes(
    server_binary,
):
    """deploy.challenger on Kubernetes: the champion's pods also fetch the challenger (its
    own verified copy) and start the server with it beside the champion, so every request
    the challenger sees is paired in the log, as on podman; KServe's unpaired split refused."""
    params = DeployParams(
        target="kubernetes", manifests=["deployment"], challenger="canary",
        challenger_fraction=0.25, alias="challenger",
    )  # fmt: skip
    v8 = dataclasses.replace(
        REL, version=8, model_uri="models:/digits-classifier/8", bundle_sha256="12" * 32
    )
    alone = render(REL, params, REPO / "k8s", COMPONENTS)["deployment"]
    rendered = render(REL, params, REPO / "k8s", COMPONENTS, challenger=v8)["deployment"]
    check_manifests(rendered, require_digest=True)
    deployment = next(d for d in rendered if d["kind"] == "Deployment")
    template = deployment["spec"]["template"]
    assert template != next(d for d in alone if d["kind"] == "Deployment")["spec"]["template"]
    assert template["metadata"]["labels"]["paddle-mlops/challenger-version"] == "8"
    spec = template["spec"]
    fetchers = {c["name"]: c for c in spec["initContainers"]}
    assert fetchers["fetch-model"]["args"] == ["models:/digits-classifier/7", "/mnt/models"]
    assert fetchers["fetch-challenger"]["args"] == [
        "models:/digits-classifier/8",
        "/mnt/challenger",
    ]
    assert fetchers["fetch-challenger"]["image"] == COMPONENTS
    (server,) = spec["containers"]
    assert server["image"] == REL.image  # the champion's server runs both
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    assert mounts["/mnt/challenger"]["readOnly"] is True
    flags = [a for a in server["args"] if a.startswith("--challenger")]
    assert flags == [
        "--challenger-model-dir=/mnt/challenger", "--challenger-version=8",
        "--challenger-policy=canary", "--challenger-fraction=0.25",
    ]  # fmt: skip
    usage = subprocess.run(
        [str(server_binary), "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in server["args"]:
        assert f"  {flag.split('=')[0]}" in usage, flag  # every rendered flag is the server's
    with pytest.raises(ValueError, match="manifests \\[deployment\\] only"):
        dataclasses.replace(params, manifests=["deployment", "kserve"])


def test_templates_with_a_tag_instead_of_a_digest_are_refused_for_a_cluster():
    rel = dataclasses.replace(REL, image="registry.example.com/paddle-mlops/digits-server:v7")
    rendered = render(rel, DeployParams(), REPO / "k8s", COMPONENTS)
    with pytest.raises(StepError, match=r"containers\[server\].image.*not pinned by digest"):
        check_manifests(rendered["deployment"], require_digest=True)


def test_bad_deploy_params_name_the_field():
    from components.core.config import section

    with pytest.raises(StepError, match=r"deploy\.target: 'helm' is not one of \['none', "):
        section({"deploy": {"target": "helm"}}, "deploy", DeployParams)


# --------------------------------------------------------------------------- on this machine

NAME = "deploy-test-classifier"
# the blessing is not what these tests are about: any version of this test is blessed
LENIENT = RegisterParams(min_accuracy=0.0, max_regression=100.0, max_class_regression=100.0)


@pytest.fixture(scope="module")
def other_export(tmp_path_factory, digits_task, digits_data) -> Path:
    """A second real model with other weights (another seed, not trained): other answers."""
    return untrained_export(tmp_path_factory.mktemp("other_export"), digits_task, digits_data, 11)


def track_and_register(server, outputs, root: Path, task, data: Path, note: str = "") -> int:
    """The real track and register steps on ``outputs`` (blessed by LENIENT): the version.
    Another ``note`` is another params.yaml, so the same files become a new version."""
    return track_register_promote(server.uri, outputs, root, task, data, **_steps(note)).version


def _steps(note: str = "", promote: PromoteParams | None = None) -> dict:
    """This module's arguments of :func:`tests.conftest.track_register_promote`."""
    all_params = {"task": {"name": "digits", "options": TASK_OPTIONS}}
    if note:
        all_params["note"] = note
    return {
        "all_params": all_params,
        "experiment": "deploy-tests",
        "model_name": NAME,
        "register": LENIENT,
        "promote": promote,
    }


def release_version(
    server, host: str, images: dict, step_outputs, bundle: Path, root: Path, task, data: Path
) -> Path:
    """The pipeline's own steps from serving_image to promote, for ``bundle``: the image is
    built, infra-validated, tracked, registered, blessed, pushed to ``host`` and promoted."""
    infra = root / "infra"
    serving_image_run(
        ServingImageParams(
            image_repository=f"{host}/paddle-mlops/digits-server",
            builder="podman",
            server_image=images["server"]["ref"],
            variants=["fp32"],
            golden_samples=16,
            latency_requests=5,
            **WIRING_LATENCY_BUDGET,
        ),
        task,
        bundle,
        data,
        infra,
    )
    outputs = dataclasses.replace(step_outputs, bundle=bundle, infra=infra)
    promote = PromoteParams(auto_promote=True, push=True)
    track_register_promote(server.uri, outputs, root, task, data, **_steps(promote=promote))
    return root / "promote"


def served(url: str, bundle: Path, golden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the server's logits, the in-process Paddle Inference logits of ``bundle``)."""
    signature = read_json(bundle / "signature.json")
    got = KServeClient(url).infer(NAME, {signature["inputs"][0]["name"]: golden}, binary=True)
    program = bundle / signature["formats"]["pir"]["program"]
    expected = PaddlePredictor(ModelFiles.in_dir(program.parent, program.stem)).predict([golden])
    return got[signature["outputs"][0]["name"]], expected


def assert_serves(url: str, bundle: Path, golden: np.ndarray, version: int) -> np.ndarray:
    got, expected = served(url, bundle, golden)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-3)
    assert str(version) in KServeClient(url).metadata(NAME)["versions"]
    return got


def assert_settings(url: str, bundle: Path, infra: Path) -> None:
    """What was validated is what is served: the deployed server runs with the settings of
    the bundle's model_config.json, and those are the ones infra validation served."""
    expected = read_json(bundle / "model_config.json")
    served = KServeClient(url).model_config(NAME)["settings"]
    assert {k: served[k] for k in expected} == expected
    for report in read_json(infra / "infra.json")["variants"]:
        assert {k: report["checks"]["model_config"]["served"][k] for k in expected} == expected


def container_id(name: str) -> str:
    return subprocess.run(
        ["podman", "inspect", "--format", "{{.Id}}", name],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


class Streaming:
    """A client sending ``x`` to the deployed server in a loop (bounded) while the block runs:
    the versions that answered, and every failure."""

    def __init__(self, url: str, x: np.ndarray):
        self.client = httpclient.InferenceServerClient(url.split("://")[-1], network_timeout=30)
        self.input = httpclient.InferInput("image", list(x.shape), "FP32")
        self.input.set_data_from_numpy(x, binary_data=True)
        self.versions: set[str] = set()
        self.errors: list[str] = []
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        for _ in range(200_000):
            if self._stop.is_set():
                return
            try:
                answer = self.client.infer(NAME, [self.input])
                self.versions.add(answer.get_response()["model_version"])
                self.count += 1
            except Exception as exc:  # noqa: BLE001 - every failure is the finding
                self.errors.append(repr(exc))
            time.sleep(0.002)

    def summary(self) -> str:
        return f"{self.count} answers from {sorted(self.versions)}, errors {self.errors[:3]}"

    def __enter__(self) -> Streaming:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.5)  # answers from the new version too
        self._stop.set()
        self._thread.join(60)


def test_promote_serve_rollback_with_real_containers(
    server, oci_registry, images, step_outputs, exported, other_export, digits_task,
    digits_data, tmp_path, monkeypatch,
):  # fmt: skip
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    params = DeployParams(
        target="podman",
        server_variant="fp32",
        local_port=free_port(),
        local_name=f"paddle-mlops-deploy-test-{os.getpid()}",
        local_state_dir=str(tmp_path / "state"),
        rollout_timeout_s=120,
    )
    golden = digits_task.eval_head(digits_data, "test", 16)[0][0]
    args = (server, oci_registry, images, step_outputs)
    # the package step's bundles; v2 with other server settings in its model_config.json
    v1 = fp32_bundle(exported, tmp_path / "bundle1")
    v2 = fp32_bundle(other_export, tmp_path / "bundle2", workers=1, max_batch_size=16)
    try:
        promoted = release_version(*args, v1, tmp_path / "v1", digits_task, digits_data)
        assert read_json(promoted / "promotion.json")["image_signature"].endswith(".sig")
        first = deploy_run(params, promoted, tmp_path / "deploy1")
        assert (first["version"], first["deployed"]) == (1, True)
        # the signed provenance, matching the lineage tags, and the image signature verified
        assert first["verified"]["verified"] is True
        assert first["verified"]["image"]["ref"] == first["image"]
        policy = read_json(tmp_path / "deploy1" / "policy.json")
        repo = first["image"].split("@")[0]
        assert policy["transports"]["docker"][repo][0]["type"] == "sigstoreSigned"
        assert first["image"].startswith(f"{oci_registry}/paddle-mlops/digits-server@sha256:")
        one = assert_serves(first["local"]["url"], v1, golden, 1)
        assert first["local"]["method"] == "restart"  # nothing ran before
        assert_settings(first["local"]["url"], v1, tmp_path / "v1" / "infra")
        container = container_id(params.local_name)

        # v2: same server image, so it is loaded into the running server while a client
        # keeps sending requests: none fails, the container stays, and v2 runs with its own
        # bundle's settings
        # v2 as the monitor's alarm starts it: the reason lands on the run and the version
        why = "monitor: ALARM digits version 1: input:mean (ks_2samp p=1e-09 < 0.00071)"
        monkeypatch.setenv(RETRAIN_REASON_ENV, why)
        promoted = release_version(*args, v2, tmp_path / "v2", digits_task, digits_data)
        monkeypatch.delenv(RETRAIN_REASON_ENV)
        mv2 = mlflow_client(server.uri).get_model_version(NAME, "2")
        assert mv2.tags["retrain_reason"] == why
        assert mlflow_client(server.uri).get_run(mv2.run_id).data.tags["retrain_reason"] == why
        assert "retrain_reason" not in mlflow_client(server.uri).get_model_version(NAME, "1").tags
        with Streaming(first["local"]["url"], golden[:1]) as stream:
            second = deploy_run(params, promoted, tmp_path / "deploy2")
        assert second["version"] == 2 and second["image"] != first["image"]
        assert second["local"]["method"] == "load"
        assert container_id(params.local_name) == container
        assert stream.errors == [] and {"1", "2"} <= stream.versions, stream.summary()
        two = assert_serves(second["local"]["url"], v2, golden, 2)
        assert not np.allclose(one, two, atol=1e-2)  # the check can tell the versions apart
        assert_settings(second["local"]["url"], v2, tmp_path / "v2" / "infra")
        # the server logged both versions' answers into the state directory, through the
        # swap, every record whole (the monitor reads this directory)
        log_dir = Path(second["local"]["prediction_log"])
        assert log_dir == tmp_path / "state" / "predictions"
        deadline = time.monotonic() + 10
        while True:
            reader = LogReader(log_dir)
            versions = {r.version for r in reader}
            if {"1", "2"} <= versions or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert {"1", "2"} <= versions and reader.torn == 0, versions

        # rollback in the registry, then the deploy step's CLI (what a user runs)
        Registry(mlflow_client(server.uri), NAME, RegistryParams()).rollback(reason="test")
        params_file = tmp_path / "params.yaml"
        params_file.write_text(
            yaml.safe_dump(
                {
                    "deploy": {**dataclasses.asdict(params), "swap": "restart"},
                    "registry": {"model_name": NAME},
                }
            )
        )
        proc = subprocess.run(
            [sys.executable, "-m", "components", "deploy", "--params", str(params_file),
             "--promotion", str(promoted), "--deployment", str(tmp_path / "deploy3")],
            cwd=REPO, capture_output=True, text=True, timeout=600,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        third = read_json(tmp_path / "deploy3" / "deployment.json")
        assert third["version"] == 1 and third["image"] == first["image"]
        assert third["local"]["method"] == "restart"
        assert container_id(params.local_name) != container
        assert_serves(third["local"]["url"], v1, golden, 1)
        assert_settings(third["local"]["url"], v1, tmp_path / "v1" / "infra")
        # one server container, labelled with the version it was started with
        label = subprocess.run(
            ["podman", "inspect", "--format", '{{index .Config.Labels "' + VERSION_LABEL + '"}}',
             params.local_name],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert label == "1"

        # shadow, canary, judge and rollback on live traffic: tests/test_closed_loop.py
    finally:
        subprocess.run(["podman", "rm", "--force", params.local_name], capture_output=True)
        subprocess.run(
            ["podman", "rm", "--force", f"{params.local_name}-previous"], capture_output=True
        )


@pytest.fixture(scope="module")
def unpushed(server, step_outputs, tmp_path_factory, digits_task, digits_data):
    """A version registered by the real track and register steps whose image was never
    pushed (no digest), under alias ``candidate``: what a laptop run without a registry
    leaves."""
    from components.tracking.provenance import sign_version
    from components.tracking.signing import signing_key

    root = tmp_path_factory.mktemp("unpushed")
    version = track_and_register(server, step_outputs, root, digits_task, digits_data)
    # what promote does for a blessed version it cannot push: bundle and provenance signed
    sign_version(mlflow_client(server.uri), server.uri, NAME, version, signing_key())
    mlflow_client(server.uri).set_registered_model_alias(NAME, "candidate", str(version))
    write_json(root / "promote" / "promotion.json", {"model": NAME, "version": version})
    return SimpleNamespace(version=version, promotion=root / "promote", root=root)


def test_deploy_refuses_a_version_without_an_image_digest(server, unpushed, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    params = DeployParams(target="podman", alias="candidate", local_state_dir=str(tmp_path))
    with pytest.raises(StepError, match=r"refusing to deploy:\n.*no serving image digest"):
        deploy_run(params, unpushed.promotion, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing that looks like a deployment
    # render-only (a laptop): recorded, not an error
    laptop = DeployParams(target="none", alias="candidate")
    record = deploy_run(laptop, unpushed.promotion, tmp_path / "out")
    assert record["deployed"] is False and "no serving image digest" in record["refused"]


def test_an_unblessed_challenger_is_never_served_and_that_is_no_error(
    server, unpushed, tmp_path, monkeypatch
):
    """The newest version carries ``challenger`` blessed or not; a retraining that was not
    blessed deploys nothing (the pipeline goes on), whatever else it lacks."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    client = mlflow_client(server.uri)
    version = str(unpushed.version)
    client.set_registered_model_alias(NAME, "challenger", version)
    client.set_model_version_tag(NAME, version, "blessed", "false")
    try:
        params = DeployParams(
            target="podman", alias="challenger", challenger="shadow", local_state_dir=str(tmp_path)
        )
        record = deploy_run(params, unpushed.promotion, tmp_path / "out")
    finally:
        client.set_model_version_tag(NAME, version, "blessed", "true")
    assert record["deployed"] is False and "is not blessed" in record["refused"]
    assert read_json(tmp_path / "out" / "deployment.json")["version"] == unpushed.version


def test_fetch_model_verifies_places_and_is_idempotent(server, unpushed, exported_int8, tmp_path):
    from components.tracking.fetch_model import MARKER, fetch

    uri = f"models:/{NAME}@candidate"
    got = fetch(uri, tmp_path / "m", tracking=server.uri)
    assert (got.version, got.fetched) == (unpushed.version, True)
    files = {k: v for k, v in sha256_tree(tmp_path / "m").items() if k != MARKER}
    assert files == sha256_tree(exported_int8)  # the serving bundle, byte for byte
    assert fetch(uri, tmp_path / "m", tracking=server.uri).fetched is False  # already there
    (tmp_path / "mount").mkdir()  # an emptyDir mount point: filled in place
    assert fetch(f"models:/{NAME}/{unpushed.version}", tmp_path / "mount", tracking=server.uri)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "stray.txt").write_text("x")
    with pytest.raises(StepError, match="not empty and not a verified copy"):
        fetch(uri, tmp_path / "other", tracking=server.uri)


def test_fetch_model_cli_names_a_bad_uri_and_a_missing_version(server, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": server.uri}
    for uri, message in (
        ("s3://bucket/model", "expected models:/NAME/VERSION or models:/NAME@ALIAS"),
        (f"models:/{NAME}/999", f"models:/{NAME}/999: not in the registry"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "components", "fetch-model", uri, str(tmp_path / "m")],
            capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
        )  # fmt: skip
        assert proc.returncode != 0
        assert message in proc.stderr and "Traceback" not in proc.stderr
        assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("http://pipeline:s3cr3t@mlflow:5000", "http://***@mlflow:5000"),
        ("postgresql://u:s3cr3t@db/mlflow?sslpassword=s3cr3t&x=1", "postgresql://***@db/mlflow"),
        ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ],
)
def test_tracking_uris_are_shown_without_credentials(uri, shown):
    from components.core.uris import redact_uri

    assert redact_uri(uri).startswith(shown) and "s3cr3t" not in redact_uri(uri)


def test_fetch_model_never_prints_the_credentials_of_its_tracking_uri(server, unpushed, tmp_path):
    """Credentials in the URI reach the server (basic auth) but no log line."""
    secret_uri = server.uri.replace("http://", "http://deploy:s3cr3t-pw@")
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": secret_uri}
    proc = subprocess.run(
        [sys.executable, "-m", "components", "fetch-model", f"models:/{NAME}@candidate",
         str(tmp_path / "m")],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "s3cr3t-pw" not in proc.stdout + proc.stderr
    assert "***@127.0.0.1" in proc.stderr  # the download is logged, redacted


def test_kubernetes_target_without_a_cluster_is_a_readable_error(tmp_path, monkeypatch):
    """No in-cluster service account and no kubeconfig: a clear error, not a traceback
    (this machine has no cluster: the apply itself is not exercised here)."""
    from components.kube.cluster import apply_kubernetes

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    docs = render(REL, DeployParams(manifests=["deployment"]), REPO / "k8s", COMPONENTS)
    with pytest.raises(StepError, match="no in-cluster config and no usable kubeconfig"):
        apply_kubernetes(docs["deployment"], DeployParams(target="kubernetes"))


def _pid_alive(pid: int) -> bool:
    """``pid`` is a process (a zombie is not: it ended, nobody collected it yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _repository_index(url: str, ready: bool) -> list[dict]:
    """``POST /v2/repository/index``: the versions the server holds (``ready``: serving)."""
    request = urllib.request.Request(
        f"{url}/v2/repository/index",
        data=json.dumps({"ready": ready}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def promote_signed(server, outputs, root: Path, task, data: Path, note: str) -> Path:
    """The real track, register and promote steps for ``outputs`` (no image pushed, as on a
    laptop): the version is blessed (LENIENT), signed with the session's key and made
    ``champion``; the promote step's output directory."""
    promote = PromoteParams(auto_promote=True)
    steps = _steps(note, promote=promote)
    version = track_register_promote(server.uri, outputs, root, task, data, **steps).version
    promotion = read_json(root / "promote" / "promotion.json")
    assert promotion["version"] == version and promotion["promoted"], promotion
    return root / "promote"


def test_local_deploy_loads_a_newly_promoted_version_into_the_running_server(
    server, server_binary, step_outputs, exported_int8, other_export, digits_task, digits_data,
    tmp_path, monkeypatch,
):  # fmt: skip
    """``deploy.target: local`` with ``swap: load``: the first champion starts the built C++
    server (prediction log on); a second signed champion is loaded into that same process
    with the repository API (no restart), which then answers with it alone; ``deploy stop``
    leaves no process and the log holds both versions' answers."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    state_dir = tmp_path / "state"
    params = DeployParams(
        target="local",
        server_variant="fp32",  # the second bundle ships no int8
        local_port=free_port(),
        local_grpc_port=free_port(),  # not the 8601 a `make run` here may hold
        local_state_dir=str(state_dir),
        rollout_timeout_s=120,
    )
    assert params.swap == "load" and params.prediction_log
    golden = digits_task.eval_head(digits_data, "test", 16)[0][0]
    v1_bundle = exported_int8  # the session's trained bundle, as package made it
    v2_bundle = fp32_bundle(other_export, tmp_path / "bundle2")  # other weights
    try:
        promoted = promote_signed(
            server, dataclasses.replace(step_outputs, bundle=v1_bundle), tmp_path / "v1",
            digits_task, digits_data, note="local-v1",
        )  # fmt: skip
        first = deploy_run(params, promoted, tmp_path / "deploy1")
        v1 = first["version"]
        assert first["deployed"] is True and first["verified"]["verified"] is True
        local = first["local"]
        assert local["method"] == "restart"  # nothing ran before
        pid, url = local["pid"], local["url"]
        assert url == f"http://127.0.0.1:{params.local_port}" and _pid_alive(pid)
        assert Path(local["binary"]) == server_binary.resolve()
        assert Path(local["prediction_log"]) == state_dir / "predictions"
        one = assert_serves(url, v1_bundle, golden, v1)
        KServeClient(url).infer(NAME, {"image": golden[:4]}, binary=True, request_id="to-v1")

        promoted = promote_signed(
            server, dataclasses.replace(step_outputs, bundle=v2_bundle), tmp_path / "v2",
            digits_task, digits_data, note="local-v2",
        )  # fmt: skip
        second = deploy_run(params, promoted, tmp_path / "deploy2")
        v2 = second["version"]
        assert v2 > v1 and second["verified"]["verified"] is True  # signed, verified
        assert second["local"]["method"] == "load"
        assert second["local"]["pid"] == pid and _pid_alive(pid)  # the same process
        state = read_json(state_dir / "server.json")
        assert (state["pid"], state["version"]) == (pid, v2)
        assert state["model_dir"] == second["local"]["model_dir"]
        # it serves v2 alone: metadata, the repository's ready versions, and v2's answers
        assert KServeClient(url).metadata(NAME)["versions"] == [str(v2)]
        ready = _repository_index(url, ready=True)
        assert [(e["name"], e["version"], e["state"]) for e in ready] == [(NAME, str(v2), "READY")]
        assert str(v1) in {e["version"] for e in _repository_index(url, ready=False)}  # retired
        two = assert_serves(url, v2_bundle, golden, v2)
        assert not np.allclose(one, two, atol=1e-2)  # the check can tell the versions apart
        KServeClient(url).infer(NAME, {"image": golden[:4]}, binary=True, request_id="to-v2")
        status = subprocess.run(
            [sys.executable, "-m", "components", "deploy", "status", "--params",
             str(_params_file(tmp_path, params))],
            cwd=REPO, capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert status.returncode == 0, status.stderr[-2000:]
        assert f"{NAME} v{v2} served at {url} (pid {pid}" in status.stderr

        # make stop: SIGTERM, the server drains (its prediction log too) and is gone
        stop = subprocess.run(
            [sys.executable, "-m", "components", "deploy", "stop", "--params",
             str(_params_file(tmp_path, params))],
            cwd=REPO, capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert stop.returncode == 0, stop.stderr[-2000:]
        _reap(pid)
        assert not _pid_alive(pid) and not (state_dir / "server.json").exists()
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", params.local_port)) != 0  # nothing listens
        reader = LogReader(state_dir / "predictions")
        answered = {r.id: r.version for r in reader if r.id in ("to-v1", "to-v2")}
        assert answered == {"to-v1": str(v1), "to-v2": str(v2)} and reader.torn == 0, answered
    finally:
        from components.ml.serving import local_server

        local_server.stop(state_dir)  # a no-op when the test got to its stop


def _params_file(root: Path, params: DeployParams) -> Path:
    path = root / "params.yaml"
    doc = {"deploy": dataclasses.asdict(params), "registry": {"model_name": NAME}}
    path.write_text(yaml.safe_dump(doc))
    return path


def _reap(pid: int) -> None:
    """Collect the ended ``pid`` if this process started it (deploy_run did): no zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def test_fetch_model_refuses_files_changed_after_registration(server, unpushed, tmp_path):
    """Last in the module: it corrupts the artifact store of the version it checks."""
    from components.tracking.fetch_model import fetch

    client = mlflow_client(server.uri)
    model_id = client.get_model_version(NAME, str(unpushed.version)).tags["mlflow_model_id"]
    params = [
        p
        for p in server.artifacts.rglob("*.pdiparams")
        if model_id in p.as_posix() and "int8" not in p.as_posix()
    ]
    assert params, f"no stored .pdiparams of {model_id} under {server.artifacts}"
    data = bytearray(params[0].read_bytes())
    data[-1] ^= 0xFF
    params[0].write_bytes(bytes(data))
    with pytest.raises(
        StepError, match="its files changed after registration; refusing to serve it"
    ):
        fetch(f"models:/{NAME}/{unpushed.version}", tmp_path / "m", tracking=server.uri)
    assert not (tmp_path / "m").exists()
