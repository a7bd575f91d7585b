"""The deploy step and the model fetcher: the registry's champion is what is served.

The rendering tests check what the cluster would get; the podman test runs the whole path on
this machine with real parts: an OCI registry (``docker-registry``) on 127.0.0.1, a real
``mlflow server``, the serving images built and pushed by the pipeline's own steps, and the
server containers the deploy step starts.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from components.artifacts import StepError
from components.deploy import (
    FETCH_CONTAINERS,
    SERVER_CONTAINERS,
    VERSION_LABEL,
    DeployParams,
    Release,
    image_repository,
    render,
)
from components.k8s_check import check_manifests
from components.step import REPO

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
    # the ConfigMap kustomize would generate: hashed name, referenced by the server
    configmap = next(d for d in rendered["deployment"] if d["kind"] == "ConfigMap")
    assert configmap["metadata"]["name"].startswith("digits-server-env-")
    assert server["envFrom"][0]["configMapRef"]["name"] == configmap["metadata"]["name"]
    assert configmap["data"]["SERVING_WORKERS"]

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


def test_templates_with_a_tag_instead_of_a_digest_are_refused_for_a_cluster():
    rel = dataclasses.replace(REL, image="registry.example.com/paddle-mlops/digits-server:v7")
    rendered = render(rel, DeployParams(), REPO / "k8s", COMPONENTS)
    with pytest.raises(StepError, match=r"containers\[server\].image.*not pinned by digest"):
        check_manifests(rendered["deployment"], require_digest=True)


def test_bad_deploy_params_name_the_field():
    from components.deploy import run

    with pytest.raises(StepError, match="deploy: target must be one of"):
        run(DeployParams(target="helm"), REPO, REPO / "nowhere")
