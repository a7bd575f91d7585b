"""deploy: the champion in the registry becomes what is served.

Runs after ``promote`` (and by hand after ``paddle-mlops registry rollback``: it always deploys
whatever ``deploy.alias``, default ``champion``, names *now*). It resolves the alias once to an
immutable version and refuses a version without an image digest (``serving_image_digest``,
recorded by ``promote`` when the image was pushed) or with incomplete lineage, and one whose
signed provenance (matching its lineage tags) or image signature does not verify against the
trusted keys (``components.kube.verify``; docs/provenance.md). Then:

1. **Renders** the serving manifests from the templates in ``k8s/serving`` (Deployment,
   Service, HPA, PodDisruptionBudget + the server's ConfigMap) and ``k8s/kserve``
   (ServingRuntime, InferenceService, the ``models:/`` storage initializer), pinned to that
   version: the server image by digest, the model as ``models:/NAME/VERSION`` (fetched and
   sha256-verified by ``paddle-mlops fetch-model`` in the init container / KServe storage
   initializer), the version in labels and in the server's ``--model-version``. They are
   checked (``components.kube.check``) and written to ``serving.yaml`` / ``kserve.yaml``.
2. **Applies** them where ``deploy.target`` says:

   - ``none``: rendering only (a laptop without a cluster; the files are the deliverable);
   - ``kubernetes``: server-side apply with the official client (in-cluster config, else the
     kubeconfig), ``deploy.dry_run`` for a server-side dry run, then waits for the rollout;
   - ``podman``: this machine. The bundle is fetched and verified exactly as the init
     container does (into ``local_state_dir/models/MODEL/vN``, mounted read-only), and served
     by the server image on ``127.0.0.1:deploy.local_port`` (read-only root, no
     capabilities). With ``deploy.swap: load`` (the default) and a server already running
     the same server image and environment, the new version is **swapped in without a
     restart**: the server's repository ``load`` compiles it next to the serving version
     with the version's own settings (its bundle's ``model_config.json``), switches new
     requests to it and drains the old one, so no request fails. Otherwise (``swap:
     restart``, the first deploy, another server image or environment) the
     container is replaced by one running the version's image; if that never becomes ready
     the previous one is restarted.

With ``deploy.challenger: shadow | canary`` the ``deploy.alias`` version runs beside the
champion for ``paddle-mlops judge``: podman loads it into the running server; a cluster's
Deployment pods fetch both and start the server with ``--challenger-*`` (``manifests:
[deployment]``). A challenger never blessed, rolled back by the judge, or already promoted
is not deployed: the champion alone is (so ``judge`` then ``deploy`` converge).

``deployment.json`` records the version, image, model URI, target and what was applied. With
no champion yet (nothing was ever blessed) there is nothing to deploy: it says so and succeeds.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, model_validator

from components.core.artifacts import StepError, atomic_path, read_json, write_json, write_text
from components.core.config import load_params, params_model, section
from components.core.uris import redact_uri
from components.kernel.cli import run_cli, step_main
from components.kernel.step import REPO, In, Out, Step
from components.kube.check import check_manifests, load_manifests
from components.kube.images import _run, image_repository
from components.kube.signatures import policy_json, registries_d
from components.kube.verify import check_version
from components.ml import local_server
from components.ml.kserve_client import KServeClient, KServeError
from components.ml.server import default_build_dir, server_binary
from components.tracking.fetch_model import fetch
from components.tracking.model import BUNDLE_TAG
from components.tracking.registry import (
    CHAMPION,
    Registry,
    RegistryParams,
    tracking_uri,
)
from components.tracking.registry import client as mlflow_client
from components.tracking.signing import ACCEPT_ANYTHING, TRUST_ENV, trusted_keys

log = logging.getLogger(__name__)

VARIANTS = ("deployment", "kserve")
FIELD_MANAGER = "paddle-mlops-deploy"
# containers the renderer fills, by name (the templates' contract)
SERVER_CONTAINERS = ("server", "kserve-container")
FETCH_CONTAINERS = ("fetch-model", "storage-initializer")
VERSION_LABEL = "paddle-mlops/model-version"  # the version a container was started with
MODEL_LABEL = "paddle-mlops/model"
SERVER_IMAGE_LABEL = "paddle-mlops.server-image"  # set by the serving image's model layer
MODELS_ROOT = "/mnt/models-root"  # podman: local_state_dir/models/MODEL, read-only
PREDICTION_LOG_DIR = "/var/log/predictions"  # the server's prediction log, in its container
CHALLENGER_DIR = "/mnt/challenger"  # a cluster pod's challenger bundle (fetch-challenger)
CHALLENGER_LABEL = "paddle-mlops/challenger-version"


Port = Annotated[int, Field(gt=0, lt=65536)]  # a TCP port


@params_model
class DeployParams:
    target: Literal["none", "local", "podman", "kubernetes"] = "local"
    alias: str = CHAMPION  # the alias deployed (resolved once, to an immutable version)
    # a non-empty subset of VARIANTS
    manifests: Annotated[list[Literal["deployment", "kserve"]], Field(min_length=1)] = field(
        default_factory=lambda: list(VARIANTS)
    )
    templates: str = "k8s"  # below it: serving/ and kserve/ (kustomization.yaml lists files)
    namespace: str = "paddle-mlops"
    dry_run: bool = False  # kubernetes: server-side dry run, nothing changes
    kube_context: str | None = None  # kubeconfig context (outside a cluster)
    components_image: str | None = None  # ref@sha256 of fetch-model; default $PADDLE_MLOPS_IMAGE
    server_variant: Literal["fp32", "int8"] = "int8"  # the bundle variant the server runs
    rollout_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    local_port: Port = 8501  # podman: the server on 127.0.0.1:local_port
    # local: its KServe v2 gRPC port on 127.0.0.1 (-1: none)
    local_grpc_port: Annotated[int, Field(ge=-1, lt=65536)] = 8601
    local_name: str = "paddle-mlops-server"  # podman container name
    local_state_dir: str = ".deploy"  # podman: verified model copies, by version
    # podman: load (in place, no restart, when possible) | restart
    swap: Literal["load", "restart"] = "load"
    # the server logs every answer (serving/src/prediction_log.h) under PREDICTION_LOG_DIR:
    # podman mounts local_state_dir/predictions there, the k8s templates a volume
    prediction_log: bool = True
    prediction_log_max_bytes: Annotated[int, Field(ge=1 << 20)] = 1 << 30  # at least 1 MiB
    # none replaces the served version; shadow | canary runs the alias's version beside the
    # champion as a challenger for `paddle-mlops judge` (challenger_fraction of the traffic):
    # podman loads it into the running server, a cluster's pods start with both versions
    challenger: Literal["none", "shadow", "canary"] = "none"
    challenger_fraction: Annotated[float, Field(gt=0, le=1)] = 0.1

    @model_validator(mode="after")
    def _rules(self) -> DeployParams:
        if self.local_grpc_port == 0:
            raise ValueError("local_grpc_port must be a TCP port, or -1 (no gRPC)")
        if self.local_grpc_port == self.local_port:
            raise ValueError("local_grpc_port must differ from local_port")
        on_this_machine = self.target in ("local", "podman")
        if self.challenger != "none" and not on_this_machine and "kserve" in self.manifests:
            raise ValueError(
                "challenger on a cluster: manifests [deployment] only (the server pods run both "
                "versions and log both answers per request; KServe's canaryTrafficPercent would "
                "split requests without pairing them, which the judge needs)"
            )
        return self


@dataclass(frozen=True)
class Release:
    """One registered version, as it is deployed."""

    model: str
    version: int
    image: str  # repository@sha256:...
    model_uri: str  # models:/NAME/VERSION
    bundle_sha256: str


# --------------------------------------------------------------------------- the version


def release(registry: Registry, version: int, *, image: bool = True) -> Release:
    """The deployable facts of ``version``; refuses what cannot be pinned or traced.
    ``image`` False (``target: local``, the bundle served by the built binary): a version
    without a pushed image is deployable (its ``image`` is empty)."""

    tags = registry.version(version).tags
    problems = []
    missing = registry.missing_lineage(version)
    if missing:
        problems.append(f"lineage tags missing: {', '.join(missing)}")
    digest = tags.get("serving_image_digest", "")
    pinned = digest.startswith("sha256:") and len(digest) == 71
    if image and not pinned:
        problems.append(
            "no serving image digest (tag serving_image_digest): the image was never pushed; "
            "set promote.push (or build in the cluster) so promote records one"
        )
    if not tags.get(BUNDLE_TAG):
        problems.append(f"no {BUNDLE_TAG} tag: its files cannot be verified when fetched")
    if problems:
        raise StepError(
            f"{registry.name} v{version}: refusing to deploy:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    return Release(
        registry.name,
        version,
        f"{image_repository(tags['serving_image'])}@{digest}" if pinned else "",
        f"models:/{registry.name}/{version}",
        tags[BUNDLE_TAG],
    )


def verify_release(
    registry: Registry,
    tracking: str,
    rel: Release,
    out: Path | None = None,
    final: Path | None = None,
) -> dict[str, Any]:
    """Refuse ``rel`` unless its signed provenance (matching its lineage tags) and its image
    signature verify against the trusted keys (``components.kube.verify``); its bundle is
    verified where it is fetched. ``out``: also write the containers ``policy.json`` and
    ``registries.d/`` that make a podman with sigstore support enforce the image signature
    itself (``final``: where ``out`` will be once written)."""
    keys = trusted_keys()
    if keys is None:
        log.warning("%s=%s: deploying v%d unverified", TRUST_ENV, ACCEPT_ANYTHING, rel.version)
        return {"verified": False, "why": f"{TRUST_ENV}={ACCEPT_ANYTHING}"}
    report = check_version(registry.client, tracking, rel.model, rel.version, keys, bundle=False)
    if out is not None:  # the key that signed the image, next to the policy naming it
        image_signer = report["image"]["signed_by"]
        signer = next(k for k in keys if k.keyid == image_signer)
        write_text(out / "image-signing.pub", signer.pem.decode())
        key_path = (final or out).resolve() / "image-signing.pub"
        write_json(out / "policy.json", policy_json(rel.image, key_path))
        attachments = yaml.safe_dump(registries_d(rel.image))
        write_text(out / "registries.d" / "paddle-mlops.yaml", attachments)
    log.info("%s v%d: provenance and image signature verified", rel.model, rel.version)
    return {"verified": True, **report}


# --------------------------------------------------------------------------- rendering


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


def _server_args(
    rel: Release,
    params: DeployParams,
    challenger: Release | None = None,
    *,
    model_dir: str = "/mnt/models",
    log_dir: str = PREDICTION_LOG_DIR,
) -> list[str]:
    args = [
        f"--model-dir={model_dir}",
        f"--variant={params.server_variant}",
        f"--model-name={rel.model}",
        f"--model-version={rel.version}",
    ]
    if params.prediction_log:
        args += [
            f"--prediction-log-dir={log_dir}",
            f"--prediction-log-max-bytes={params.prediction_log_max_bytes}",
        ]
    if challenger is not None:
        args += [
            f"--challenger-model-dir={CHALLENGER_DIR}",
            f"--challenger-version={challenger.version}",
            f"--challenger-policy={params.challenger}",
            f"--challenger-fraction={params.challenger_fraction}",
        ]
    return args


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
    params: DeployParams,
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
    params: DeployParams,
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
            container["args"] = _server_args(rel, params, challenger if with_challenger else None)
        elif container["name"] in FETCH_CONTAINERS:
            container["image"] = components_image
            container["args"] = [
                rel.model_uri if str(a).startswith("models:/") else a
                for a in container.get("args", [])
            ]
    if with_challenger:
        _add_challenger(spec, challenger)


# --------------------------------------------------------------------------- kubernetes


def apply_kubernetes(docs: list[dict[str, Any]], params: DeployParams) -> list[str]:
    """Server-side apply of ``docs``; returns ``kind/name`` of each (dry run: nothing kept)."""
    from kubernetes import client, config, dynamic
    from kubernetes.config.config_exception import ConfigException

    try:
        config.load_incluster_config()
    except ConfigException:
        try:
            config.load_kube_config(context=params.kube_context)
        except (ConfigException, OSError) as exc:
            raise StepError(
                f"deploy.target kubernetes: no in-cluster config and no usable kubeconfig ({exc})"
            ) from exc
    dyn = dynamic.DynamicClient(client.ApiClient())
    applied = []
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        try:
            api = dyn.resources.get(api_version=doc["apiVersion"], kind=kind)
            dyn.server_side_apply(
                api,
                body=doc,
                name=name,
                namespace=doc["metadata"].get("namespace") if api.namespaced else None,
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
                **({"dry_run": "All"} if params.dry_run else {}),
            )
        except Exception as exc:  # the client raises ApiException/ResourceNotFoundError/...
            raise StepError(f"apply {kind}/{name} failed: {str(exc)[:500]}") from exc
        applied.append(f"{kind}/{name}")
        log.info("applied %s/%s%s", kind, name, " (server-side dry run)" if params.dry_run else "")
    return applied


def wait_rollout(docs: list[dict[str, Any]], params: DeployParams) -> None:
    """Wait until each Deployment runs its new pods and each InferenceService is Ready."""
    from kubernetes import client, dynamic

    dyn = dynamic.DynamicClient(client.ApiClient())
    deadline = time.monotonic() + params.rollout_timeout_s
    for doc in docs:
        if doc["kind"] not in ("Deployment", "InferenceService"):
            continue
        api = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        name, ns = doc["metadata"]["name"], doc["metadata"]["namespace"]
        while True:
            obj = dyn.get(api, name=name, namespace=ns).to_dict()
            if _rolled_out(obj):
                break
            if time.monotonic() > deadline:
                raise StepError(
                    f"{doc['kind']}/{name} did not become ready within "
                    f"{params.rollout_timeout_s:.0f} s (deploy.rollout_timeout_s); status: "
                    f"{str(obj.get('status'))[:400]}"
                )
            time.sleep(2)


def _rolled_out(obj: dict[str, Any]) -> bool:
    status, spec, meta = obj.get("status") or {}, obj.get("spec") or {}, obj["metadata"]
    if obj["kind"] == "Deployment":
        want = spec.get("replicas", 1)
        return (
            status.get("observedGeneration", 0) >= meta.get("generation", 0)
            and status.get("updatedReplicas", 0) >= want
            and status.get("availableReplicas", 0) >= want
            and status.get("replicas", 0) == status.get("updatedReplicas", 0)
        )
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return conditions.get("Ready") == "True"


# --------------------------------------------------------------------------- podman


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:

    proc = _run(["podman", *args])
    if check and proc.returncode != 0:
        raise StepError(f"podman {args[0]} failed: {proc.stderr.strip()[-600:]}")
    return proc


def _exists(name: str) -> bool:
    return _podman("container", "exists", name, check=False).returncode == 0


def _wait_ready(url: str, timeout_s: float, name: str) -> bool:

    client = KServeClient(url, timeout=5)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.ready():
            return True
        state = _podman("inspect", "--format", "{{.State.Status}}", name, check=False)
        if state.stdout.strip() in ("exited", "stopped"):
            return False
        time.sleep(0.5)
    return False


def _image_config(ref: str) -> tuple[str, list[str]]:
    """The server image a serving image was built on, and its environment."""
    proc = _podman(
        "image", "inspect", "--format",
        '{{index .Config.Labels "' + SERVER_IMAGE_LABEL + '"}}\n{{json .Config.Env}}', ref,
    )  # fmt: skip
    label, env = proc.stdout.strip().split("\n", 1)
    return label, sorted(yaml.safe_load(env) or [])


def _running_server(params: DeployParams, rel: Release) -> dict[str, str] | None:
    """The container of ``params.local_name`` if it runs ``rel.model`` with model control."""
    if not _exists(params.local_name):
        return None
    proc = _podman(
        "inspect", "--format",
        "{{.State.Status}}\n{{.Image}}\n{{index .Config.Labels \"" + MODEL_LABEL + '"}}\n'
        '{{index .Config.Labels "paddle-mlops/model-control"}}',
        params.local_name, check=False,
    )  # fmt: skip
    fields = proc.stdout.strip().split("\n")
    if proc.returncode != 0 or len(fields) != 4:
        return None
    state, image, model, control = fields
    if state != "running" or model != rel.model or control != "true":
        return None
    return {"image": image}


def _swap_in_place(
    rel: Release, params: DeployParams, url: str, running_image: str
) -> dict[str, Any] | None:
    """Load ``rel`` into the running server when its image differs from ``rel.image`` only
    by the model (same server image, same environment); None when it does not."""

    if _image_config(running_image) != _image_config(rel.image):
        log.info("the running server's image or configuration differs: restarting it")
        return None
    if not _load_version(rel, params, url, f"{MODELS_ROOT}/v{rel.version}"):
        return None
    return {"method": "load", "server_image": running_image}


def _load_version(rel: Release, params: DeployParams, url: str, model_dir: str) -> bool:
    """Swap ``rel`` (its bundle at ``model_dir`` as the server sees it) into the server at
    ``url`` with the repository's load; False when that server is not ready."""
    client = KServeClient(url, timeout=params.rollout_timeout_s)
    if not client.ready():
        return False
    config = {"model_dir": model_dir, "version": str(rel.version), "variant": params.server_variant}
    try:
        client.load_model(rel.model, config)
    except KServeError as exc:
        raise StepError(
            f"the server at {url} could not load {rel.model} v{rel.version} ({exc}); the "
            "version it served before still serves"
        ) from None
    if str(rel.version) not in client.metadata(rel.model)["versions"]:
        raise StepError(f"{url} reports no version {rel.version} of {rel.model} after loading it")
    log.info("swapped %s v%d into the running server at %s", rel.model, rel.version, url)
    return True


