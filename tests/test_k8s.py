"""Kubernetes manifests: every file under k8s/ passes ``components.kube.check`` (strict
Kubernetes schemas, the vendored KServe and training-operator CRDs, the hardening policy),
wired to Secrets (never literal credentials), and the MLflow server's command line accepted by
the mlflow version we pin."""

from __future__ import annotations

import copy
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.core.artifacts import StepError
from components.kube import crds
from components.kube.check import (
    PLACEHOLDER_DIGEST,
    check_manifests,
    load_manifests,
    manifest_files,
    manifest_problems,
)
from components.ml.serving.model_config import SETTINGS
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
    """``kubectl apply -k k8s/`` and the serving templates the deploy step applies."""
    files = kustomize_resources(K8S) + kustomize_resources(K8S / "serving")
    return [(f, d) for f in files for d in yaml.safe_load_all(f.read_text()) if d]


def kubernetes_validate_strict(files: list[Path]) -> None:
    """The ``kubernetes-validate --strict`` CLI on ``files`` passes."""
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


def test_every_applied_file_exists_and_validates_against_the_schemas():
    files = kustomize_resources(K8S)
    assert {f.name for f in files} >= {
        "namespace.yaml",
        "postgres.yaml",
        "mlflow-server.yaml",
        "client-env.yaml",
    }
    kubernetes_validate_strict(files)


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


def test_mlflow_server_reads_its_credentials_from_secrets_never_from_its_command_line():
    env = {e["name"]: e for e in _container("mlflow")["env"]}
    for var, secret in (
        ("MLFLOW_BACKEND_STORE_URI", "mlflow-db"),  # what --backend-store-uri reads
        ("AWS_ACCESS_KEY_ID", "mlflow-s3"),
        ("AWS_SECRET_ACCESS_KEY", "mlflow-s3"),
    ):
        assert env[var]["valueFrom"]["secretKeyRef"]["name"] == secret
    args = " ".join(_container("mlflow")["args"])
    assert "postgresql://" not in args and "PASSWORD" not in args
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


