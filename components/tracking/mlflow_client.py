"""The MLflow client the steps share: the tracking URI, the client, experiments, nested step
runs, MLflow's HTTP retries (``track.retry``, ``registry.retry``), and downloading a
registered version's bundle.

Library layer. Tracking URI: ``MLFLOW_TRACKING_URI`` if set, else ``sqlite:///mlflow.db`` in
the working directory (no server needed).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from components.core.artifacts import StepError
from components.core.config import params_model
from components.core.retry import BackoffParams
from components.tracking.liveness import (
    FAILURE_TAG,
    PIPELINE_RUN_TAG,
    dead_owner,
    mark_failed,
    owner_tags,
)
from components.tracking.model import BUNDLE_TAG, bundle_dir, bundle_sha256

log = logging.getLogger("components.tracking.registry")  # the registry's logger, as before

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
# MLflow 3's experiment type: a model-training experiment (runs, charts, models), not a GenAI
# one (traces); the UI's "Machine learning" kind
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
# ... which MLflow 3.17's UI shows only with ?workflowType=machine_learning in its URL (it
# lands on the GenAI overview otherwise, whatever the tag says)
UI_WORKFLOW = "machine_learning"
# the per-epoch curves of a run: metrics ``training/<key>`` with step = epoch (the UI puts a
# prefixed section before the unprefixed metrics)
CURVE_PREFIX = "training/"
STEP_TAG = "step"  # the pipeline step a nested run records
NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"  # MlflowException.error_code of a missing model/version


def health_default() -> BackoffParams:
    # asking a starting server for /health: 0.5 s, doubling, at most 5 s between tries (the
    # deadline: ``mlflow-users --wait-s``)
    return BackoffParams(first_s=0.5, max_s=5.0)


@params_model
class TrackingRetry:
    """How long a step keeps trying a tracking server that does not answer: MLflow's own
    HTTP retries (connection errors, 429 and 5xx) with exponential backoff, then one
    readable error line (``components.kernel.cli``)."""

    retries: Annotated[int, Field(ge=0)] = 6  # attempts after the first
    # waits backoff_s * 1, 2, 4, ... between attempts (at most 120 s each)
    backoff_s: Annotated[int, Field(ge=0)] = 1
    timeout_s: Annotated[int, Field(gt=0)] = 60  # per request

    def window_s(self) -> float:
        """The longest a server may be down and a request still get through."""
        return float(sum(min(self.backoff_s * 2**i, 120) for i in range(self.retries)))

    def apply(self) -> None:
        """Set MLflow's retry settings for this process (read at every request)."""
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(self.retries)
        os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = str(self.backoff_s)
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(self.timeout_s)


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def use_experiment(name: str) -> Any:
    """``mlflow.set_experiment(name)`` that makes ``name`` the active experiment even when
    another process created it in the same instant. MLflow 3's ``set_experiment`` returns the
    experiment without making it active when its create loses that race
    (``RESOURCE_ALREADY_EXISTS``), so the runs started next land in experiment 0, "Default":
    two pipelines starting together on a new experiment split between the two. The
    experiment is made active again by id, which has no such path."""
    import mlflow

    experiment = mlflow.set_experiment(name)
    return mlflow.set_experiment(experiment_id=experiment.experiment_id)


def set_experiment_kind(client: Any, experiment_id: str) -> None:
    """Tag the experiment a model-training one (:data:`EXPERIMENT_KIND`) unless it already
    has a kind (a user's choice in the UI stands)."""
    experiment = client.get_experiment(experiment_id)
    if not experiment.tags.get(EXPERIMENT_KIND_TAG):
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)