def _load_challenger(
    rel: Release, params: DeployParams, url: str, model_dir: Path | None = None
) -> dict[str, Any]:
    """Load ``rel`` beside the version the running server serves, under the policy;
    ``model_dir``: the local server's copy (target local), else the container's mount."""
    if model_dir is None:
        running = _running_server(params, rel)
        if running is None:
            raise StepError(
                f"deploy.challenger {params.challenger}: no running server of {rel.model} with "
                f"model control ({params.local_name}); deploy the champion first "
                "(deploy.challenger: none)"
            )
        running_image = running["image"]
        if _image_config(running_image) != _image_config(rel.image):
            raise StepError(
                f"{rel.model} v{rel.version}'s server image differs from the running one: a "
                "challenger must run in the champion's server (same image and configuration)"
            )
    else:
        server = local_server.read_state(Path(params.local_state_dir).resolve())
        if server is None or server.model != rel.model or not server.model_control:
            raise StepError(
                f"deploy.challenger {params.challenger}: no local server of {rel.model} with "
                f"model control ({Path(params.local_state_dir) / local_server.STATE_FILE}); "
                "deploy the champion first (deploy.challenger: none)"
            )
        running_image = ""
    client = KServeClient(url, timeout=params.rollout_timeout_s)
    config = {
        "model_dir": str(model_dir) if model_dir else f"{MODELS_ROOT}/v{rel.version}",
        "version": str(rel.version),
        "variant": params.server_variant,
        "role": "challenger",
        "policy": params.challenger,
        "fraction": str(params.challenger_fraction),
    }
    try:
        client.load_model(rel.model, config)
    except KServeError as exc:
        raise StepError(
            f"the server at {url} could not load challenger v{rel.version}: {exc}"
        ) from None
    log.info(
        "%s v%d runs beside the champion as a %s challenger (%.0f%% of requests); judge it with "
        "paddle-mlops judge --server %s",
        rel.model, rel.version, params.challenger, 100 * params.challenger_fraction, url,
    )  # fmt: skip
    return {
        "method": "challenger",
        "policy": params.challenger,
        "fraction": params.challenger_fraction,
        **({"server_image": running_image} if running_image else {}),
    }