def test_serving_deployment_probes_the_servers_health_endpoints():
    """Hardening, resources and probes' presence: test_manifests_pass_the_checker."""
    container = _container("digits-server")
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    kinds = {d["kind"] for _, d in documents()}
    assert {"HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds


def _kserve_docs() -> dict[str, dict]:
    return {d["kind"]: d for d in load_manifests(kustomize_resources(K8S / "kserve"))}


def test_kserve_variant_follows_the_custom_runtime_contract():
    """KServe's custom-runtime contract; the schema (KServe's models) and the policy (no
    Knative-reserved PORT, hardening, probes) are test_manifests_pass_the_checker's."""
    docs = _kserve_docs()
    runtime = docs["ServingRuntime"]["spec"]
    container = runtime["containers"][0]
    assert container["name"] == "kserve-container"
    assert container["ports"][0]["containerPort"] == 8080  # the server's default port
    assert "--model-dir=/mnt/models" in container["args"]
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


# The server's per-model settings: model_config.json keys, and the flags/variables that would
# override the bundle's file (its JSON Schema; the server: tests/test_model_config_schema.py).
PER_MODEL = set(SETTINGS)  # components/ml/serving/model_config/model_config.schema.json


def _workloads(directory: Path) -> list[dict]:
    return [
        d
        for f in kustomize_resources(K8S / directory)
        for d in yaml.safe_load_all(f.read_text())
        if d and d["kind"] in ("Deployment", "ServingRuntime")
    ]


@pytest.mark.parametrize("directory", ["serving", "kserve"])
def test_no_server_setting_is_copied_under_k8s(directory):
    """The server's settings travel in the bundle (model_config.json): no manifest restates
    them as an environment variable, a flag or a generated ConfigMap, which would override
    what infra validation served."""
    assert not list(K8S.rglob("server.env"))
    kustomization = yaml.safe_load((K8S / directory / "kustomization.yaml").read_text())
    assert "configMapGenerator" not in kustomization
    (doc,) = _workloads(directory)
    spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"]
    container = spec["containers"][0]
    names = {e["name"] for e in container.get("env", [])}
    assert not names & {f"SERVING_{k.upper()}" for k in PER_MODEL}
    assert "PORT" not in names  # Knative reserves it; the server's default is 8080
    flags = {"--" + k.replace("_", "-") for k in PER_MODEL}
    assert not [a for a in container.get("args", []) if a.split("=")[0] in flags]
    assert "--model-dir=/mnt/models" in container["args"]  # where the bundle (and file) is
    text = "\n".join(f.read_text() for f in K8S.rglob("*.yaml"))
    for key in PER_MODEL:
        assert f"SERVING_{key.upper()}" not in text, key


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
@pytest.mark.parametrize(
    ("directory", "kind"), [("serving", "Deployment"), ("kserve", "ServingRuntime")]
)
def test_kustomize_pins_the_server_image_and_adds_no_settings(directory, kind):
    proc = subprocess.run(
        ["kubectl", "kustomize", str(K8S / directory)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    (workload,) = [d for d in docs if d["kind"] == kind]
    spec = workload["spec"]["template"]["spec"] if kind == "Deployment" else workload["spec"]
    # kustomize images: pins the placeholder name by the placeholder digest
    image = spec["containers"][0]["image"]
    assert image == f"registry.example.com/paddle-mlops/digits-server@{PLACEHOLDER_DIGEST}"
    assert "SERVING_" not in proc.stdout
    check_manifests(docs, what=f"kubectl kustomize k8s/{directory}")


# --------------------------------------------------------------------------- components.kube.check

# each directory under k8s/ with a kustomization.yaml: all its YAML documents
# (kustomization.yaml and kustomizeconfig.yaml are not resources)
KUSTOMIZE_DIRS = sorted(p.parent for p in K8S.rglob("kustomization.yaml"))


def test_every_manifest_under_k8s_is_in_a_checked_directory():
    checked = {f for d in KUSTOMIZE_DIRS for f in manifest_files(d)}
    every = {
        f
        for f in K8S.rglob("*")
        if f.suffix in (".yaml", ".yml")
        and f.name not in ("kustomization.yaml", "kustomizeconfig.yaml")
    }
    assert every == checked, sorted(every ^ checked)
    assert {d.relative_to(K8S).as_posix() for d in KUSTOMIZE_DIRS} >= {
        ".",
        "serving",
        "kserve",
        "pipelines",
        "mlflow",
    }


@pytest.mark.parametrize(
    "directory", [pytest.param(d, id=d.relative_to(K8S).as_posix()) for d in KUSTOMIZE_DIRS]
)
def test_manifests_pass_the_checker(directory):
    """Strict Kubernetes schemas, KServe's models, the hardening policy; image digests are
    the deploy step's (require_digest=True there), the templates carry placeholders."""
    docs = load_manifests(manifest_files(directory))
    assert docs
    check_manifests(docs, require_digest=False, what=str(directory.relative_to(REPO)))


@pytest.mark.parametrize("directory", ["serving", "kserve", "."])
def test_kustomize_pins_our_images_by_a_placeholder_digest_not_a_tag(directory):
    images = yaml.safe_load((K8S / directory / "kustomization.yaml").read_text())["images"]
    for image in images:
        assert "newTag" not in image, image
        assert image["digest"] == PLACEHOLDER_DIGEST, image
        assert "/" in image["newName"] and image["name"] in (
            "digits-server",
            "paddle-mlops-components",
        )


def test_no_kustomization_uses_the_latest_tag():
    for path in K8S.rglob("kustomization.yaml"):
        for image in yaml.safe_load(path.read_text()).get("images") or []:
            assert str(image.get("newTag")) != "latest", path


def _runtime() -> dict:
    return copy.deepcopy(_kserve_docs()["ServingRuntime"])


def _problems(doc: dict, **kwargs) -> list[str]:
    with pytest.raises(StepError) as err:
        check_manifests([doc], **kwargs)
    problems = manifest_problems([doc], **kwargs)
    assert all(p in str(err.value) for p in problems)  # the error lists every one
    return problems


def test_checker_rejects_port_in_a_serving_runtime():
    doc = _runtime()
    doc["spec"]["containers"][0]["env"] = [{"name": "PORT", "value": "8080"}]
    assert _problems(doc) == [
        "ServingRuntime/paddle-mlops-cpp: spec.containers[kserve-container].env[PORT]: "
        "reserved by Knative (KServe serverless), which sets it itself"
    ]


def test_checker_rejects_a_container_that_keeps_its_capabilities():
    doc = _runtime()
    del doc["spec"]["containers"][0]["securityContext"]["capabilities"]
    assert _problems(doc) == [
        "ServingRuntime/paddle-mlops-cpp: spec.containers[kserve-container]"
        ".securityContext.capabilities.drop: must include ALL"
    ]


def test_checker_rejects_a_container_without_limits():
    (job,) = [
        d for d in load_manifests([K8S / "pipelines" / "schedule-job.yaml"]) if d["kind"] == "Job"
    ]
    del job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert _problems(job) == [
        f"Job/register-retraining-schedule: spec.template.spec.containers[schedule]"
        f".resources.limits.{r}: missing"
        for r in ("cpu", "memory")
    ]


def test_checker_rejects_an_unknown_field_in_an_inference_service():
    isvc = copy.deepcopy(_kserve_docs()["InferenceService"])
    isvc["spec"]["predictor"]["model"]["storageURI"] = isvc["spec"]["predictor"]["model"].pop(
        "storageUri"
    )
    isvc["spec"]["predictor"]["replicas"] = 2  # minReplicas/maxReplicas in KServe
    assert _problems(isvc) == [
        "InferenceService/digits-classifier: spec.predictor: Additional properties are not "
        "allowed ('replicas' was unexpected)",
        "InferenceService/digits-classifier: spec.predictor.model: Additional properties are "
        "not allowed ('storageURI' was unexpected)",
    ]


def test_the_crd_schemas_are_the_vendored_upstream_files_and_an_edited_copy_is_refused(
    tmp_path, monkeypatch
):
    """Every file under components/kube/crds/ has its row in SOURCES.json (upstream repository,
    release, commit, path, sha256), the checker covers each vendored kind, and a copy whose
    bytes differ from the recorded sha256 is refused naming the file and its source."""
    files = sorted(
        p.name
        for p in crds.CRD_DIR.iterdir()
        if p.suffix in (".yaml", ".json") and p != crds.SOURCES_FILE
    )
    rows = crds.sources()
    assert sorted(r["file"] for r in rows) == files
    for row in rows:
        assert (
            hashlib.sha256((crds.CRD_DIR / row["file"]).read_bytes()).hexdigest() == row["sha256"]
        )
        assert re.fullmatch(r"[0-9a-f]{40}", row["commit"]) and row["ref"] and row["path"]
    assert {k for (_, k) in crds.kinds()} == {
        "InferenceService",
        "ServingRuntime",
        "ClusterServingRuntime",
        "ClusterStorageContainer",
        "PaddleJob",
        "ClusterImagePolicy",
        "Experiment",
    }
    edited = tmp_path / "crds"
    shutil.copytree(crds.CRD_DIR, edited)
    target = edited / "kubeflow.org_paddlejobs.yaml"
    target.write_bytes(target.read_bytes().replace(b"format: int32", b"format: int64", 1))
    monkeypatch.setattr(crds, "CRD_DIR", edited)
    crds._crd.cache_clear()
    try:
        with pytest.raises(
            StepError,
            match=r"kubeflow.org_paddlejobs.yaml: sha256 .* is not the "
            r"vendored .*training-operator release-1.9",
        ):
            crds.schema.__wrapped__("kubeflow.org", "PaddleJob")
    finally:
        crds._crd.cache_clear()


def test_crd_schemas_follow_the_api_servers_structural_rules():
    """What the CRDs mark: status keeps unknown fields (x-kubernetes-preserve-unknown-fields),
    a quantity is an integer or a string matching the pattern, int32 is bounded."""
    isvc = copy.deepcopy(_kserve_docs()["InferenceService"])
    isvc["status"] = {"anything": {"the": "controller writes"}}
    isvc["spec"]["predictor"]["minReplicas"] = 1
    resources = isvc["spec"]["predictor"]["model"].setdefault("resources", {})
    resources["limits"] = {"cpu": 2, "memory": "1Gi"}
    resources["requests"] = {"cpu": "500m", "memory": "512Mi"}
    assert manifest_problems([isvc]) == []
    isvc["spec"]["predictor"]["minReplicas"] = 2**31
    resources["limits"]["memory"] = "a lot"
    problems = _problems(isvc)
    assert any("spec.predictor.minReplicas: 2147483648 is greater than" in p for p in problems)
    assert any("resources.limits.memory: 'a lot'" in p for p in problems)


def test_checker_rejects_the_wrong_type_and_a_missing_required_field_in_kserve_kinds():
    doc = _runtime()
    doc["spec"]["containers"][0]["ports"][0]["containerPort"] = "8080"
    doc["spec"]["supportedModelFormats"][0].pop("name")
    problems = _problems(doc)
    assert any("containers[0].ports[0].containerPort: '8080' is not of type" in p for p in problems)
    assert any("supportedModelFormats[0]: 'name' is a required property" in p for p in problems)


@pytest.mark.parametrize(
    ("image", "problem"),
    [
        ("registry.example.com/paddle-mlops/digits-server:latest", "the mutable tag :latest"),
        ("registry.example.com/paddle-mlops/digits-server:1.0", "is not pinned by digest"),
        ("digits-server", "is not pinned by digest"),
        (f"registry.example.com/paddle-mlops/digits-server@{PLACEHOLDER_DIGEST}", "placeholder"),
        ("registry.example.com/paddle-mlops/digits-server@sha256:abc", "64 lowercase hex"),
    ],
)
def test_checker_requires_a_real_digest_when_asked(image, problem):
    doc = _runtime()
    doc["spec"]["containers"][0]["image"] = image
    (found,) = _problems(doc, require_digest=True)
    assert found.startswith("ServingRuntime/paddle-mlops-cpp: spec.containers[kserve-container]")
    assert problem in found


def test_checker_takes_a_digest_pinned_image_and_latest_never():
    doc = _runtime()
    doc["spec"]["containers"][0]["image"] = (
        "registry.example.com/paddle-mlops/digits-server@sha256:" + "ab" * 32
    )
    check_manifests([doc], require_digest=True)
    doc["spec"]["containers"][0]["image"] = "registry.example.com/x/digits-server:latest"
    assert "the mutable tag :latest" in _problems(doc)[0]  # with or without require_digest


def test_checker_lists_every_problem_of_every_document():
    runtime = _runtime()
    container = runtime["spec"]["containers"][0]
    container["securityContext"] = {}
    del container["readinessProbe"]
    deployment = copy.deepcopy(
        next(
            d for d in load_manifests(manifest_files(K8S / "serving")) if d["kind"] == "Deployment"
        )
    )
    deployment["spec"]["template"]["spec"].pop("securityContext")
    problems = manifest_problems([runtime, deployment, {"kind": "Widget"}])
    text = "\n".join(problems)
    for needle in (
        "ServingRuntime/paddle-mlops-cpp: spec.containers[kserve-container].readinessProbe",
        "ServingRuntime/paddle-mlops-cpp: spec.containers[kserve-container].securityContext"
        ".runAsNonRoot",
        "ServingRuntime/paddle-mlops-cpp: spec.containers[kserve-container].securityContext"
        ".readOnlyRootFilesystem",
        "Deployment/digits-server: spec.template.spec.containers[server].securityContext"
        ".runAsNonRoot: must be true (on the container or its pod)",
        "Deployment/digits-server: spec.template.spec.containers[server].securityContext"
        ".seccompProfile.type",
        "Widget/<document 2>: apiVersion, kind and metadata.name are required",
    ):
        assert needle in text, text


def test_checker_applies_the_policy_to_init_containers_and_cluster_storage_containers():
    deployment = copy.deepcopy(
        next(
            d for d in load_manifests(manifest_files(K8S / "serving")) if d["kind"] == "Deployment"
        )
    )
    pod = deployment["spec"]["template"]["spec"]
    init = copy.deepcopy(pod["containers"][0]) | {"name": "fetch-model"}
    pod["initContainers"] = [init]
    assert _problems(deployment) == [
        f"Deployment/digits-server: spec.template.spec.initContainers[fetch-model].{p}: "
        "not allowed on an init container"
        for p in ("readinessProbe", "livenessProbe", "startupProbe")
    ]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        del init[probe]
    del init["securityContext"]["readOnlyRootFilesystem"]
    assert _problems(deployment) == [
        "Deployment/digits-server: spec.template.spec.initContainers[fetch-model]"
        ".securityContext.readOnlyRootFilesystem: must be true"
    ]
    storage = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ClusterStorageContainer",
        "metadata": {"name": "models-uri"},
        "spec": {
            "container": {"name": "storage-initializer", "image": "paddle-mlops-components"},
            "supportedUriFormats": [{"prefix": "models:/"}],
        },
    }
    problems = _problems(storage)
    assert problems and all(
        p.startswith("ClusterStorageContainer/models-uri: spec.container[storage-initializer].")
        for p in problems
    )
    assert not any("Probe" in p for p in problems)  # an init container: no probes wanted


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
@pytest.mark.parametrize("directory", ["serving", "kserve"])
def test_with_a_real_digest_set_the_rendered_manifests_pass_require_digest(directory, tmp_path):
    """What the deploy step (or `kustomize edit set image`) does to the placeholder digest."""
    shutil.copytree(K8S / directory, tmp_path / directory)
    kustomization = tmp_path / directory / "kustomization.yaml"
    data = yaml.safe_load(kustomization.read_text())
    for image in data["images"]:
        image["digest"] = "sha256:" + "ab" * 32
    kustomization.write_text(yaml.safe_dump(data))
    proc = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path / directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    check_manifests([d for d in yaml.safe_load_all(proc.stdout) if d], require_digest=True)


# --------------------------------------------------------------------------- MLflow auth
# (k8s/mlflow: basic-auth server, hardening, NetworkPolicies, the mlflow-users Job)


def test_mlflow_is_authenticated_hardened_and_fenced():
    from mlflow.cli import cli

    mlflow_dir = K8S / "mlflow"
    files = [
        mlflow_dir / f
        for f in yaml.safe_load((mlflow_dir / "kustomization.yaml").read_text())["resources"]
    ]
    kubernetes_validate_strict(files)
    docs = {
        (d["kind"], d["metadata"]["name"]): d
        for f in files
        for d in yaml.safe_load_all(f.read_text())
        if d
    }
    pods = {
        name: docs[(kind, name)]["spec"]["template"]
        for kind, name in (
            ("Deployment", "mlflow"),
            ("StatefulSet", "mlflow-postgres"),
            ("Job", "mlflow-users"),
        )
    }

    # the server: basic-auth, no credential on its command line
    server = pods["mlflow"]["spec"]["containers"][0]
    args = server["args"]
    assert "--app-name=basic-auth" in args
    assert not [
        a for a in args if "backend-store-uri" in a or "postgresql:" in a or "PASSWORD" in a
    ]
    options = {p.name: p for p in cli.commands["server"].params}
    assert "basic-auth" in options["app_name"].type.choices
    env = {e["name"]: e for e in server["env"]}
    assert env[options["backend_store_uri"].envvar]["valueFrom"]["secretKeyRef"] == {
        "name": "mlflow-db",
        "key": "backend_store_uri",
    }
    assert env["MLFLOW_FLASK_SERVER_SECRET_KEY"]["valueFrom"]["secretKeyRef"]["name"] == (
        "mlflow-auth-config"
    )
    config = docs[("ConfigMap", "mlflow-server")]["data"]["MLFLOW_AUTH_CONFIG_PATH"]
    (mount,) = [m for m in server["volumeMounts"] if config.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pods["mlflow"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "mlflow-auth-config" and mount["readOnly"]

    # hardening of the server and the database (the Job's: test_manifests_pass_the_checker)
    for name in ("mlflow", "mlflow-postgres"):
        spec = pods[name]["spec"]
        (c,) = spec["containers"]
        sec, pod_sec = c["securityContext"], spec["securityContext"]
        assert pod_sec["runAsNonRoot"] and pod_sec["seccompProfile"]["type"] == "RuntimeDefault"
        assert sec["readOnlyRootFilesystem"] is True and sec["allowPrivilegeEscalation"] is False
        assert sec["capabilities"]["drop"] == ["ALL"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), (name, kind)
        assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(c), name
        empty = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        writable = {m["mountPath"] for m in c["volumeMounts"] if m["name"] in empty}
        assert "/tmp" in writable, name
    postgres = pods["mlflow-postgres"]["spec"]["containers"][0]
    assert "/var/run/postgresql" in {m["mountPath"] for m in postgres["volumeMounts"]}
    assert "PGDATA" in {e["name"] for e in postgres["env"]}
    assert "POSTGRES_PASSWORD" not in {e["name"] for e in postgres["env"]}  # a file instead
    # no floating tag: placeholder names that kustomize pins by digest
    images = {
        i["name"]: i
        for i in yaml.safe_load((mlflow_dir / "kustomization.yaml").read_text())["images"]
    }
    for name, image in (("mlflow", "mlflow-server"), ("mlflow-postgres", "mlflow-postgres")):
        assert pods[name]["spec"]["containers"][0]["image"] == image
        assert (
            re.fullmatch(r"sha256:[0-9a-f]{64}", images[image]["digest"])
            and "newTag" not in images[image]
        )

    # who may connect: labelled client pods + the UI's ingress namespace; postgres: mlflow only
    label = {"paddle-mlops/mlflow-client": "true"}
    policy = docs[("NetworkPolicy", "mlflow")]["spec"]
    assert (
        policy["podSelector"]["matchLabels"].items() <= pods["mlflow"]["metadata"]["labels"].items()
    )
    (rule,) = policy["ingress"]
    assert {"podSelector": {"matchLabels": label}} in rule["from"]
    assert any("namespaceSelector" in peer and "podSelector" not in peer for peer in rule["from"])
    assert rule["ports"] == [{"protocol": "TCP", "port": 5000}]
    db_policy = docs[("NetworkPolicy", "mlflow-postgres")]["spec"]
    assert db_policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "mlflow-postgres"}
    assert db_policy["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "mlflow"}}}],
            "ports": [{"protocol": "TCP", "port": 5432}],
        }
    ]

    # the users Job: a client pod, credentials only as mounted Secret files
    job = pods["mlflow-users"]
    assert job["metadata"]["labels"].items() >= label.items()
    assert "app.kubernetes.io/name" in job["metadata"]["labels"]
    assert job["metadata"]["labels"]["app.kubernetes.io/name"] != "mlflow"  # not a server pod
    (c,) = job["spec"]["containers"]
    assert c["command"][-1] == "mlflow-users" and "env" not in c
    secrets = {v["secret"]["secretName"] for v in job["spec"]["volumes"] if "secret" in v}
    assert secrets == {"mlflow-auth-config", "mlflow-auth", "mlflow-deploy-auth"}
    templates = [
        d["metadata"]["name"]
        for d in yaml.safe_load_all((K8S / "pipelines" / "secrets.template.yaml").read_text())
    ]
    assert {"mlflow-auth", "mlflow-deploy-auth"} <= set(templates)


def test_the_monitor_cronjob_runs_the_real_clis_on_the_servers_log_volume():
    """The CronJob's command line parses with the real monitor and schedule parsers, reads the
    claim the serving pods write their prediction log to, at the path they write it, and
    starts a retraining run only through ``schedule trigger`` on the monitor's own report."""
    import shlex

    from components.kernel.cli import step_parser
    from components.kernel.step import load
    from pipelines.schedule import build_parser

    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in documents()}
    cron = docs[("CronJob", "paddle-mlops-monitor")]["spec"]
    assert cron["concurrencyPolicy"] == "Forbid"
    pod = cron["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = docs[("ConfigMap", "monitor-schedule")]["data"]
    script = container["args"][0]
    for var, value in env.items():
        script = script.replace(f'"${var}"', shlex.quote(value))
    monitor_cmd, trigger_cmd = (shlex.split(part) for part in script.split("&&"))
    assert monitor_cmd[:4] == ["python", "-m", "components", "monitor"]
    monitor = step_parser(load("monitor")).parse_args(monitor_cmd[4:])
    assert monitor.reference == "registry" and monitor.labels
    assert trigger_cmd[:3] == ["python", "-m", "pipelines.schedule"]
    trigger = build_parser().parse_args(trigger_cmd[3:])
    assert trigger.command == "trigger" and not trigger.dry_run
    assert Path(trigger.monitor) == Path(monitor.report) / "monitor.json"
    assert trigger.host == env["KFP_HOST"]

    # the log: the claim and sub-path the server pods write, mounted read-only here
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    (log_mount,) = [m for m in mounts.values() if Path(monitor.log).is_relative_to(m["mountPath"])]
    assert log_mount["readOnly"] is True
    claim = volumes[log_mount["name"]]["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in docs
    pvc = docs[("PersistentVolumeClaim", claim)]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    server = _container("digits-server")
    server_pod = docs[("Deployment", "digits-server")]["spec"]["template"]["spec"]
    (written,) = [v for v in server_pod["volumes"] if v.get("persistentVolumeClaim")]
    assert written["persistentVolumeClaim"]["claimName"] == claim
    (server_mount,) = [m for m in server["volumeMounts"] if m["name"] == written["name"]]
    log_flag = next(a for a in server["args"] if a.startswith("--prediction-log-dir="))
    assert log_flag.split("=", 1)[1] == server_mount["mountPath"]
    assert Path(monitor.log) == Path(log_mount["mountPath"]) / server_mount["subPath"]
    # the rest of the filesystem is read-only: what the monitor writes goes to emptyDirs
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    for path in (monitor.report, trigger.package):
        assert any(Path(path).is_relative_to(m["mountPath"]) and "emptyDir" in
                   volumes[m["name"]] for m in mounts.values()), path  # fmt: skip
    # MLflow: the client environment and credentials of the pipeline's pods
    assert {"configMapRef": {"name": "mlflow-client-env"}} in container["envFrom"]
    assert {e["name"] for e in container["env"]} >= {
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
    }


# --------------------------------------------------------------------------- provenance


def policy_glob(glob: str) -> re.Pattern[str]:
    """policy-controller's image glob (pkg/apis/glob): ``*`` any run of non-``/``
    characters, ``**`` anything, the rest literal; the whole reference must match."""
    out = ""
    for i, part in enumerate(glob.split("**")):
        out += (".*" if i else "") + "[^/]*".join(re.escape(p) for p in part.split("*"))
    return re.compile(f"^{out}$")


def test_the_image_policy_admits_the_signed_serving_images_and_nothing_unsigned():
    """k8s/policy: a ClusterImagePolicy (vendored policy-controller CRD) whose glob covers
    every serving image the kustomizations and the deploy step pin, with the promote key as
    its only authority, checked offline (no transparency log); the namespace opts in."""
    docs = load_manifests(manifest_files(K8S / "policy"))
    check_manifests(docs, require_digest=False, what="k8s/policy")
    (policy,) = docs
    assert policy["kind"] == "ClusterImagePolicy"
    globs = [policy_glob(i["glob"]) for i in policy["spec"]["images"]]
    (authority,) = policy["spec"]["authorities"]
    assert authority["key"]["secretRef"]["name"] and "ctlog" not in authority
    assert "data" not in authority["key"]  # the key is the platform's Secret, not the repo's
    digest = "@sha256:" + "ab" * 32
    servers = []
    for directory in ("serving", "kserve"):
        spec = yaml.safe_load((K8S / directory / "kustomization.yaml").read_text())
        servers += [i["newName"] for i in spec["images"] if i["name"] == "digits-server"]
    assert servers
    for server in servers:
        assert any(g.match(server + digest) for g in globs), server
        # another repository, or a components image, is not this policy's business
    assert not any(g.match("registry.example.com/paddle-mlops/components" + digest) for g in globs)
    assert not any(g.match("evil.example.com/paddle-mlops/digits-server" + digest) for g in globs)
    namespace = yaml.safe_load((K8S / "namespace.yaml").read_text())
    assert namespace["metadata"]["labels"]["policy.sigstore.dev/include"] == "true"


@pytest.mark.parametrize("directory", ["serving", "kserve"])
def test_every_model_fetcher_trusts_the_keys_of_the_configmap(directory):
    """fetch-model (init container, KServe storage initializer) gets the trusted public keys
    from ConfigMap paddle-mlops-trusted-keys, never a literal key, never verification off."""
    fetchers = []
    for doc in load_manifests(manifest_files(K8S / directory)):
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec", {})
        fetchers += [c for c in pod.get("initContainers", []) if c["name"] == "fetch-model"]
        if doc["kind"] == "ClusterStorageContainer":
            fetchers.append(spec["container"])
    assert fetchers
    for container in fetchers:
        env = {e["name"]: e for e in container["env"]}
        ref = env["PADDLE_MLOPS_TRUSTED_KEYS"]["valueFrom"]["configMapKeyRef"]
        assert ref == {"name": "paddle-mlops-trusted-keys", "key": "trusted.pub"}
        assert "value" not in env["PADDLE_MLOPS_TRUSTED_KEYS"]
