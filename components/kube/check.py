"""Kubernetes manifests checked the way a cluster would take them, before they reach one.

Library layer (imports no step): used by ``tests/test_k8s.py`` on every file under ``k8s/`` and
by the deploy step on what it is about to apply. ``check_manifests(docs)`` raises
``StepError`` listing every problem, each naming ``Kind/name``, the field and what is wrong:

1. **Schemas.** A built-in kind is validated with ``kubernetes-validate`` (strict: an unknown
   field is an error) against the newest Kubernetes version the installed package ships.
   A KServe kind (``serving.kserve.io``: InferenceService v1beta1, ServingRuntime and
   ClusterServingRuntime v1alpha1, ClusterStorageContainer v1alpha1) and a Kubeflow
   training-operator ``PaddleJob`` (``kubeflow.org/v1``) are validated against their own
   CRDs, vendored verbatim with their sources and sha256 (``components.kube.crds``: KServe
   v0.20.0 ``config/crd/full``, training-operator release-1.9 ``manifests/base/crds``), made
   strict as ``kubectl --validate=strict`` is (an unknown field is an error except under
   ``x-kubernetes-preserve-unknown-fields``), their ``metadata`` the strict Kubernetes
   ObjectMeta. A PaddleJob also passes the rules of the operator's validating webhook
   (``pkg/webhooks/paddlepaddle``: a DNS-1035 name, replica types ``Master``/``Worker``,
   containers with an image, one named ``paddle`` in every replica; ``runPolicy.managedBy``).
   A Katib ``Experiment`` (``kubeflow.org/v1beta1``; its CRD keeps unknown fields) is
   validated against Katib's OpenAPI schema (vendored beside its CRD, made strict the same
   way) and the rules of Katib's validating webhook (``components.kube.katib_rules``); its
   trialSpec, each ``${trialParameters.x}`` replaced by a typed sample, is then checked as a
   manifest of its own (a PaddleJob or a Job: schema, webhook, policy). Any other kind is an
   error.
2. **Policy**, on every container of a workload: Pod, PodTemplate, Deployment, StatefulSet,
   DaemonSet, ReplicaSet, ReplicationController, Job, CronJob (init containers included), the
   containers of a (Cluster)ServingRuntime, the containers of an InferenceService component,
   a ClusterStorageContainer's container (an init container of the predictor pods) and the
   pods of every replica of a PaddleJob (batch pods, like a Job's):

   * non-root: ``runAsNonRoot: true`` on the container or its pod (the container's wins),
     and no ``runAsUser: 0``;
   * ``seccompProfile.type: RuntimeDefault`` on the container or its pod;
   * on the container: ``readOnlyRootFilesystem: true``, ``allowPrivilegeEscalation: false``,
     ``capabilities.drop`` containing ``ALL``, not ``privileged``;
   * ``resources.requests`` and ``resources.limits`` for both ``cpu`` and ``memory``, each
     request at most its limit;
   * ``readinessProbe`` and ``livenessProbe`` on long-running server containers (Deployment,
     StatefulSet, DaemonSet, ReplicaSet, ReplicationController, a Pod that restarts Always,
     ServingRuntime and InferenceService containers); no probe on an init container (the
     API server rejects one), none required on a Job's, CronJob's or PaddleJob's containers;
   * the image: not ``:latest``, no tag nor digest only for a placeholder name without ``/``
     (``digits-server``: kustomize ``images:`` or the deploy step replaces it); with
     ``require_digest=True`` pinned by digest, ``@sha256:`` + 64 hex, and not the all-zero
     placeholder digest the templates carry (``PLACEHOLDER_DIGEST``).
   * KServe serverless (Knative) rules on (Cluster)ServingRuntime and InferenceService
     containers: no env var Knative reserves (``PORT``, ``K_SERVICE``, ``K_CONFIGURATION``,
     ``K_REVISION``), no reserved port (8008, 8012, 8013, 8022, 9090, 9091), a port name
     only ``h2c`` or ``http1``, no mount at ``/``, ``/dev``, ``/dev/log``, no container
     named ``queue-proxy``; an InferenceService component in serverless mode sets no pod
     ``securityContext`` (Knative rejects it by default: set it on the containers).
3. **References**: an InferenceService whose ``runtime`` names a ServingRuntime among the
   documents must use a model format and protocol version that runtime lists.

Every document needs ``apiVersion``, ``kind`` and ``metadata.name``.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError
from components.kube import crds, katib_rules

log = logging.getLogger(__name__)

KSERVE_GROUP = "serving.kserve.io"
TRAINING_GROUP = "kubeflow.org"  # the Kubeflow training-operator's


def crd_kinds(group: str) -> dict[str, str] | None:
    """``kind -> apiVersion`` of the vendored CRDs of ``group``; None for a group without."""
    found = {k: f"{g}/{v}" for (g, k), (_, v) in crds.kinds().items() if g == group}
    return found or None


# the digest templates carry until the deploy step (or `kustomize edit set image`) sets one
PLACEHOLDER_DIGEST = "sha256:" + "0" * 64
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# files under a kustomize directory that are not resources
NOT_MANIFESTS = frozenset({"kustomization.yaml", "kustomization.yml", "kustomizeconfig.yaml"})

# knative.dev/serving pkg/apis/serving/k8s_validation.go
KNATIVE_RESERVED_ENV = frozenset({"PORT", "K_SERVICE", "K_CONFIGURATION", "K_REVISION"})
KNATIVE_RESERVED_PORTS = frozenset({8008, 8012, 8013, 8022, 9090, 9091})
KNATIVE_PORT_NAMES = frozenset({"", "h2c", "http1"})
KNATIVE_RESERVED_PATHS = frozenset({"/", "/dev", "/dev/log"})
# InferenceService deployment modes without Knative
KSERVE_RAW_MODES = frozenset({"RawDeployment", "Standard", "ModelMesh"})
KSERVE_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"

# where each built-in workload kind keeps its pod spec
POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
SERVER_KINDS = frozenset(
    {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController"}
)

# ----------------------------------------------------------------------------- PaddleJob
# the rules of the training-operator's validating webhook (release-1.9,
# pkg/webhooks/paddlepaddle/paddlepaddle_webhook.go), which the CRD's schema does not carry
PADDLE_REPLICA_TYPES = ("Master", "Worker")
PADDLE_MANAGERS = ("kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue")
PADDLE_CONTAINER = "paddle"  # PaddleJobDefaultContainerName: the webhook requires one
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def _paddlejob_problems(doc: Mapping[str, Any]) -> list[str]:
    """The rules of the operator's validating webhook (pkg/webhooks/paddlepaddle): beyond the
    schema, what the API server refuses when the operator is installed."""
    problems = []
    name = _get(doc, "metadata", "name")
    if isinstance(name, str) and (len(name) > 63 or not _DNS1035.fullmatch(name)):
        problems.append(
            f"metadata.name: {name!r} is not a DNS-1035 label (lowercase letters, digits and "
            "'-', starting with a letter, at most 63 characters): the operator names pods and "
            "Services after it"
        )
    manager = _get(doc, "spec", "runPolicy", "managedBy")
    if manager is not None and manager not in PADDLE_MANAGERS:
        problems.append(f"spec.runPolicy.managedBy: {manager!r} is not one of {PADDLE_MANAGERS}")
    specs = _get(doc, "spec", "paddleReplicaSpecs")
    for rtype, rspec in (specs or {}).items() if isinstance(specs, Mapping) else ():
        if rtype not in PADDLE_REPLICA_TYPES:
            problems.append(
                f"spec.paddleReplicaSpecs: {rtype!r} is not one of {list(PADDLE_REPLICA_TYPES)}"
            )
            continue
        where = f"spec.paddleReplicaSpecs.{rtype}.template.spec.containers"
        containers = _get(rspec, "template", "spec", "containers")
        if not isinstance(containers, list) or not containers:
            problems.append(f"{where}: must be specified")
            continue
        names = [_get(c, "name") for c in containers]
        for c, label in zip(containers, names, strict=True):
            if isinstance(c, Mapping) and not c.get("image"):
                problems.append(f"{where}[{label}].image: required")
        if PADDLE_CONTAINER not in names:
            problems.append(f"{where}: must have a container named {PADDLE_CONTAINER!r}")
    return problems


def _experiment_problems(doc: Mapping[str, Any], where: str, *, require_digest: bool) -> list[str]:
    """A Katib Experiment: its webhook's rules (``components.kube.katib_rules``), then its
    trialSpec as one trial gets it, checked as a manifest of its own."""
    problems = [f"{where}: {p}" for p in katib_rules.experiment_problems(doc)]
    sample = katib_rules.trial_sample(doc)
    if sample is not None and sample.get("apiVersion") and sample.get("kind"):
        problems += [
            f"{where}: spec.trialTemplate.trialSpec: {p}"
            for p in manifest_problems([sample], require_digest=require_digest)
        ]
    return problems


# ----------------------------------------------------------------------------- schemas


def _kubernetes_validate() -> Any:
    try:
        from kubernetes_validate import utils
    except ImportError as exc:  # a dev dependency (pyproject.toml [dev])
        raise StepError(
            "checking manifests needs the kubernetes-validate package (pip install "
            "kubernetes-validate, pinned in constraints.txt)"
        ) from exc
    return utils


@functools.cache
def kubernetes_version() -> str:
    """The newest Kubernetes version whose schemas the installed kubernetes-validate ships."""
    return str(_kubernetes_validate().latest_version())


@functools.cache
def _definitions(version: str) -> dict[str, Any]:
    return _kubernetes_validate().schema_contents(
        f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version
    )


@functools.cache
def _builtin_validator(kind: str, api_version: str, version: str) -> Any | None:
    """The strict validator of a built-in kind, as ``kubernetes-validate --strict`` builds it;
    None when the package has no schema for it."""
    import jsonschema
    from referencing import Registry, Resource

    kv = _kubernetes_validate()
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kv.schema_contents(
            f"kubernetes-json-schema/v{version}-local-strict/{kind.lower()}-{group_version}.json",
            version,
        )
    except FileNotFoundError:
        return None
    registry = Resource.from_contents(_definitions(version)) @ (
        Resource.from_contents(schema) @ Registry()
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.cache
def _crd_validator(group: str, kind: str, version: str) -> Any:
    """The strict validator of a vendored CRD's kind (``components.kube.crds``), its metadata
    the Kubernetes ``version`` ObjectMeta."""
    import jsonschema

    own = crds.schema(group, kind)
    schema = {
        **own,
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": {**_definitions(version)["$defs"], **own.get("$defs", {})},
    }
    return jsonschema.Draft202012Validator(schema)


def _path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(document)"


def _schema_problems(validator: Any, doc: Mapping[str, Any], where: str) -> list[str]:
    import jsonschema

    problems = []
    for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.path))):
        if error.context:  # oneOf/anyOf: the alternative that came closest
            error = jsonschema.exceptions.best_match(error.context)
        message = error.message if len(error.message) <= 300 else error.message[:300] + "..."
        problems.append(f"{where}: {_path(error.absolute_path)}: {message}")
    return problems


# ----------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class WorkloadContainer:
    """One container of a workload, as the policy sees it."""

    where: str  # the field path of the container, e.g. spec.template.spec.containers[server]
    spec: Mapping[str, Any]
    pod_security: Mapping[str, Any]  # the pod's securityContext ({} where there is none)
    role: str  # "server" (long-running), "batch" (Job, CronJob) or "init"
    knative: bool  # runs under Knative (KServe serverless): its reserved names apply


def _get(doc: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def _containers(
    pod: Mapping[str, Any], prefix: str, role: str, *, knative: bool = False
) -> Iterator[WorkloadContainer]:
    security = pod.get("securityContext") or {}
    for field, field_role in (("initContainers", "init"), ("containers", role)):
        for i, c in enumerate(pod.get(field) or []):
            if isinstance(c, Mapping):
                label = c.get("name") or i
                yield WorkloadContainer(
                    f"{prefix}{field}[{label}]", c, security, field_role, knative
                )


def workload_containers(doc: Mapping[str, Any]) -> list[WorkloadContainer]:
    """Every container the policy applies to in one document (none for other kinds)."""
    kind = doc.get("kind")
    if kind in POD_SPEC_PATHS:
        path = POD_SPEC_PATHS[kind]
        pod = _get(doc, *path)
        if not isinstance(pod, Mapping):
            return []
        if kind in SERVER_KINDS:
            role = "server"
        elif kind in ("Pod", "PodTemplate"):
            role = "server" if pod.get("restartPolicy", "Always") == "Always" else "batch"
        else:
            role = "batch"
        return list(_containers(pod, ".".join(path) + ".", role))
    if kind in ("ServingRuntime", "ClusterServingRuntime"):
        spec = doc.get("spec") or {}
        found = list(_containers(spec, "spec.", "server", knative=True))
        worker = spec.get("workerSpec")
        if isinstance(worker, Mapping):
            found += _containers(worker, "spec.workerSpec.", "server")
        return found
    if kind == "InferenceService":
        knative = _get(doc, "metadata", "annotations", KSERVE_MODE_ANNOTATION) not in (
            KSERVE_RAW_MODES
        )
        found = []
        for component in ("predictor", "transformer", "explainer"):
            spec = _get(doc, "spec", component)
            if isinstance(spec, Mapping):
                found += _containers(spec, f"spec.{component}.", "server", knative=knative)
        return found
    if kind == "PaddleJob":
        found = []
        specs = _get(doc, "spec", "paddleReplicaSpecs")
        for rtype, rspec in specs.items() if isinstance(specs, Mapping) else ():
            pod = _get(rspec, "template", "spec")
            if isinstance(pod, Mapping):
                prefix = f"spec.paddleReplicaSpecs.{rtype}.template.spec."
                found += _containers(pod, prefix, "batch")
        return found
    if kind == "ClusterStorageContainer":
        container = _get(doc, "spec", "container")
        if isinstance(container, Mapping):
            label = container.get("name") or 0
            return [WorkloadContainer(f"spec.container[{label}]", container, {}, "init", False)]
    return []


_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)([a-zA-Z]*)")
_SUFFIX = {
    "": 1.0,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def quantity(value: Any) -> float | None:
    """A Kubernetes resource quantity ("500m", "1Gi", 2) as a number; None if unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    match = _QUANTITY.fullmatch(str(value).strip())
    if not match or match.group(2) not in _SUFFIX:
        return None
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def image_problem(image: Any, *, require_digest: bool) -> str | None:
    """What is wrong with an image reference, or None."""
    if not isinstance(image, str) or not image:
        return "no image"
    name, _, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else None
    if tag == "latest":
        return f"image {image!r}: the mutable tag :latest"
    if digest and not DIGEST.fullmatch(digest):
        return f"image {image!r}: a digest is sha256: and 64 lowercase hex digits"
    if require_digest:
        if not digest:
            return f"image {image!r} is not pinned by digest (@sha256:<64 hex>)"
        if digest == PLACEHOLDER_DIGEST:
            return f"image {image!r}: the placeholder digest, not the image's"
    elif not digest and tag is None and "/" in name:
        return (
            f"image {image!r} has neither tag nor digest (it means :latest); only a "
            "placeholder name without '/' may, for kustomize images: or the deploy step"
        )
    return None