def prediction_log_dir(params: DeployParams) -> Path:
    """Where the podman server's prediction log is on this machine (``monitor --log``)."""
    return Path(params.local_state_dir).resolve() / "predictions"


def _fetch_verified(rel: Release, params: DeployParams, tracking: str) -> tuple[Path, Path]:
    """Fetch and verify ``rel``'s bundle as the init container does, into
    ``local_state_dir/models/MODEL/vN``: (models root, the version's directory)."""
    models_root = Path(params.local_state_dir).resolve() / "models" / rel.model
    model_dir = models_root / f"v{rel.version}"
    fetched = fetch(rel.model_uri, model_dir, tracking=tracking)
    if fetched.sha256 != rel.bundle_sha256:
        raise StepError(f"{rel.model_uri}: fetched {fetched.sha256}, expected {rel.bundle_sha256}")
    return models_root, model_dir


def deploy_podman(rel: Release, params: DeployParams, tracking: str) -> dict[str, Any]:
    """Run ``rel`` on this machine as the init container + server pod would (module doc)."""

    models_root, model_dir = _fetch_verified(rel, params, tracking)
    _podman("pull", "--quiet", rel.image)
    url = f"http://127.0.0.1:{params.local_port}"
    local = {"url": url, "container": params.local_name, "model_dir": str(model_dir)}
    if params.prediction_log:
        local["prediction_log"] = str(prediction_log_dir(params))
    if params.challenger != "none":
        return {**local, **_load_challenger(rel, params, url)}
    running = _running_server(params, rel) if params.swap == "load" else None
    if running is not None:
        swapped = _swap_in_place(rel, params, url, running["image"])
        if swapped is not None:
            return {**local, **swapped}
    name, previous = params.local_name, f"{params.local_name}-previous"
    if _exists(previous):
        _podman("rm", "--force", previous)
    had_previous = _exists(name)
    if had_previous:
        _podman("rename", name, previous)
        _podman("stop", "--time", "10", previous)
    control = "true" if params.swap == "load" else "false"
    log_mount: list[str] = []
    if params.prediction_log:
        log_dir = prediction_log_dir(params)
        log_dir.mkdir(parents=True, exist_ok=True)
        log_dir.chmod(0o777)  # the server runs as 10001; the monitor reads as whoever runs it
        log_mount = ["--volume", f"{log_dir}:{PREDICTION_LOG_DIR}"]
    _podman(
        "run", "--detach", "--name", name,
        "--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges",
        "--user", "10001:10001", "--tmpfs", "/tmp",
        "--publish", f"127.0.0.1:{params.local_port}:8080",
        "--volume", f"{models_root}:{MODELS_ROOT}:ro", *log_mount,
        "--label", f"{MODEL_LABEL}={rel.model}",
        "--label", f"{VERSION_LABEL}={rel.version}",
        "--label", f"paddle-mlops/model-control={control}",
        rel.image, *_server_args(rel, params),
        f"--model-dir={MODELS_ROOT}/v{rel.version}", f"--model-control={control}",
    )  # fmt: skip
    if not _wait_ready(url, params.rollout_timeout_s, name):
        logs = _podman("logs", "--tail", "30", name, check=False)
        _podman("rm", "--force", name, check=False)
        if had_previous:
            _podman("rename", previous, name)
            _podman("start", name)
            log.error("v%d never became ready: the previous container runs again", rel.version)
        raise StepError(
            f"{rel.image} (v{rel.version}) did not become ready on {url} within "
            f"{params.rollout_timeout_s:.0f} s; its log:\n{(logs.stdout + logs.stderr)[-2000:]}"
        )
    if had_previous:
        _podman("rm", "--force", previous)
    log.info("serving %s v%d at %s (%s)", rel.model, rel.version, url, rel.image)
    return {**local, "method": "restart", "server_image": rel.image}


