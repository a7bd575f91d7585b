"""The MLflow tracking/registry client shared by the steps: aliases, lineage, history, the
promotion lock, and the pinned holdout a champion is judged on.

Library layer: imported by steps (track, register) and by the KFP promotion, imports no step.
Tracking URI: ``MLFLOW_TRACKING_URI`` if set, else ``sqlite:///mlflow.db`` in the working
directory (no server needed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from components.core.artifacts import StepError, sha256_file
from components.core.config import params_model
from components.core.retry import SYSTEM_CLOCK, Backoff, Clock, poll, retry_call
from components.faults import failpoints
from components.ml.data import snapshot
from components.tracking.liveness import (
    FAILURE_TAG,
    PIPELINE_RUN_TAG,
    dead_owner,
    mark_failed,
    owner_tags,
)
from components.tracking.model import BUNDLE_TAG, bundle_dir, bundle_sha256

log = logging.getLogger(__name__)

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
CHAMPION, CHALLENGER, PREVIOUS = "champion", "challenger", "previous-champion"
HISTORY_TAG = "champion_history"
LINEAGE_TAGS = (
    "git_sha",
    "data_sha256",
    "params_sha256",
    "ge_success",
    "qat_gate_passed",
    # what the serving image is built from (the image itself is named once one exists:
    # serving_image, set by track for a local build and by promote with the pushed digest)
    "serving_image_context_sha256",
    "infra_validated",
    "bundle_sha256",  # components.tracking.model.BUNDLE_TAG: the served files, byte for byte
)
TAG_LIMIT = 5000
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


# a concurrent first write of the same alias: MLflow's SQL store reads, then inserts, so two
# writers can both insert; the loser's error names the database's unique-key violation
_ALIAS_RACE = re.compile(
    r"IntegrityError|UniqueViolation|UNIQUE constraint|duplicate key|Duplicate entry", re.I
)
# the waits between those writes (the loser's row exists at once: short waits)
ALIAS_RACE_BACKOFF = Backoff(first_s=0.05, max_s=1.0, attempts=5)
# a promotion waiting for the promotion lock: 0.05 s, doubling, at most 1 s between tries
# (the deadline is ``registry.lock_timeout_s``)
LOCK_BACKOFF_FIRST_S, LOCK_BACKOFF_MAX_S = 0.05, 1.0


def set_alias(
    client: Any,
    name: str,
    alias: str,
    version: int | str,
    attempts: int = 5,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Point ``alias`` of ``name`` at ``version``, as ``set_registered_model_alias`` does, but
    riding out the race of two first writes of one alias (two pipelines registering at once):
    MLflow answers the loser with BAD_REQUEST and a unique-key violation; by then the row
    exists, so the next attempt updates it (``attempts`` in all, :data:`ALIAS_RACE_BACKOFF`).
    Any other error is raised at once."""
    from mlflow.exceptions import MlflowException

    def _race(exc: BaseException) -> bool:
        return isinstance(exc, MlflowException) and bool(_ALIAS_RACE.search(str(exc)))

    def _again(_attempt: int, _exc: BaseException) -> None:
        log.info("%s: alias %s written concurrently; writing it again", name, alias)

    retry_call(
        lambda: client.set_registered_model_alias(name, alias, str(version)),
        dataclasses.replace(ALIAS_RACE_BACKOFF, attempts=attempts),
        _race,
        clock=clock,
        before_wait=_again,
    )


class ChampionChanged(StepError):
    """A promotion's compare-and-set failed: another promotion moved the champion after the
    challenger was judged; nothing was changed."""


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


@params_model
class RegistryParams:
    """``params.yaml: registry``: the registered model and how changes of its champion
    are serialised (read by register, promote and ``paddle-mlops registry``)."""

    model_name: str | None = None  # default: "<task>-<Task.model_kind>" (digits-classifier)
    # how long a promotion waits for another to finish
    lock_timeout_s: Annotated[float, Field(gt=0)] = 120.0
    # a lock from another host older than this is abandoned
    lock_stale_s: Annotated[float, Field(gt=0)] = 600.0
    history_length: Annotated[int, Field(gt=0)] = 25
    retry: TrackingRetry = field(default_factory=TrackingRetry)


BUILTIN_MODEL_KIND = "classifier"  # the model_kind of every built-in task


def registered_name(params: RegistryParams, task_name: str, model_kind: str) -> str:
    """``registry.model_name``, else ``<task>-<model_kind>`` (``digits-classifier``)."""
    return params.model_name or f"{task_name}-{model_kind}"


