"""What a pipeline task gets from the cluster: its resources and node placement
(``params.yaml: resources``), the tracking server's address and credentials, the label the
MLflow NetworkPolicy admits, and the provenance keys and registry credentials of promote and
deploy."""

from collections.abc import Mapping
from typing import Any

from kfp import dsl, kubernetes
from pydantic import TypeAdapter, ValidationError

from components.core.artifacts import StepError
from components.core.config import params_source
from components.kernel.params_schema import Resources


def typed_resources(params: dict[str, Any], source: str | None = None) -> Resources:
    """``params.yaml: resources`` (optional; empty when absent or null) as its schema type
    (:data:`components.kernel.params_schema.Resources`: task -> its settings); a bad value
    is one :class:`StepError` line naming ``source: resources.<task>``."""
    source = source or params_source(params)
    try:
        return TypeAdapter(Resources).validate_python(params.get("resources") or {})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(["resources", *(str(part) for part in first["loc"])])
        raise StepError(f"{source}: {where}: {first['msg']}") from None


def task_resources(resources: Resources, name: str) -> dict[str, Any]:
    """Task ``name``'s settings: ``resources.default`` then ``resources.<name>`` over it."""
    return {**resources.get("default", {}), **resources.get(name, {})}


def with_resources(task: dsl.PipelineTask, resources: Resources, name: str) -> Any:
    """``resources.default`` then ``resources.<name>``: CPU and memory requests and limits, and
    ``node_selector`` ({label: value}) / ``tolerations`` ([{key, operator, value, effect}]) to
    put the step's pod on a node pool (``package`` on the serving pool: its serving-config
    search then measures the machine that will serve; docs/tuning.md)."""
    spec = task_resources(resources, name)
    setters = {
        "cpu_request": task.set_cpu_request,
        "cpu_limit": task.set_cpu_limit,
        "memory_request": task.set_memory_request,
        "memory_limit": task.set_memory_limit,
    }
    placement = {"node_selector", "tolerations"}
    unknown = sorted(set(spec) - set(setters) - placement)
    if unknown:
        raise ValueError(f"params.yaml: resources.{name}: unknown keys {unknown}")
    for key, value in spec.items():
        if key in setters:
            setters[key](str(value))
    selector = spec.get("node_selector") or {}
    if not isinstance(selector, Mapping):
        raise ValueError(f"params.yaml: resources.{name}.node_selector: expected label: value")
    for label, value in selector.items():
        kubernetes.add_node_selector(task, label_key=str(label), label_value=str(value))
    for i, toleration in enumerate(spec.get("tolerations") or []):
        allowed = {"key", "operator", "value", "effect", "toleration_seconds"}
        if not isinstance(toleration, Mapping) or set(toleration) - allowed:
            raise ValueError(
                f"params.yaml: resources.{name}.tolerations[{i}]: a mapping of {sorted(allowed)}"
            )
        kubernetes.add_toleration(task, **toleration)
    return task


MLFLOW_CONFIG_MAP = "mlflow-client-env"  # k8s/mlflow/client-env.yaml
MLFLOW_AUTH_SECRET = "mlflow-auth"  # the pipeline user of the tracking server (basic auth)
MLFLOW_CLIENT_LABEL = "paddle-mlops/mlflow-client"  # admitted by the MLflow NetworkPolicy
S3_SECRET = "pipeline-s3"  # optional: credentials of s3:// ingest sources


def with_cluster_env(task: dsl.PipelineTask, *, s3: bool = False) -> dsl.PipelineTask:
    """Tracking URI from the ConfigMap, credentials from Secrets (never in the spec), and the
    label the MLflow NetworkPolicy admits (k8s/mlflow/networkpolicy.yaml)."""
    kubernetes.use_config_map_as_env(
        task, MLFLOW_CONFIG_MAP, {"MLFLOW_TRACKING_URI": "MLFLOW_TRACKING_URI"}
    )
    # the server runs basic-auth: without the pipeline user's Secret the pod does not start
    kubernetes.use_secret_as_env(
        task,
        MLFLOW_AUTH_SECRET,
        {"username": "MLFLOW_TRACKING_USERNAME", "password": "MLFLOW_TRACKING_PASSWORD"},
        optional=False,
    )
    kubernetes.add_pod_label(task, MLFLOW_CLIENT_LABEL, "true")
    if s3:
        kubernetes.use_secret_as_env(
            task,
            S3_SECRET,
            {
                "access_key_id": "AWS_ACCESS_KEY_ID",
                "secret_access_key": "AWS_SECRET_ACCESS_KEY",
                "endpoint_url": "AWS_ENDPOINT_URL_S3",
            },
            optional=True,
        )
    return task


# provenance (docs/provenance.md): promote alone holds the private key (a Secret mounted as a
# file, never a parameter) and the registry credentials it writes signatures with; deploy gets
# the trusted public keys (a ConfigMap) and reads the registry with the same credentials
SIGNING_SECRET = "paddle-mlops-signing-key"  # key: signing.key
SIGNING_MOUNT = "/var/run/secrets/paddle-mlops/signing"
TRUST_CONFIG_MAP = "paddle-mlops-trusted-keys"  # key: trusted.pub
REGISTRY_AUTH_MOUNT = "/var/run/secrets/paddle-mlops/registry"
# docker config JSON is under `.dockerconfigjson` (what the type requires) and, the same
# bytes, under `config.json`: mounted at KANIKO_DOCKER_CONFIG it is the file kaniko reads,
# /kaniko/.docker/config.json (kfp-kubernetes mounts a whole Secret, it cannot rename a key).
# Create it with the command at the end of k8s/pipelines/secrets.template.yaml.
REGISTRY_PUSH_SECRET = "registry-push"
KANIKO_DOCKER_CONFIG = "/kaniko/.docker"


def with_registry_auth(task: dsl.PipelineTask) -> dsl.PipelineTask:
    kubernetes.use_secret_as_volume(task, REGISTRY_PUSH_SECRET, mount_path=REGISTRY_AUTH_MOUNT)
    return task.set_env_variable("REGISTRY_AUTH_FILE", f"{REGISTRY_AUTH_MOUNT}/config.json")


def with_signing_key(task: dsl.PipelineTask) -> dsl.PipelineTask:
    kubernetes.use_secret_as_volume(task, SIGNING_SECRET, mount_path=SIGNING_MOUNT)
    task.set_env_variable("PADDLE_MLOPS_SIGNING_KEY", f"{SIGNING_MOUNT}/signing.key")
    return with_registry_auth(task)


def with_trusted_keys(task: dsl.PipelineTask) -> dsl.PipelineTask:
    kubernetes.use_config_map_as_env(
        task, TRUST_CONFIG_MAP, {"trusted.pub": "PADDLE_MLOPS_TRUSTED_KEYS"}
    )
    return with_registry_auth(task)
