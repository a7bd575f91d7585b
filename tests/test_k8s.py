"""Kubernetes manifests: schema-valid, wired to Secrets (never literal credentials), and the
MLflow server's command line accepted by the mlflow version we pin."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.config import load_params, section
from components.serving_image import (
    K8S_SERVER_ENV_FILES,
    ServingImageParams,
    render_server_env,
    server_env,
)
from tests.conftest import REPO

K8S = REPO / "k8s"


def kustomize_resources(directory: Path) -> list[Path]:
    """Files a ``kubectl apply -k`` of ``directory`` would apply (recursing into bases)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    files = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        files += kustomize_resources(path) if path.is_dir() else [path]
    return files


def documents() -> list[tuple[Path, dict]]:
    return [
        (f, d) for f in kustomize_resources(K8S) for d in yaml.safe_load_all(f.read_text()) if d
    ]


def test_every_applied_file_exists_and_validates_against_the_schemas():
    files = kustomize_resources(K8S)
    assert {f.name for f in files} >= {
        "namespace.yaml",
        "postgres.yaml",
        "mlflow-server.yaml",
        "client-env.yaml",
    }
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "kubernetes-validate"),
            "--strict",
            "--quiet",
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_credentials_in_manifests():
    for path, doc in documents():
        assert doc["kind"] != "Secret", f"{path}: Secrets are created out of band"
        text = yaml.safe_dump(doc)
        assert not re.search(
            r"(?i)(password|secret_access_key)\s*:\s*\S", text.replace("secretKeyRef", "")
        ), path


def _container(name: str) -> dict:
    for _, doc in documents():
        if doc["kind"] in ("Deployment", "StatefulSet") and doc["metadata"]["name"] == name:
            return doc["spec"]["template"]["spec"]["containers"][0]
    raise AssertionError(f"no workload {name}")


def test_mlflow_server_reads_its_credentials_from_secrets():
    env = {e["name"]: e for e in _container("mlflow")["env"]}
    for var, secret in (
        ("DB_USER", "mlflow-db"),
        ("DB_PASSWORD", "mlflow-db"),
        ("AWS_ACCESS_KEY_ID", "mlflow-s3"),
        ("AWS_SECRET_ACCESS_KEY", "mlflow-s3"),
    ):
        assert env[var]["valueFrom"]["secretKeyRef"]["name"] == secret
    args = " ".join(_container("mlflow")["args"])
    assert "postgresql://$(DB_USER):$(DB_PASSWORD)@mlflow-postgres:5432" in args
    assert "--serve-artifacts" in args


def test_mlflow_server_args_are_accepted_by_the_pinned_mlflow():
    from mlflow.cli import cli

    args = [re.sub(r"\$\((\w+)\)", "x", a) for a in _container("mlflow")["args"]]
    assert args[0] == "server"
    ctx = cli.commands["server"].make_context("server", args[1:])
    assert ctx.params["port"] == 5000 and ctx.params["serve_artifacts"] is True


def test_pipeline_pods_get_the_tracking_uri_of_the_service():
    configmaps = {d["metadata"]["name"]: d for _, d in documents() if d["kind"] == "ConfigMap"}
    uri = configmaps["mlflow-client-env"]["data"]["MLFLOW_TRACKING_URI"]
    services = {d["metadata"]["name"]: d for _, d in documents() if d["kind"] == "Service"}
    port = services["mlflow"]["spec"]["ports"][0]["port"]
    assert uri == f"http://mlflow.paddle-mlops.svc.cluster.local:{port}"


@pytest.mark.parametrize("name", ["mlflow", "mlflow-postgres"])
def test_workloads_have_probes_and_resources(name):
    container = _container(name)
    assert "readinessProbe" in container and "resources" in container