def _security_problems(c: WorkloadContainer) -> list[str]:
    sc = c.spec.get("securityContext") or {}
    pod = c.pod_security
    problems = []

    def effective(key: str) -> Any:
        return sc[key] if sc.get(key) is not None else pod.get(key)

    if effective("runAsNonRoot") is not True:
        problems.append("securityContext.runAsNonRoot: must be true (on the container or its pod)")
    if effective("runAsUser") == 0:
        problems.append("securityContext.runAsUser: 0 is root")
    if _get(effective("seccompProfile"), "type") != "RuntimeDefault":
        problems.append(
            "securityContext.seccompProfile.type: must be RuntimeDefault "
            "(on the container or its pod)"
        )
    if sc.get("readOnlyRootFilesystem") is not True:
        problems.append("securityContext.readOnlyRootFilesystem: must be true")
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.append("securityContext.allowPrivilegeEscalation: must be false")
    if sc.get("privileged") is True:
        problems.append("securityContext.privileged: must not be true")
    drop = _get(sc, "capabilities", "drop") or []
    if "ALL" not in drop:
        problems.append("securityContext.capabilities.drop: must include ALL")
    return problems


def _resource_problems(c: WorkloadContainer) -> list[str]:
    resources = c.spec.get("resources") or {}
    problems = []
    for bound in ("requests", "limits"):
        for resource in ("cpu", "memory"):
            if _get(resources, bound, resource) in (None, ""):
                problems.append(f"resources.{bound}.{resource}: missing")
    for resource in ("cpu", "memory"):
        request = quantity(_get(resources, "requests", resource))
        limit = quantity(_get(resources, "limits", resource))
        if request is not None and limit is not None and request > limit:
            problems.append(f"resources.requests.{resource}: more than its limit")
    return problems