# --------------------------------------------------------------------------- local


def _settings(args: list[str]) -> list[str]:
    """A server's flags without the version it serves: equal ones can swap a version in."""
    return [a for a in args if not a.startswith(("--model-dir=", "--model-version="))]


def local_state_dir(params: DeployParams) -> Path:
    return Path(params.local_state_dir).resolve()


def deploy_local(rel: Release, params: DeployParams, tracking: str) -> dict[str, Any]:
    """Serve ``rel``'s verified bundle with the built server binary, a detached process on
    ``127.0.0.1:local_port`` (``components.ml.local_server``): swapped into the running one
    with the repository's load when that runs the same binary (``swap: load``), else
    (re)started; a new server that never becomes ready gives way to the previous one."""
    _, model_dir = _fetch_verified(rel, params, tracking)
    binary = server_binary(REPO / "serving", default_build_dir()).resolve()
    state_dir = local_state_dir(params)
    url = f"http://127.0.0.1:{params.local_port}"
    local: dict[str, Any] = {
        "url": url,
        "model_dir": str(model_dir),
        "pid_file": str(state_dir / local_server.STATE_FILE),
        "log_file": str(state_dir / local_server.LOG_FILE),
        "binary": str(binary),
    }
    log_dir = prediction_log_dir(params)
    if params.prediction_log:
        local["prediction_log"] = str(log_dir)
    if params.challenger != "none":
        return {**local, **_load_challenger(rel, params, url, model_dir)}
    control = params.swap == "load"
    args = _server_args(rel, params, model_dir=str(model_dir), log_dir=str(log_dir))
    args.append(f"--model-control={str(control).lower()}")
    # the server's own default gRPC port (8081) would collide between two tasks served here
    args.append(f"--grpc-port={params.local_grpc_port}")
    running = local_server.read_state(state_dir)
    if (
        running is not None
        and control
        and running.model_control
        and running.model == rel.model
        and running.port == params.local_port
        and running.binary_sha256 == local_server.sha256_file(binary)
        and _settings(local_server.args_of(running)) == _settings(args)
    ):
        if _load_version(rel, params, url, str(model_dir)):
            local_server.record_version(state_dir, running, rel.version, str(model_dir))
            return {**local, "method": "load", "pid": running.pid}
    if params.prediction_log:
        log_dir.mkdir(parents=True, exist_ok=True)
    previous = local_server.stop(state_dir, params.rollout_timeout_s) if running else None
    options = dict(state_dir=state_dir, port=params.local_port, model=rel.model)
    try:
        server = local_server.start(
            binary, args, **options, version=rel.version, model_dir=str(model_dir),
            model_control=control, timeout_s=params.rollout_timeout_s,
        )  # fmt: skip
    except StepError:
        if previous is not None:
            local_server.start(
                Path(previous.binary), local_server.args_of(previous), **options,
                version=previous.version, model_dir=previous.model_dir,
                model_control=previous.model_control, timeout_s=params.rollout_timeout_s,
            )  # fmt: skip
            log.error("v%d never became ready: v%d serves again", rel.version, previous.version)
        raise
    return {**local, "method": "restart", "pid": server.pid}