def model_name(params: RegistryParams, task: Any) -> str:
    """The registered model name of ``task`` (:func:`registered_name`, ``Task.model_kind``)."""
    return registered_name(params, task.name, task.model_kind)


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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


# --------------------------------------------------------------------------- registry


class Registry:
    """Aliases, lineage, history and the promotion lock of one registered model."""

    def __init__(self, client: Any, name: str, params: RegistryParams, clock: Clock = SYSTEM_CLOCK):
        self.client, self.name, self.params = client, name, params
        self.clock = clock  # the promotion lock's waits (components.core.retry)
        self.lock_name = f"{name}--promotion-lock"
        params.retry.apply()

    # reading ------------------------------------------------------------------------
    def exists(self) -> bool:
        """Whether the model is registered; any other failure (a server that does not
        answer) is raised, never taken for "not registered"."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(self.name)
        except MlflowException as exc:
            if exc.error_code == NOT_FOUND:
                return False
            raise
        return True

    def aliases(self) -> dict[str, int]:
        if not self.exists():
            return {}
        model = self.client.get_registered_model(self.name)
        return {alias: int(version) for alias, version in model.aliases.items()}

    def version(self, version: int) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_model_version(self.name, str(version))
        except MlflowException as exc:
            if exc.error_code != NOT_FOUND:
                raise
            raise StepError(f"registered model '{self.name}' has no version {version}") from exc

    def history(self) -> list[dict[str, Any]]:
        if not self.exists():
            return []
        raw = self.client.get_registered_model(self.name).tags.get(HISTORY_TAG)
        return json.loads(raw) if raw else []

    def missing_lineage(self, version: int) -> list[str]:
        tags = self.version(version).tags
        return [t for t in LINEAGE_TAGS if not tags.get(t)]

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.name, "aliases": self.aliases()}
        for alias in (CHAMPION, CHALLENGER, PREVIOUS):
            if alias in out["aliases"]:
                mv = self.version(out["aliases"][alias])
                out[alias] = {
                    "version": int(mv.version),
                    "tags": dict(mv.tags),
                    "run_id": mv.run_id,
                    "source": mv.source,
                }
        out["history"] = self.history()
        if self.exists():
            tags = self.client.get_registered_model(self.name).tags
            shown = (*HOLDOUT_TAGS, HOLDOUT_FORMAT_TAG, "holdout_replaced")
            out["holdout"] = {t: tags[t] for t in shown if t in tags}
        return out

    # lock -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self) -> Iterator[str]:
        """Registry-wide mutex: creating a registered model is unique in the backend DB."""
        from mlflow.exceptions import MlflowException

        token = uuid.uuid4().hex
        backoff = Backoff(
            first_s=LOCK_BACKOFF_FIRST_S,
            max_s=LOCK_BACKOFF_MAX_S,
            deadline_s=self.params.lock_timeout_s,
        )

        def _try() -> bool:
            try:
                self.client.create_registered_model(
                    self.lock_name,
                    tags={
                        "token": token,
                        "owner": _actor(),
                        "acquired_at": str(time.time()),
                        **owner_tags(),
                    },
                    description=f"held while '{self.name}' changes champion; safe to delete "
                    "if no promotion is running",
                )
                return True
            except MlflowException as exc:
                # RESOURCE_DOES_NOT_EXIST: the holder deleted the lock while the server was
                # creating ours (a race seen in test_registry); refused this time, like a lock
                # that exists
                if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"):
                    raise
            return False

        def _refused(attempt: int) -> None:
            if attempt == 1:  # the first refusal: say what it waits for, once
                log.info(
                    "registered model '%s': waiting for '%s', held by another promotion "
                    "(up to %.0f s)",
                    self.name,
                    self.lock_name,
                    self.params.lock_timeout_s,
                )
            self._break_stale_lock()

        if not poll(_try, backoff, clock=self.clock, before_wait=_refused):
            raise StepError(
                f"registered model '{self.name}': another promotion holds "
                f"'{self.lock_name}' for over {self.params.lock_timeout_s:.0f} s"
            )
        try:
            yield token
        finally:
            with contextlib.suppress(MlflowException):
                held = self.client.get_registered_model(self.lock_name).tags.get("token")
                if held == token:
                    self.client.delete_registered_model(self.lock_name)

    def _break_stale_lock(self) -> None:
        from mlflow.exceptions import MlflowException

        try:
            tags = self.client.get_registered_model(self.lock_name).tags
        except MlflowException:
            return  # released meanwhile
        acquired = float(tags.get("acquired_at", "0") or 0)
        why = dead_owner(tags, acquired, self.params.lock_stale_s)
        if why:
            log.warning(
                "breaking the promotion lock of %s held by %s: %s",
                self.name,
                tags.get("owner"),
                why,
            )
            with contextlib.suppress(MlflowException):
                if self.client.get_registered_model(self.lock_name).tags.get("token") == tags.get(
                    "token"
                ):
                    self.client.delete_registered_model(self.lock_name)

    # changing -------------------------------------------------------------------------
    def _record(
        self, action: str, version: int, previous: int | None, *, forced: bool, reason: str
    ) -> dict[str, Any]:
        """Append a champion change to the history tag and return it."""
        event = {
            "action": action,
            "version": version,
            "previous": previous,
            "at": _now(),
            "by": _actor(),
            "forced": forced,
            "reason": reason,
        }
        past = self.history()
        if past and all(past[-1].get(k) == event[k] for k in ("action", "version", "previous")):
            return past[-1]  # recorded by an attempt that died before it finished
        history = (past + [event])[-self.params.history_length :]
        text = json.dumps(history, separators=(",", ":"))
        while len(text) > TAG_LIMIT and len(history) > 1:
            history = history[1:]
            text = json.dumps(history, separators=(",", ":"))
        self.client.set_registered_model_tag(self.name, HISTORY_TAG, text)
        return event

    def promote(
        self,
        version: int,
        *,
        force: bool = False,
        reason: str = "",
        expected_champion: int | None | str = "any",
    ) -> dict[str, Any]:
        """Make ``version`` the champion; refuses missing lineage, and unblessed unless forced.

        ``expected_champion`` (compare-and-set): the champion the blessing was judged
        against; if another promotion changed it meanwhile, nothing is changed.
        """
        mv = self.version(version)
        missing = self.missing_lineage(version)
        if missing:
            raise StepError(
                f"{self.name} v{version}: refusing to promote, lineage tags missing: "
                f"{', '.join(missing)} (register it through the pipeline so they are recorded)"
            )
        if force and not reason.strip():
            raise StepError("a forced promotion needs --reason TEXT (it is recorded)")
        if not force and mv.tags.get("blessed") != "true":
            why = mv.tags.get("blessing_reasons") or "it was never blessed"
            raise StepError(
                f"{self.name} v{version} is not blessed: {why}. "
                "Promote anyway with --force --reason TEXT"
            )
        with self.lock():
            current = self.aliases().get(CHAMPION)
            if current == version and mv.tags.get("promoted_at"):
                log.info("%s v%d already is the champion", self.name, version)
                return {"action": "noop", "version": version}
            elif current == version:  # a promotion killed after the alias moved: finish it
                log.warning("%s v%d: finishing an interrupted promotion", self.name, version)
                current = self._last_promotion_previous(version)
            elif expected_champion != "any" and current != expected_champion:
                raise ChampionChanged(
                    f"{self.name}: the champion changed from {version_label(expected_champion)} to "
                    f"{version_label(current)} while v{version} was being blessed against it; run "
                    "register again to bless it against the new champion"
                )
            elif current is not None:
                set_alias(self.client, self.name, PREVIOUS, current)
            failpoints.hit("promote.between_aliases", f"{self.name} v{version}")
            set_alias(self.client, self.name, CHAMPION, version)
            failpoints.hit("promote.after_alias", f"{self.name} v{version}")
            event = self._record("promote", version, current, forced=force, reason=reason)
            self.client.set_model_version_tag(self.name, str(version), "promoted_at", event["at"])
            self._pin_holdout(mv)
            if force:
                self.client.set_model_version_tag(
                    self.name, str(version), "forced_promotion_reason", reason[:TAG_LIMIT]
                )
        log.info(
            "%s: champion %s -> v%d%s",
            self.name,
            version_label(current),
            version,
            f" (forced: {reason})" if force else "",
        )
        return event

    def _last_promotion_previous(self, version: int) -> int | None:
        """The champion before ``version``: the ``previous-champion`` alias unless it is
        ``version`` itself (then there was none)."""
        previous = self.aliases().get(PREVIOUS)
        return None if previous == version else previous

    def _pin_holdout(self, mv: Any) -> None:
        """The first champion's test split becomes the holdout every later blessing uses.

        A pin made before data snapshots (a ``test.npz`` / ``test.jsonl`` file, no
        ``holdout_format`` tag) cannot be read any more: the first champion whose split was
        logged as a snapshot replaces it (recorded in ``holdout_replaced``)."""
        tags = self.client.get_registered_model(self.name).tags
        legacy = bool(tags.get("holdout_sha256")) and tags.get(HOLDOUT_FORMAT_TAG) != HOLDOUT_FORMAT
        if tags.get("holdout_sha256") and not legacy:
            return
        sha = mv.tags.get("test_split_sha256")
        if not sha or mv.tags.get(SPLIT_FORMAT_TAG) != HOLDOUT_FORMAT:
            log.warning(
                "%s v%s carries no test split in the snapshot format (tags test_split_sha256, "
                "%s): no holdout pinned%s",
                self.name,
                mv.version,
                SPLIT_FORMAT_TAG,
                " (the pre-snapshot pin stays, unreadable)" if legacy else " yet",
            )
            return
        if legacy:
            note = (
                f"v{tags.get('holdout_version')} (sha256 {tags['holdout_sha256'][:12]}), stored "
                f"before data snapshots, replaced by v{mv.version} at {_now()}"
            )
            self.client.set_registered_model_tag(self.name, "holdout_replaced", note)
            log.warning("%s: pinned holdout %s", self.name, note)
        for key, value in (*self.test_split(mv).items(), (HOLDOUT_FORMAT_TAG, HOLDOUT_FORMAT)):
            self.client.set_registered_model_tag(self.name, key, str(value))
        log.info(
            "%s: pinned holdout = test split of v%s (sha256 %s)", self.name, mv.version, sha[:12]
        )

    def test_split(self, mv: Any) -> dict[str, str]:
        """Where the test split ``mv`` was blessed on is stored (its run's ``holdout/``), as
        the tags a holdout pin records and :func:`fetch_holdout` reads."""
        uri = self.client.get_run(mv.run_id).info.artifact_uri.rstrip("/") + "/" + HOLDOUT_DIR
        return {
            "holdout_version": str(mv.version),
            "holdout_sha256": str(mv.tags.get("test_split_sha256", "")),
            "holdout_uri": uri,
        }

    def record_judgement(self, action: str, version: int, reason: str) -> dict[str, Any]:
        """Record a live-traffic verdict on a challenger that did not become champion (the
        judge's rollback): a history event and tags on the version; the aliases stay."""
        with self.lock():
            champion = self.aliases().get(CHAMPION)
            event = self._record(action, version, champion, forced=False, reason=reason)
            self.client.set_model_version_tag(self.name, str(version), "judged", action)
            self.client.set_model_version_tag(
                self.name, str(version), "judged_reason", reason[:TAG_LIMIT]
            )
        log.info("%s: v%d %s on live traffic: %s", self.name, version, action, reason)
        return event

    def rollback(self, *, reason: str = "") -> dict[str, Any]:
        """Restore the previous champion (alias ``previous-champion``) in one call."""
        with self.lock():
            aliases = self.aliases()
            previous, current = aliases.get(PREVIOUS), aliases.get(CHAMPION)
            if previous is None:
                raise StepError(f"{self.name}: no '{PREVIOUS}' alias, nothing to roll back to")
            set_alias(self.client, self.name, CHAMPION, previous)
            if current is not None and current != previous:
                set_alias(self.client, self.name, PREVIOUS, current)
            event = self._record("rollback", previous, current, forced=False, reason=reason)
        log.info("%s: rolled back champion %s -> v%d", self.name, version_label(current), previous)
        return event


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


# --------------------------------------------------------------------------- holdout

HOLDOUT_TAGS = ("holdout_version", "holdout_sha256", "holdout_uri")
HOLDOUT_DIR = "holdout"  # run artifact path: the split a version was blessed on (a mini snapshot)
# the format of a pinned holdout (registered-model tag) and of a version's logged split
# (version tag): pins made before data snapshots (a test.npz / test.jsonl file) lack it
HOLDOUT_FORMAT = "snapshot"
HOLDOUT_FORMAT_TAG, SPLIT_FORMAT_TAG = "holdout_format", "test_split_format"
SNAPSHOT_TAG = "snapshot_sha256"  # the version's training snapshot: its snapshot.json's sha256
KEYS_DIR, KEYS_FILE = "training_keys", "keys.npy"  # run artifact: the train + val sample keys
KEYS_SHA_TAG, KEYS_COUNT_TAG = "training_keys_sha256", "training_keys_count"
TRAINING_SPLITS = ("train", "val")  # what a model saw while it was made (val: early stopping)


def log_test_split(client: Any, run_id: str, data_dir: Path, split: str) -> str:
    """Store the split a version is blessed on with its run (``holdout/``: a mini snapshot of
    that split, :func:`components.ml.data.snapshot.subset`); returns its combined sha256
    (:meth:`components.ml.data.snapshot.Snapshot.split_sha256`), what a pin records."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        mini = snapshot.subset(data_dir, Path(tmp) / HOLDOUT_DIR, [split])
        client.log_artifacts(run_id, str(mini.root), HOLDOUT_DIR)
        return mini.split_sha256(split)


def fetch_holdout(client: Any, uri: str, tags: dict[str, str], dest: Path, split: str) -> Path:
    """Download the pinned holdout and prove it is the one that was pinned: every shard's
    sha256 against its manifest, the manifest's shards against the pin (``holdout_sha256``).
    Returns a snapshot directory whose holdout samples read as split ``split``."""
    import mlflow
    from mlflow.exceptions import MlflowException

    what = f"pinned holdout of v{tags['holdout_version']} at {tags['holdout_uri']}"
    try:
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=tags["holdout_uri"], dst_path=str(dest), tracking_uri=uri
            )
        )
    except (MlflowException, OSError) as exc:
        raise StepError(f"{what} cannot be downloaded ({exc})") from exc
    if not (local / snapshot.SNAPSHOT_FILE).is_file():
        found = sorted(p.name for p in local.iterdir())
        raise StepError(
            f"{what}: no {snapshot.SNAPSHOT_FILE} (found {found}): it was stored before data "
            "snapshots; promote a champion with `paddle-mlops registry promote --force "
            "--reason TEXT` to pin its split instead"
        )
    snap = snapshot.load(local)
    splits = sorted({s.split for s in snap.shards})
    if len(splits) != 1:
        raise StepError(f"{what}: expected the shards of one split, found splits {splits}")
    stored = splits[0]
    got = snap.split_sha256(stored)
    if got != tags["holdout_sha256"]:
        raise StepError(
            f"{what}: its shards (snapshot.json) hash to {got[:12]}, not the pinned "
            f"{tags['holdout_sha256'][:12]} (registered-model tag holdout_sha256); it was "
            "changed after it was pinned"
        )
    for shard in snap.shards:
        path = snap.path(shard)
        actual = sha256_file(path) if path.is_file() else "(missing)"
        if actual != shard.sha256:
            raise StepError(
                f"{what}: shard {shard.path} has sha256 {actual[:12]}, the pinned holdout's "
                f"snapshot.json {shard.sha256[:12]}; it was changed after it was pinned"
            )
    if stored != split:  # pinned from another split name (register.split changed): read as
        doc = {k: v for k, v in snap.doc.items() if k != "format_version"}
        doc["shards"] = [{**asdict(s), "split": split} for s in snap.shards]
        for key in ("counts", "totals"):
            if isinstance(doc.get(key), dict) and stored in doc[key]:
                doc[key] = {split: doc[key][stored]}
        snapshot.write_manifest(local, doc)
    return local


def log_training_keys(client: Any, run_id: str, keys: Any) -> str:
    """Store the keys of the samples a version was made from (train + val of its data set,
    :data:`TRAINING_SPLITS`) with its run (``training_keys/keys.npy``, sorted ``|S32``);
    returns the file's sha256 (the version tag ``training_keys_sha256``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = snapshot.write_keys(Path(tmp) / KEYS_FILE, keys)
        client.log_artifact(run_id, str(path), KEYS_DIR)
        return sha256_file(path)


def fetch_training_keys(client: Any, uri: str, name: str, version: int, dest: Path) -> Any:
    """The training keys version ``version`` recorded (sorted ``|S32``, checked against its tag
    ``training_keys_sha256``), or None for a version registered before they were recorded."""
    import mlflow
    from mlflow.exceptions import MlflowException

    mv = client.get_model_version(name, str(version))
    want = mv.tags.get(KEYS_SHA_TAG)
    if not want:
        return None
    try:
        local = Path(
            mlflow.artifacts.download_artifacts(
                run_id=mv.run_id,
                artifact_path=f"{KEYS_DIR}/{KEYS_FILE}",
                dst_path=str(dest),
                tracking_uri=uri,
            )
        )
    except (MlflowException, OSError) as exc:
        raise StepError(
            f"{name} v{version}: its training keys ({KEYS_DIR}/{KEYS_FILE} of run {mv.run_id}) "
            f"cannot be downloaded ({exc})"
        ) from exc
    got = sha256_file(local)
    if got != want:
        raise StepError(
            f"{name} v{version}: training keys {KEYS_DIR}/{KEYS_FILE} of run {mv.run_id} hash to "
            f"{got[:12]}, the version tag {KEYS_SHA_TAG} {want[:12]}: changed after registration"
        )
    keys = snapshot.read_keys(local)
    return keys if bool(np.all(keys[1:] >= keys[:-1])) else np.sort(keys)


def version_label(version: int | None) -> str:
    return f"v{version}" if version is not None else "none"