def _probe_problems(c: WorkloadContainer) -> list[str]:
    probes = ("readinessProbe", "livenessProbe", "startupProbe")
    if c.role == "init" and c.spec.get("restartPolicy") != "Always":
        return [f"{p}: not allowed on an init container" for p in probes if c.spec.get(p)]
    if c.role == "server":
        return [f"{p}: missing (a server)" for p in probes[:2] if not c.spec.get(p)]
    return []


def _knative_problems(c: WorkloadContainer) -> list[str]:
    problems = []
    if c.spec.get("name") == "queue-proxy":
        problems.append("name: queue-proxy is reserved by Knative")
    for env in c.spec.get("env") or []:
        name = _get(env, "name")
        if name in KNATIVE_RESERVED_ENV:
            problems.append(
                f"env[{name}]: reserved by Knative (KServe serverless), which sets it itself"
            )
    for i, port in enumerate(c.spec.get("ports") or []):
        if _get(port, "containerPort") in KNATIVE_RESERVED_PORTS:
            problems.append(f"ports[{i}].containerPort: {port['containerPort']} is reserved")
        if (_get(port, "name") or "") not in KNATIVE_PORT_NAMES:
            problems.append(f"ports[{i}].name: Knative allows only h2c or http1 (or none)")
    for i, mount in enumerate(c.spec.get("volumeMounts") or []):
        path = _get(mount, "mountPath")
        if isinstance(path, str) and (path.rstrip("/") or "/") in KNATIVE_RESERVED_PATHS:
            problems.append(f"volumeMounts[{i}].mountPath: {path} is reserved by Knative")
    return problems