# --------------------------------------------------------------------------- step


def run(
    params: DeployParams,
    promotion_dir: str | Path,
    out_dir: str | Path,
    *,
    registry_params: RegistryParams | None = None,
    templates_root: str | Path | None = None,
) -> dict[str, Any]:
    if params.target == "local" and os.environ.get("KUBERNETES_SERVICE_HOST"):
        # a KFP task's pod: a process started here ends with the pod. Rendered as with none
        log.warning(
            "deploy.target local in a Kubernetes pod: nothing on this machine outlives it; "
            "rendering only (deploy.target kubernetes applies the manifests)"
        )
        params = dataclasses.replace(params, target="none")
    promotion = read_json(Path(promotion_dir) / "promotion.json")
    templates = Path(templates_root) if templates_root else _templates(params.templates)
    tracking = tracking_uri()
    registry = Registry(
        mlflow_client(tracking), str(promotion["model"]), registry_params or RegistryParams()
    )
    aliases = registry.aliases()
    version = aliases.get(params.alias)
    record: dict[str, Any] = {
        "model": registry.name,
        "alias": params.alias,
        "target": params.target,
        "tracking_uri": redact_uri(tracking),
    }
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        if version is None:
            log.warning("%s has no '%s' alias: nothing to deploy", registry.name, params.alias)
            write_json(tmp / "deployment.json", {**record, "deployed": False, "version": None})
            return {**record, "deployed": False}
        challenger: Release | None = None
        refusal = _not_deployable(registry, version, aliases.get(CHAMPION), params)
        if params.challenger != "none" and params.target in ("kubernetes", "none"):
            # the pods run the champion and, beside it, the alias's version; a challenger the
            # judge promoted or rolled back (or one never blessed) leaves the champion alone
            champion = aliases.get(CHAMPION)
            if champion is None:
                raise StepError(f"{registry.name}: no '{CHAMPION}' to run a challenger beside")
            if refusal:
                log.warning("%s: the champion v%d alone", refusal, champion)
                record["challenger"] = {"refused": refusal}
            else:
                challenger = release(registry, version)
                record["challenger"] = {**asdict(challenger), "policy": params.challenger}
            version = champion
        elif refusal:
            log.warning("%s: nothing deployed", refusal)
            write_json(
                tmp / "deployment.json",
                {**record, "deployed": False, "version": version, "refused": refusal},
            )
            return {**record, "deployed": False, "refused": refusal}
        try:
            rel = release(registry, version, image=params.target != "local")
            policy_dir = tmp if rel.image else None  # podman's image policy: an image's only
            record["verified"] = verify_release(registry, tracking, rel, policy_dir, Path(out_dir))
            if challenger is not None:
                record["challenger"]["verified"] = verify_release(registry, tracking, challenger)
        except StepError as exc:
            if params.target != "none":
                raise
            log.warning("nothing rendered: %s", exc)  # a laptop run without a pushed image
            write_json(tmp / "deployment.json", {**record, "deployed": False, "refused": str(exc)})
            return {**record, "deployed": False, "refused": str(exc)}
        components_image = params.components_image or os.environ.get("PADDLE_MLOPS_IMAGE", "")
        rendered = {}
        if rel.image:  # target local serves the bundle: manifests need the version's image
            rendered = render(
                rel, params, templates, components_image or "paddle-mlops-components", challenger
            )

        for variant, docs in rendered.items():
            check_manifests(docs, require_digest=params.target == "kubernetes")
            write_text(tmp / f"{variant}.yaml", yaml.safe_dump_all(docs, sort_keys=False))
        record.update(asdict(rel), manifests=sorted(rendered), dry_run=params.dry_run)
        if params.target == "kubernetes":
            applied = [a for docs in rendered.values() for a in apply_kubernetes(docs, params)]
            if not params.dry_run:
                for docs in rendered.values():
                    wait_rollout(docs, params)
            record["applied"] = applied
        elif params.target == "podman":
            record["local"] = deploy_podman(rel, params, tracking)
        elif params.target == "local":
            record["local"] = deploy_local(rel, params, tracking)
        record["deployed"] = params.target != "none" and not params.dry_run
        write_json(tmp / "deployment.json", record)
    log.info(
        "%s v%d (%s): %s",
        rel.model,
        rel.version,
        params.alias,
        "rendered only" if params.target == "none" else f"deployed with {params.target}",
    )
    return record


