"""The Kubernetes API as the launcher uses it: the official ``kubernetes`` client, its
configuration, and the few calls on the job and its pods (see the package's docstring, 5.)."""

import logging
from collections.abc import Mapping
from typing import Any

from components.core.artifacts import StepError
from components.kube.cluster import NoKubeConfig, api_message, kube_configuration
from pipelines.paddlejob.spec import (
    CONTAINER,
    GROUP,
    JOB_NAME_LABEL,
    KIND,
    PLURAL,
    RUN_ANNOTATION,
    VERSION,
    PaddleJobParams,
)

log = logging.getLogger(__package__)  # "pipelines.paddlejob": one logger, as before the split


class ApiError(StepError):
    """A request of the Kubernetes API failed; the message names its object.
    ``status`` None: no answer (connection refused or reset, timeout)."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def retryable(self) -> bool:
        """Worth repeating: the API server unreachable, busy or failing for a moment."""
        return self.status is None or self.status == 429 or self.status >= 500


# --------------------------------------------------------------------------- the API


def api_client(params: PaddleJobParams) -> Any:
    """A client of the cluster's API: in-cluster config, else the kubeconfig (``$KUBECONFIG``,
    default ~/.kube/config) with context ``paddlejob.kube_context``."""
    from kubernetes import client
    from urllib3.util.retry import Retry

    try:
        configuration = kube_configuration(params.kube_context)
    except NoKubeConfig as exc:
        raise StepError(
            f"PaddleJob backend: no in-cluster config and no usable kubeconfig ({exc})"
        ) from None
    # a request that got no answer within paddlejob.api_timeout_s is not sent again by
    # urllib3 (its default repeats reads up to 3 times): the launcher decides (status reads
    # are retried for paddlejob.api_outage_s), and the timeout bounds each call
    configuration.retries = Retry(total=2, read=0, redirect=0)
    return client.ApiClient(configuration)


def request_errors() -> tuple[type[BaseException], ...]:
    """What a request of the client raises when it fails: the API server's answer
    (ApiException), or none (urllib3's errors: refused, reset, timed out; OSError)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return ApiException, HTTPError, OSError


def owner(obj: Mapping[str, Any]) -> str | None:
    """The KFP run named by the job's annotation ``paddle-mlops/run``."""
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(RUN_ANNOTATION)


class Kube:
    """The few calls the launcher makes, with the client's typed APIs. ``create``, ``get`` and
    ``delete`` raise :class:`ApiError` naming the job; ``timeout`` overrides
    ``paddlejob.api_timeout_s`` for one request."""

    def __init__(self, api: Any, params: PaddleJobParams) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.ns = params.namespace
        self.timeout = params.api_timeout_s

    def _timeout(self, timeout: float | None) -> tuple[float, float]:
        """(connect, read) seconds: the client ignores a float (it takes an int or a pair)."""
        seconds = timeout or self.timeout
        return seconds, seconds

    def _error(self, what: str, name: str, exc: BaseException) -> ApiError:
        return ApiError(
            f"{what} {KIND} {self.ns}/{name}: {api_message(exc)}", getattr(exc, "status", None)
        )

    def create(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The created job, or None when a job of that name exists."""
        name = body["metadata"]["name"]
        try:
            return self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, body, _request_timeout=self._timeout(None)
            )
        except request_errors() as exc:
            if getattr(exc, "status", None) == 409:
                return None
            raise self._error("create", name, exc) from exc

    def get(self, name: str, timeout: float | None = None) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, name, _request_timeout=self._timeout(timeout)
            )
        except request_errors() as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self._error("read", name, exc) from exc

    def delete(self, name: str, uid: str | None, timeout: float | None = None) -> bool:
        """Delete the job (its pods and Services are its dependents), only if its uid is
        ``uid`` when given; False if it was gone, or is another object of that name."""
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                self.ns,
                PLURAL,
                name,
                propagation_policy="Background",
                body={"preconditions": {"uid": uid}} if uid else None,
                _request_timeout=self._timeout(timeout),
            )
        except request_errors() as exc:
            status = getattr(exc, "status", None)
            if status == 404:
                return False
            if status == 409 and uid:  # the uid precondition: not the job this launcher knows
                log.warning(
                    "not deleting %s %s/%s: it is not the object of uid %s any more (%s)",
                    KIND,
                    self.ns,
                    name,
                    uid,
                    api_message(exc),
                )
                return False
            raise self._error("delete", name, exc) from exc
        return True

    def pods(self, job: str, timeout: float | None = None) -> list[Any]:
        found = self.core.list_namespaced_pod(
            self.ns,
            label_selector=f"{JOB_NAME_LABEL}={job}",
            _request_timeout=self._timeout(timeout),
        )
        return sorted(found.items or [], key=lambda p: p.metadata.name)

    def log(self, pod: str, since_seconds: int | None, timeout: float | None = None) -> str:
        kwargs: dict[str, Any] = {"container": CONTAINER, "timestamps": True}
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        return self.core.read_namespaced_pod_log(
            pod, self.ns, _request_timeout=self._timeout(timeout), **kwargs
        )
