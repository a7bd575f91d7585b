"""Submit a Katib ``Experiment`` and wait for its best trial, with the ``kubernetes`` client.

No ``kubeflow-katib`` SDK: it pins ``protobuf<5`` and the project pins protobuf 6 (kfp, mlflow).
Its ``KatibClient.create_experiment`` / ``wait_for_experiment_condition`` /
``get_optimal_hyperparameters`` are the calls made here: ``CustomObjectsApi``'s
``create_namespaced_custom_object`` and ``get_namespaced_custom_object`` on
``kubeflow.org/v1beta1 experiments``.

* **Config**: in-cluster (a pod's service account), else the kubeconfig (``$KUBECONFIG``,
  default ``~/.kube/config``, an optional context), as ``components.kube.cluster`` loads it.
  Neither: :class:`NoCluster`, one line, exit code :data:`EXIT_NO_CLUSTER` from the hpo CLI.
* **Create**: an Experiment of the same name already there (the name is a hash of the search:
  a rerun of the same search) is not created again: its status is read (a resumed wait).
* **Wait**: read the Experiment on a backoff (``hpo.katib.poll``) until a ``Succeeded`` or
  ``Failed`` condition holds (:func:`outcome`, a pure function of the document):
  ``Succeeded`` gives ``status.currentOptimalTrial``'s ``parameterAssignments`` mapped back to
  dotted params keys and parsed as ``--set`` values; ``Failed`` is one error line with the
  condition's reason and message; the deadline is one line naming the last condition.
  Failed reads (no answer, HTTP 429 or 5xx) count as "not finished yet"; other HTTP errors
  (403: the service account may not read experiments) end the wait at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from components.core.artifacts import StepError
from components.core.overrides import parse_value
from components.core.retry import SYSTEM_CLOCK, Backoff, Clock, poll
from components.kube.cluster import NoKubeConfig, api_message, kube_configuration
from components.kube.katib import GROUP, KIND, PLURAL, VERSION

log = logging.getLogger(__name__)

EXIT_NO_CLUSTER = 4  # the hpo CLI's exit code when no cluster is configured (1: any error)
TERMINAL = ("Succeeded", "Failed")


class NoCluster(StepError):
    """Neither an in-cluster config nor a usable kubeconfig."""

    exit_code = EXIT_NO_CLUSTER


@dataclass(frozen=True)
class Outcome:
    """A finished Experiment's best trial: its name, the sample (dotted key -> value) and
    its objective value (None: Katib observed none)."""

    trial: str
    params: dict[str, Any]
    value: float | None
    reason: str = ""
    counts: dict[str, int] = field(default_factory=dict)


def api_client(context: str | None, manifest: str) -> Any:
    """A client of the cluster's API; :class:`NoCluster` (naming ``manifest``, the checked
    experiment.yaml a user can apply by hand) when there is none."""
    from kubernetes import client

    try:
        configuration = kube_configuration(context)
    except NoKubeConfig as exc:
        raise NoCluster(
            f"hpo.engine katib: no cluster configured (no in-cluster service account, no "
            f"usable kubeconfig: {exc}); the checked Experiment is {manifest}: "
            f"`kubectl apply -f {manifest}` submits it"
        ) from None
    return client.ApiClient(configuration)


def _retryable(exc: BaseException) -> bool:
    status = getattr(exc, "status", None)
    return status is None or status == 429 or status >= 500


class Experiments:
    """``create`` and ``get`` of Experiments in one namespace (``CustomObjectsApi``)."""

    def __init__(self, api: Any, namespace: str, timeout_s: float) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api)
        self.ns, self.timeout = namespace, (timeout_s, timeout_s)

    @staticmethod
    def _errors() -> tuple[type[BaseException], ...]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        return ApiException, HTTPError, OSError

    def create(self, body: Mapping[str, Any]) -> bool:
        """Create it; False when an Experiment of that name exists (the same search)."""
        name = body["metadata"]["name"]
        try:
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, dict(body), _request_timeout=self.timeout
            )
        except self._errors() as exc:
            if getattr(exc, "status", None) == 409:
                return False
            raise StepError(f"create {KIND} {self.ns}/{name}: {api_message(exc)}") from None
        return True

    def get(self, name: str) -> dict[str, Any] | None:
        """The Experiment; None when the read failed for a moment (retried by the wait)."""
        try:
            return self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, name, _request_timeout=self.timeout
            )
        except self._errors() as exc:
            if not _retryable(exc):
                raise StepError(f"read {KIND} {self.ns}/{name}: {api_message(exc)}") from None
            log.warning("read %s %s/%s: %s (retried)", KIND, self.ns, name, api_message(exc))
            return None


# --------------------------------------------------------------------------- decisions


def terminal(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The last ``Succeeded`` or ``Failed`` condition that holds (status True), else None."""
    conditions = ((doc.get("status") or {}).get("conditions")) or []
    done = [c for c in conditions if c.get("type") in TERMINAL and c.get("status") == "True"]
    return done[-1] if done else None