def _not_deployable(
    registry: Registry, version: int, champion: int | None, params: DeployParams
) -> str:
    """Why the alias's version is not deployed beside (or instead of) the champion: never
    blessed (the newest version carries ``challenger`` whether blessed or not), judged and
    rolled back, or the champion already (promoted). Empty: deployable."""
    if params.alias == CHAMPION:
        return ""
    tags = registry.version(version).tags
    what = f"{registry.name} v{version} ('{params.alias}')"
    if tags.get("blessed") != "true":
        return f"{what} is not blessed ({tags.get('blessed')})"
    if params.challenger == "none":
        return ""
    if tags.get("judged") == "reject":
        return f"{what} was rolled back by the judge ({tags.get('judged_reason', '')[:200]})"
    if version == champion:
        return f"{what} is the champion already"
    return ""


def _templates(configured: str) -> Path:
    path = Path(configured)
    if not path.is_absolute() and not path.exists():
        path = REPO / configured  # the package's own (e.g. /opt/paddle-mlops/k8s in the image)
    return path


STEP = Step(
    name="deploy",
    doc=__doc__,
    params=DeployParams,
    sections=("deploy", "registry"),
    shared=(("registry", "registry_params", RegistryParams),),
    run=run,
    inputs=(
        In(
            "promotion",
            "outputs/promote",
            "promotion_dir",
            source="promote.promotion",
            help="promotion.json (which model; runs after the champion may have moved)",
        ),
    ),
    outputs=(Out("deployment", "outputs/deploy", "out_dir", dvc="uncached"),),
    extra_deps=("k8s/serving", "k8s/kserve"),
)