@contextlib.contextmanager
def step_run(
    client: Any,
    parent_run_id: str,
    step: str,
    tags: dict[str, str] | None = None,
    *,
    stale_after_s: float,
) -> Iterator[str]:
    """A run of ``step`` nested under the pipeline run ``parent_run_id`` (the run track
    made), started now and ended when the block ends: FINISHED, or FAILED (KILLED for an
    interrupt) with ``failure_reason``. The pipeline run's end time moves to this run's end,
    so its duration covers the steps that came after track (register, promote); a parent
    that did not finish keeps its status and end. A run of ``step`` under the same parent
    still RUNNING whose process is gone (a SIGKILLed earlier attempt;
    :func:`components.tracking.liveness.dead_owner`, ``stale_after_s`` for another host's)
    is ended KILLED with the reason first."""
    from mlflow.entities import RunStatus

    parent = client.get_run(parent_run_id)
    earlier = client.search_runs(
        [parent.info.experiment_id],
        filter_string=(
            f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.{STEP_TAG} = '{step}' "
            "and attributes.status = 'RUNNING'"
        ),
    )
    for old in earlier:
        why = dead_owner(old.data.tags, old.info.start_time / 1000.0, stale_after_s)
        if why is not None:
            mark_failed(client, old, "KILLED", f"found RUNNING by a new {step} run: {why}")
    inherited = {
        k: v
        for k, v in parent.data.tags.items()
        if k in (PIPELINE_RUN_TAG, "task", "git_sha", "params_sha256")
    }
    run = client.create_run(
        parent.info.experiment_id,
        tags={
            **inherited,
            **owner_tags(),
            **(tags or {}),
            STEP_TAG: step,
            "mlflow.parentRunId": parent_run_id,
        },
        run_name=step,
    )
    run_id = run.info.run_id
    try:
        yield run_id
    except BaseException as exc:
        status = "KILLED" if isinstance(exc, KeyboardInterrupt | SystemExit) else "FAILED"
        with contextlib.suppress(Exception):
            client.set_tag(run_id, FAILURE_TAG, f"{type(exc).__name__}: {exc}".strip()[:500])
            client.set_terminated(run_id, status)
        raise
    client.set_terminated(run_id, "FINISHED")
    ended = client.get_run(run_id).info.end_time
    parent = client.get_run(parent_run_id)
    if parent.info.status == RunStatus.to_string(RunStatus.FINISHED) and ended > (
        parent.info.end_time or 0
    ):
        client.set_terminated(parent_run_id, "FINISHED", end_time=ended)


@contextlib.contextmanager
def global_tracking_uri(uri: str) -> Iterator[str]:
    """MLflow's process-global tracking URI (and ``MLFLOW_TRACKING_URI``, which
    ``mlflow.set_tracking_uri`` exports) set to ``uri`` for the block, then both put back as
    they were: for the MLflow calls that only read the global one (the fluent API, a
    database registry resolving ``models:/<model_id>``) inside code that holds a client."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    old_uri, old_env = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield uri
    finally:
        mlflow.set_tracking_uri(old_uri)
        if old_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old_env


def client(uri: str | None = None) -> Any:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    uri = uri or tracking_uri()
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def download_version(client: Any, uri: str, name: str, version: int, dest: Path) -> Path:
    """Download a version's MLflow model into ``dest`` and return the serving bundle inside it
    (``components.tracking.model.bundle_dir``), without touching process-global MLflow URIs.

    When the version has a ``bundle_sha256`` tag, the downloaded bundle must hash to it.
    Versions registered before models were MLflow models (the bare bundle as the version's
    files, no MLmodel) are still returned as they are, with a warning, so a new challenger
    can be compared with such a champion.
    """
    import mlflow

    source = client.get_model_version_download_uri(name, str(version))
    root = Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=source, dst_path=str(dest), tracking_uri=uri
        )
    )
    expected = client.get_model_version(name, str(version)).tags.get(BUNDLE_TAG)
    if not (root / "MLmodel").exists() and (root / "signature.json").is_file() and not expected:
        log.warning(
            "%s v%s is a bare bundle, not an MLflow model (registered before track logged "
            "MLflow models); scoring it as it is",
            name,
            version,
        )
        return root
    bundle = bundle_dir(root)
    if expected:
        got = bundle_sha256(bundle)
        if got != expected:
            raise StepError(
                f"{name} v{version}: the downloaded bundle's sha256 {got[:12]} differs from "
                f"the version tag {BUNDLE_TAG} {expected[:12]}: its files changed after "
                "registration"
            )
    return bundle