def last_condition(doc: Mapping[str, Any]) -> str:
    conditions = ((doc.get("status") or {}).get("conditions")) or []
    if not conditions:
        return "no condition yet"
    c = conditions[-1]
    return f"{c.get('type')} ({c.get('reason', '')}: {c.get('message', '')})"


def outcome(
    doc: Mapping[str, Any], keys: Mapping[str, str], objective: str, direction: str
) -> Outcome | None:
    """What a read Experiment says (module docstring): None while it runs; its best trial
    once ``Succeeded`` (``keys``: Katib parameter name -> dotted params key); ``Failed`` and a
    success without a best trial raise one line."""
    meta, status = doc.get("metadata") or {}, doc.get("status") or {}
    where = f"{KIND} {meta.get('namespace')}/{meta.get('name')}"
    end = terminal(doc)
    if end is None:
        return None
    if end["type"] == "Failed":
        raise StepError(
            f"{where} failed: {end.get('reason', 'no reason')}: {end.get('message', '')}"
            f" (trials: {_counts(status)})"
        )
    best = status.get("currentOptimalTrial") or {}
    assignments = best.get("parameterAssignments") or []
    if not assignments:
        raise StepError(
            f"{where} succeeded ({end.get('reason', '')}) but has no optimal trial: no trial "
            f"reported {objective} (trials: {_counts(status)})"
        )
    params = {}
    for a in assignments:
        name = a.get("name")
        if name not in keys:
            raise StepError(f"{where}: optimal trial assigns {name!r}, not a searched parameter")
        params[keys[name]] = parse_value(str(a.get("value")))
    value = None
    strategy = "max" if direction == "maximize" else "min"
    for m in (best.get("observation") or {}).get("metrics") or []:
        if m.get("name") == objective:
            try:
                value = float(m.get(strategy, m.get("latest")))
            except (TypeError, ValueError):
                value = None
    return Outcome(
        trial=str(best.get("bestTrialName") or ""),
        params=params,
        value=value,
        reason=str(end.get("reason", "")),
        counts=_count_map(status),
    )


def _count_map(status: Mapping[str, Any]) -> dict[str, int]:
    keys = ("trials", "trialsSucceeded", "trialsFailed", "trialsEarlyStopped", "trialsKilled")
    return {k: int(status[k]) for k in keys if isinstance(status.get(k), int)}


def _counts(status: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in _count_map(status).items()) or "none"


def wait(
    read: Callable[[], Mapping[str, Any] | None],
    keys: Mapping[str, str],
    objective: str,
    direction: str,
    backoff: Backoff,
    *,
    name: str,
    clock: Clock = SYSTEM_CLOCK,
) -> Outcome:
    """Read the Experiment (``read``: None = a failed read) under ``backoff`` until
    :func:`outcome` decides; the deadline is one line naming the last condition seen."""
    last: dict[str, Any] = {}

    def check() -> Outcome | None:
        doc = read()
        if doc is None:
            return None
        last.clear()
        last.update(doc)
        return outcome(doc, keys, objective, direction)

    found = poll(check, backoff, clock=clock)
    if found is None:
        raise StepError(
            f"{KIND} {name} did not finish within {backoff.deadline_s or 0:.0f} s "
            f"(hpo.katib.poll.deadline_s); last condition: {last_condition(last)}; it keeps "
            "running on the cluster: a rerun of the same search waits for it again"
        )
    return found


def submit_and_wait(
    body: Mapping[str, Any],
    keys: Mapping[str, str],
    objective: str,
    direction: str,
    backoff: Backoff,
    *,
    api: Any,
    timeout_s: float,
    clock: Clock = SYSTEM_CLOCK,
) -> Outcome:
    """Create ``body`` (or find the same search's Experiment) and wait for its best trial."""
    meta = body["metadata"]
    experiments = Experiments(api, meta["namespace"], timeout_s)
    created = experiments.create(body)
    log.info(
        "%s %s %s/%s",
        "created" if created else "found the same search's",
        KIND,
        meta["namespace"],
        meta["name"],
    )
    found = wait(
        lambda: experiments.get(meta["name"]),
        keys,
        objective,
        direction,
        backoff,
        name=f"{meta['namespace']}/{meta['name']}",
        clock=clock,
    )
    log.info(
        "%s %s: %s; best trial %s %s=%s", KIND, meta["name"], found.reason, found.trial,
        objective, found.value,
    )  # fmt: skip
    return found