def container_problems(c: WorkloadContainer, *, require_digest: bool = False) -> list[str]:
    """The policy's findings on one container, each ``field: problem`` below ``c.where``."""
    problems = _security_problems(c) + _resource_problems(c) + _probe_problems(c)
    image = image_problem(c.spec.get("image"), require_digest=require_digest)
    if image:
        problems.append(f"image: {image}")
    if c.knative:
        problems += _knative_problems(c)
    return problems


def _kserve_problems(doc: Mapping[str, Any], runtimes: Mapping[str, Any]) -> list[str]:
    """InferenceService rules beyond its containers."""
    problems = []
    annotations = _get(doc, "metadata", "annotations") or {}
    if annotations.get(KSERVE_MODE_ANNOTATION) not in KSERVE_RAW_MODES:
        for component in ("predictor", "transformer", "explainer"):
            if _get(doc, "spec", component, "securityContext"):
                problems.append(
                    f"spec.{component}.securityContext: Knative (KServe serverless) rejects a "
                    "pod securityContext unless kubernetes.podspec-securitycontext is enabled: "
                    "set it on the containers (the ServingRuntime's)"
                )
        for env in _get(doc, "spec", "predictor", "model", "env") or []:
            if _get(env, "name") in KNATIVE_RESERVED_ENV:
                problems.append(
                    f"spec.predictor.model.env[{env['name']}]: reserved by Knative "
                    "(KServe serverless)"
                )
    model = _get(doc, "spec", "predictor", "model")
    runtime = runtimes.get(_get(model, "runtime"))
    if isinstance(model, Mapping) and isinstance(runtime, Mapping):
        formats = {_get(f, "name") for f in runtime.get("supportedModelFormats") or []}
        wanted = _get(model, "modelFormat", "name")
        if wanted is not None and wanted not in formats:
            problems.append(
                f"spec.predictor.model.modelFormat.name: {wanted!r} is not among the "
                f"supportedModelFormats of runtime {model['runtime']!r} ({sorted(formats)})"
            )
        protocols = runtime.get("protocolVersions")
        if model.get("protocolVersion") and protocols and model["protocolVersion"] not in protocols:
            problems.append(
                f"spec.predictor.model.protocolVersion: {model['protocolVersion']!r} is not "
                f"among the protocolVersions of runtime {model['runtime']!r} ({protocols})"
            )
    return problems