def test_serving_deployment_is_hardened_and_probed():
    container = _container("digits-server")
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    sec = container["securityContext"]
    assert sec["readOnlyRootFilesystem"] is True and sec["allowPrivilegeEscalation"] is False
    assert container["resources"]["limits"]["cpu"]
    kinds = {d["kind"] for _, d in documents()}
    assert {"HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds


def test_kserve_variant_follows_the_custom_runtime_contract():
    docs = {
        d["kind"]: d
        for f in kustomize_resources(K8S / "kserve")
        for d in yaml.safe_load_all(f.read_text())
        if d
    }
    runtime = docs["ServingRuntime"]["spec"]
    container = runtime["containers"][0]
    assert container["name"] == "kserve-container"
    assert container["ports"][0]["containerPort"] == 8080
    assert "--model-dir=/mnt/models" in container["args"]
    assert {"name": "PORT", "value": "8080"} in container["env"]  # KServe's contract
    assert runtime["protocolVersions"] == ["v2"]
    isvc = docs["InferenceService"]["spec"]["predictor"]["model"]
    assert isvc["runtime"] == docs["ServingRuntime"]["metadata"]["name"]
    assert isvc["protocolVersion"] == "v2"


def test_secret_templates_hold_no_values():
    for doc in yaml.safe_load_all((K8S / "pipelines" / "secrets.template.yaml").read_text()):
        assert doc["kind"] == "Secret"
        assert all(v == "" for v in doc["stringData"].values())


def test_pipeline_runs_get_only_namespaced_named_permissions():
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in documents()}
    role = docs[("Role", "paddle-mlops-pipeline")]
    for rule in role["rules"]:
        if "secrets" in rule["resources"]:
            assert set(rule["resourceNames"]) == {"mlflow-auth", "pipeline-s3"}
            assert rule["verbs"] == ["get"]
    assert ("ClusterRole", "paddle-mlops-pipeline") not in docs
    job = docs[("Job", "register-retraining-schedule")]["spec"]["template"]["spec"]
    assert job["serviceAccountName"] == "paddle-mlops-pipeline"
    assert "pipelines.schedule" in " ".join(job["containers"][0]["args"])
    cron = docs[("ConfigMap", "retraining-schedule")]["data"]["CRON"]
    assert len(cron.split()) == 6


REGENERATE = (
    'python -c "from components.serving_image import write_k8s_server_env; write_k8s_server_env()"'
)


def _server_flags():
    return section(load_params(REPO / "params.yaml"), "serving_image", ServingImageParams).server


def test_committed_server_env_is_rendered_from_params():
    """One source: k8s/*/server.env is params.yaml serving_image.server, byte for byte."""
    committed = sorted(K8S.rglob("server.env"))
    assert committed == sorted(K8S_SERVER_ENV_FILES), "a server.env the generator does not write"
    expected = render_server_env(_server_flags())
    for path in committed:
        assert path.read_text() == expected, (
            f"{path.relative_to(REPO)} is not params.yaml serving_image.server; "
            f"regenerate it from the repository root with: {REGENERATE}"
        )


def _generated_configmap(directory: Path) -> str:
    """The name of the one ConfigMap ``directory``'s kustomization generates from server.env."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    (generator,) = kustomization["configMapGenerator"]
    assert generator["envs"] == ["server.env"]
    return generator["name"]


@pytest.mark.parametrize(
    ("directory", "kind"), [("serving", "Deployment"), ("kserve", "ServingRuntime")]
)
def test_server_config_comes_only_from_the_generated_configmap(directory, kind):
    (doc,) = [
        d
        for f in kustomize_resources(K8S / directory)
        for d in yaml.safe_load_all(f.read_text())
        if d and d["kind"] == kind
    ]
    spec = doc["spec"]["template"]["spec"] if kind == "Deployment" else doc["spec"]
    container = spec["containers"][0]
    assert container["envFrom"] == [
        {"configMapRef": {"name": _generated_configmap(K8S / directory)}}
    ]
    names = [e["name"] for e in container.get("env", [])]
    assert names == ["PORT"], "SERVING_* belong in server.env, not restated in the manifest"
    # nor as flags, which would win over server.env
    flags = {
        "--" + k[len("SERVING_") :].lower().replace("_", "-") for k in server_env(_server_flags())
    }
    assert not [a for a in container.get("args", []) if a.split("=")[0] in flags]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
@pytest.mark.parametrize(
    ("directory", "kind"), [("serving", "Deployment"), ("kserve", "ServingRuntime")]
)
def test_kustomize_wires_the_generated_configmap_into_the_pods(directory, kind):
    proc = subprocess.run(
        ["kubectl", "kustomize", str(K8S / directory)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (workload,) = [d for d in docs if d["kind"] == kind]
    # the hashed name: a changed server.env rolls the pods
    assert configmap["metadata"]["name"].startswith(_generated_configmap(K8S / directory) + "-")
    assert configmap["data"] == server_env(_server_flags())
    spec = workload["spec"]["template"]["spec"] if kind == "Deployment" else workload["spec"]
    refs = [e["configMapRef"]["name"] for e in spec["containers"][0]["envFrom"]]
    assert refs == [configmap["metadata"]["name"]]
