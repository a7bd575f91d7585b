"""The serving manifests, rendered from the templates in ``k8s/serving`` (Deployment, Service,
HPA, PodDisruptionBudget + the server's ConfigMap) and ``k8s/kserve`` (ServingRuntime,
InferenceService, the ``models:/`` storage initializer) and pinned to one release: the server
image by digest, the model as ``models:/NAME/VERSION`` (fetched and sha256-verified by
``paddle-mlops fetch-model`` in the init container / KServe storage initializer), the version
in labels and in the server's ``--model-version``; with a challenger, the Deployment's pods
also fetch it and start the server with ``--challenger-*`` (library layer)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from components.core.artifacts import StepError
from components.core.deploy_target import (
    CHALLENGER_DIR,
    MODEL_LABEL,
    VERSION_LABEL,
    DeploySettings,
    Release,
    server_args,
)
from components.kube.check import load_manifests

# containers the renderer fills, by name (the templates' contract)
SERVER_CONTAINERS = ("server", "kserve-container")
FETCH_CONTAINERS = ("fetch-model", "storage-initializer")
CHALLENGER_LABEL = "paddle-mlops/challenger-version"


def load_templates(directory: Path) -> list[dict[str, Any]]:
    """The documents of the files ``directory/kustomization.yaml`` lists under resources.
    The server's settings are not among them: they travel in the bundle (its
    ``model_config.json``), so a template carries no copy that could disagree."""

    kustomization = directory / "kustomization.yaml"
    if not kustomization.is_file():
        raise StepError(f"{kustomization}: missing (deploy.templates points at the k8s/ dir)")
    spec = yaml.safe_load(kustomization.read_text()) or {}
    paths = [directory / name for name in spec.get("resources") or []]
    for path in paths:
        if not path.is_file():
            raise StepError(f"{kustomization}: resource {path.name} is not a file below it")
    if spec.get("configMapGenerator"):
        raise StepError(
            f"{kustomization}: configMapGenerator is not rendered by deploy; the server's "
            "settings belong in the bundle's model_config.json (package.model_config), other "
            "configuration in a ConfigMap listed under resources"
        )
    return load_manifests(paths)


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc.get("kind") in ("Deployment", "StatefulSet", "Job"):
        return doc["spec"]["template"]["spec"]
    if doc.get("kind") in ("ServingRuntime", "ClusterServingRuntime", "ClusterStorageContainer"):
        spec = doc["spec"]
        return spec if "containers" in spec else {"containers": [spec["container"]]}
    return None


def _add_challenger(spec: dict[str, Any], challenger: Release) -> None:
    """The pod also fetches ``challenger`` (a copy of the fetch-model init container, into
    its own volume) and the server mounts it read-only at :data:`CHALLENGER_DIR`."""
    fetchers = [c for c in spec.get("initContainers", []) if c["name"] in FETCH_CONTAINERS]
    if not fetchers:
        return
    fetcher = copy.deepcopy(fetchers[0])
    fetcher["name"] = "fetch-challenger"
    fetcher["args"] = [challenger.model_uri, CHALLENGER_DIR]
    fetcher["volumeMounts"] = [
        {"name": "challenger", "mountPath": CHALLENGER_DIR}
        if m["mountPath"] == "/mnt/models"
        else m
        for m in fetcher.get("volumeMounts", [])
    ]
    spec["initContainers"].append(fetcher)
    models = next(v for v in spec["volumes"] if v["name"] == "models")
    spec["volumes"].append({**copy.deepcopy(models), "name": "challenger"})
    for container in spec["containers"]:
        if container["name"] in SERVER_CONTAINERS:
            container.setdefault("volumeMounts", []).append(
                {"name": "challenger", "mountPath": CHALLENGER_DIR, "readOnly": True}
            )


def render(
    rel: Release,
    params: DeploySettings,
    templates: Path,
    components_image: str,
    challenger: Release | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """The manifests of each variant in ``params.manifests``, pinned to ``rel``; with
    ``challenger``, the server pods run it beside ``rel`` (``params.challenger`` policy)."""
    rendered = {}
    for variant in params.manifests:
        directory = templates / ("serving" if variant == "deployment" else "kserve")
        docs = load_templates(directory)  # fresh objects: pinned in place
        labels = {MODEL_LABEL: rel.model, VERSION_LABEL: str(rel.version)}
        for doc in docs:
            meta = doc.setdefault("metadata", {})
            if not doc["kind"].startswith("Cluster"):
                meta["namespace"] = params.namespace
            meta.setdefault("labels", {}).update(labels)
            _pin(doc, rel, params, components_image, labels, challenger)
        rendered[variant] = docs
    return rendered


def _pin(
    doc: dict[str, Any],
    rel: Release,
    params: DeploySettings,
    components_image: str,
    labels: dict[str, str],
    challenger: Release | None = None,
) -> None:
    if doc["kind"] == "InferenceService":
        doc["spec"]["predictor"]["model"]["storageUri"] = rel.model_uri
    with_challenger = challenger is not None and doc["kind"] == "Deployment"
    if doc["kind"] == "Deployment":
        template = doc["spec"]["template"]
        template.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
        notes = template["metadata"].setdefault("annotations", {})
        notes["paddle-mlops/bundle-sha256"] = rel.bundle_sha256
        if with_challenger:  # a changed challenger changes the pod template: the pods roll
            template["metadata"]["labels"][CHALLENGER_LABEL] = str(challenger.version)
            notes["paddle-mlops/challenger-bundle-sha256"] = challenger.bundle_sha256
            notes["paddle-mlops/challenger-policy"] = (
                f"{params.challenger} {params.challenger_fraction}"
            )
    spec = _pod_spec(doc)
    if spec is None:
        return
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        if container["name"] in SERVER_CONTAINERS:
            container["image"] = rel.image
            container["args"] = server_args(rel, params, challenger if with_challenger else None)
        elif container["name"] in FETCH_CONTAINERS:
            container["image"] = components_image
            container["args"] = [
                rel.model_uri if str(a).startswith("models:/") else a
                for a in container.get("args", [])
            ]
    if with_challenger:
        _add_challenger(spec, challenger)