# ----------------------------------------------------------------------------- entry points


def _label(doc: Mapping[str, Any], index: int) -> str:
    name = _get(doc, "metadata", "name")
    return f"{doc.get('kind') or '?'}/{name or f'<document {index}>'}"


def manifest_problems(
    docs: Iterable[Mapping[str, Any] | None], *, require_digest: bool = False
) -> list[str]:
    """Every problem in ``docs`` (see the module's docstring), each ``Kind/name: field: what``."""
    version = kubernetes_version()
    docs = [d for d in docs if d is not None]
    runtimes = {
        _get(d, "metadata", "name"): d.get("spec") or {}
        for d in docs
        if isinstance(d, Mapping) and d.get("kind") in ("ServingRuntime", "ClusterServingRuntime")
    }
    problems: list[str] = []
    for index, doc in enumerate(docs):
        if not isinstance(doc, Mapping):
            problems.append(f"<document {index}>: not a mapping but {type(doc).__name__}")
            continue
        where = _label(doc, index)
        kind, api_version = doc.get("kind"), doc.get("apiVersion")
        if not kind or not api_version or not _get(doc, "metadata", "name"):
            problems.append(f"{where}: apiVersion, kind and metadata.name are required")
            if not kind or not api_version:
                continue
        group = str(api_version).split("/")[0]
        vendored = crd_kinds(group)
        if vendored is not None and vendored.get(kind) != api_version:
            problems.append(
                f"{where}: apiVersion {api_version!r}: no schema here "
                f"(checked: {', '.join(f'{k} {v}' for k, v in vendored.items())})"
            )
            continue
        if vendored is not None:
            problems += _schema_problems(_crd_validator(group, kind, version), doc, where)
            if kind == "InferenceService":
                problems += [f"{where}: {p}" for p in _kserve_problems(doc, runtimes)]
            elif kind == "PaddleJob":
                problems += [f"{where}: {p}" for p in _paddlejob_problems(doc)]
            elif kind == "Experiment":
                problems += _experiment_problems(doc, where, require_digest=require_digest)
        else:
            validator = _builtin_validator(str(kind), str(api_version), version)
            if validator is None:
                problems.append(
                    f"{where}: apiVersion {api_version!r}: no Kubernetes {version} schema for "
                    "this kind, and not a KServe or training-operator kind"
                )
                continue
            problems += _schema_problems(validator, doc, where)
        for container in workload_containers(doc):
            problems += [
                f"{where}: {container.where}.{p}"
                for p in container_problems(container, require_digest=require_digest)
            ]
    return problems


