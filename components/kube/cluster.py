"""The ``kubernetes`` deploy target: server-side apply with the official client (in-cluster
config, else the kubeconfig), ``deploy.dry_run`` for a server-side dry run, then the wait for
the rollout (library layer; the interface: ``components.core.deploy_target``)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from components.core.artifacts import StepError
from components.core.deploy_target import DeploySettings, Rollout
from components.core.retry import SYSTEM_CLOCK, Clock, every, poll

log = logging.getLogger(__name__)

FIELD_MANAGER = "paddle-mlops-deploy"
ROLLOUT_POLL_S = 2.0  # how often wait_rollout reads each object: deploy.rollout_poll_s's default


class NoKubeConfig(Exception):
    """Neither an in-cluster service account nor a usable kubeconfig (the message says why)."""


def kube_configuration(context: str | None = None) -> Any:
    """The cluster's client configuration: in-cluster, else the kubeconfig (``$KUBECONFIG``,
    default ~/.kube/config) with ``context``; :class:`NoKubeConfig` when there is neither."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except ConfigException:
        try:
            config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None,
                context=context,
                client_configuration=configuration,
            )
        except (ConfigException, OSError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise NoKubeConfig(reason) from None
    return configuration


def api_message(exc: BaseException) -> str:
    """An ApiException's status, reason and the API server's message; else the error."""
    if not hasattr(exc, "status"):
        return f"no answer from the API server ({exc})"
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    body = getattr(exc, "body", None)
    message = ""
    if body:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = str(body)[:300]
    return f"HTTP {status} {reason}" + (f": {message}" if message else "")


def deploy(rollout: Rollout) -> dict[str, Any]:
    """Apply every rendered variant, then (no dry run) wait for each to roll out."""
    rendered, params = rollout.rendered, rollout.params
    applied = [a for docs in rendered.values() for a in apply_kubernetes(docs, params)]
    if not params.dry_run:
        for docs in rendered.values():
            wait_rollout(docs, params)
    return {"applied": applied}


def apply_kubernetes(docs: list[dict[str, Any]], params: DeploySettings) -> list[str]:
    """Server-side apply of ``docs``; returns ``kind/name`` of each (dry run: nothing kept)."""
    from kubernetes import client, dynamic

    try:
        configuration = kube_configuration(params.kube_context)
    except NoKubeConfig as exc:
        raise StepError(
            f"deploy.target kubernetes: no in-cluster config and no usable kubeconfig ({exc})"
        ) from None
    dyn = dynamic.DynamicClient(client.ApiClient(configuration))
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


def wait_rollout(
    docs: list[dict[str, Any]],
    params: DeploySettings,
    clock: Clock = SYSTEM_CLOCK,
    *,
    dyn: Any = None,
) -> None:
    """Wait until each Deployment runs its new pods and each InferenceService is Ready: each
    read every ``deploy.rollout_poll_s``, all within one ``deploy.rollout_timeout_s``.
    ``dyn``: the Kubernetes dynamic client (None: one on the loaded config)."""
    if dyn is None:
        from kubernetes import client, dynamic

        dyn = dynamic.DynamicClient(client.ApiClient())
    end = clock.monotonic() + params.rollout_timeout_s
    for doc in docs:
        if doc["kind"] in ("Deployment", "InferenceService"):
            _wait_one(dyn, doc, end, params, clock)


def _wait_one(
    dyn: Any, doc: dict[str, Any], end: float, params: DeploySettings, clock: Clock
) -> None:
    """Read ``doc``'s object until it has rolled out, at most until ``end`` (clock time)."""
    api = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    name, ns = doc["metadata"]["name"], doc["metadata"]["namespace"]
    last: dict[str, Any] = {}

    def _ready() -> bool:
        last.clear()  # the last object read, for the error
        last.update(dyn.get(api, name=name, namespace=ns).to_dict())
        return _rolled_out(last)

    left_s = max(0.0, end - clock.monotonic())
    if not poll(_ready, every(params.rollout_poll_s, left_s), clock=clock):
        raise StepError(
            f"{doc['kind']}/{name} did not become ready within "
            f"{params.rollout_timeout_s:.0f} s (deploy.rollout_timeout_s); status: "
            f"{str(last.get('status'))[:400]}"
        )


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