def main(argv: Sequence[str] | None = None) -> int:
    """The step CLI, plus ``stop`` (end the ``target: local`` server, ``make stop``) and
    ``status`` (what it serves)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] not in (["stop"], ["status"]):
        return step_main(STEP, argv)
    parser = argparse.ArgumentParser(
        prog=f"paddle-mlops deploy {argv[0]}",
        description="stop: SIGTERM the local server (deploy.target: local) and remove its pid "
        "file. status: the server its pid file names, if it runs (exit code 3 if none).",
    )
    parser.add_argument("--params", default="params.yaml", help="params file (%(default)s)")
    args = parser.parse_args(argv[1:])
    code = 0

    def _go() -> None:
        nonlocal code
        params = section(load_params(args.params), "deploy", DeployParams)
        state_dir = local_state_dir(params)
        if argv[0] == "stop":
            server = local_server.stop(state_dir, params.rollout_timeout_s)
            if server is None:
                log.info("no local server runs (%s)", state_dir / local_server.STATE_FILE)
            return
        server = local_server.read_state(state_dir)
        if server is None:
            log.info("no local server runs (%s)", state_dir / local_server.STATE_FILE)
            code = 3
            return
        log.info(
            "%s v%d served at %s (pid %d, log %s)", server.model, server.version, server.url,
            server.pid, state_dir / local_server.LOG_FILE,
        )  # fmt: skip

    return run_cli(_go) or code