def check_manifests(
    docs: Iterable[Mapping[str, Any] | None],
    *,
    require_digest: bool = False,
    what: str = "manifests",
) -> None:
    """Raise ``StepError`` listing every problem in ``docs``; ``require_digest``: every image
    pinned by a real digest (what a deploy step applies, not the templates under k8s/)."""
    docs = list(docs)
    problems = manifest_problems(docs, require_digest=require_digest)
    if problems:
        raise StepError(
            f"{what}: {len(problems)} problem(s) (Kubernetes {kubernetes_version()} schemas, "
            "vendored KServe 0.20, training-operator 1.9, Katib 0.19 and policy-controller 0.9 "
            "CRDs, hardening policy):\n" + "\n".join(f"  - {p}" for p in problems)
        )
    log.info(
        "%s: %d document(s) pass the Kubernetes %s schemas, the vendored CRDs and policy%s",
        what,
        len([d for d in docs if d is not None]),
        kubernetes_version(),
        " (images pinned by digest)" if require_digest else "",
    )


def manifest_files(directory: str | Path) -> list[Path]:
    """The resource files of a kustomize directory (not recursive): its ``*.yaml``/``*.yml``
    except ``kustomization.yaml`` and ``kustomizeconfig.yaml``."""
    directory = Path(directory)
    return sorted(
        p
        for p in directory.iterdir()
        if p.is_file() and p.suffix in (".yaml", ".yml") and p.name not in NOT_MANIFESTS
    )


def load_manifests(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Every YAML document of ``paths`` (empty documents dropped)."""
    import yaml

    docs = []
    for path in paths:
        try:
            docs += [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]
        except yaml.YAMLError as exc:
            raise StepError(f"{path}: not YAML: {exc}") from exc
    return docs
