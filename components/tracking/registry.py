"""The registry facade the steps share: one registered model's aliases, lineage, history,
promotion lock and pinned holdout (:class:`Registry`), and ``params.yaml: registry``.

The parts live in their own modules, and their names stay importable from here:
``components.tracking.aliases`` (champion/challenger aliases, the alias race),
``components.tracking.promotion_lock``, ``components.tracking.holdout`` (the pinned holdout,
training keys) and ``components.tracking.mlflow_client`` (tracking URI, client, experiments,
step runs, MLflow's HTTP retries, version downloads).

Library layer: imported by steps (track, register) and by the KFP promotion, imports no step.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import field
from typing import Annotated, Any

from pydantic import Field

from components.core.artifacts import StepError
from components.core.config import params_model
from components.core.retry import SYSTEM_CLOCK, BackoffParams, Clock
from components.faults import failpoints
from components.tracking.aliases import (
    CHALLENGER,
    CHAMPION,
    PREVIOUS,
    ChampionChanged,
    alias_race_default,
    set_alias,
    version_label,
)
from components.tracking.holdout import (
    HOLDOUT_DIR,
    HOLDOUT_FORMAT,
    HOLDOUT_FORMAT_TAG,
    HOLDOUT_TAGS,
    KEYS_COUNT_TAG,
    KEYS_DIR,
    KEYS_FILE,
    KEYS_SHA_TAG,
    SNAPSHOT_TAG,
    SPLIT_FORMAT_TAG,
    TRAINING_SPLITS,
    fetch_holdout,
    fetch_training_keys,
    log_test_split,
    log_training_keys,
    pin_holdout,
    test_split,
)
from components.tracking.mlflow_client import (
    CURVE_PREFIX,
    DEFAULT_TRACKING_URI,
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    NOT_FOUND,
    STEP_TAG,
    UI_WORKFLOW,
    TrackingRetry,
    client,
    download_version,
    global_tracking_uri,
    health_default,
    set_experiment_kind,
    step_run,
    tracking_uri,
    use_experiment,
)
from components.tracking.promotion_lock import actor, hold, now

__all__ = [
    "BUILTIN_MODEL_KIND",
    "CHALLENGER",
    "CHAMPION",
    "CURVE_PREFIX",
    "ChampionChanged",
    "DEFAULT_TRACKING_URI",
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "HISTORY_TAG",
    "HOLDOUT_DIR",
    "HOLDOUT_FORMAT",
    "HOLDOUT_FORMAT_TAG",
    "HOLDOUT_TAGS",
    "KEYS_COUNT_TAG",
    "KEYS_DIR",
    "KEYS_FILE",
    "KEYS_SHA_TAG",
    "LINEAGE_TAGS",
    "NOT_FOUND",
    "PREVIOUS",
    "Registry",
    "RegistryParams",
    "SNAPSHOT_TAG",
    "SPLIT_FORMAT_TAG",
    "STEP_TAG",
    "TAG_LIMIT",
    "TRAINING_SPLITS",
    "TrackingRetry",
    "UI_WORKFLOW",
    "client",
    "download_version",
    "fetch_holdout",
    "fetch_training_keys",
    "global_tracking_uri",
    "log_test_split",
    "log_training_keys",
    "model_name",
    "registered_name",
    "set_alias",
    "set_experiment_kind",
    "step_run",
    "tracking_uri",
    "use_experiment",
    "version_label",
]

log = logging.getLogger(__name__)

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


def _lock_backoff_default() -> BackoffParams:
    # a promotion waiting for the promotion lock: 0.05 s, doubling, at most 1 s between tries
    # (the deadline is ``registry.lock_timeout_s``)
    return BackoffParams(first_s=0.05, max_s=1.0)


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
    # the waits between tries of a held promotion lock (the deadline: lock_timeout_s)
    lock_backoff: BackoffParams = field(default_factory=_lock_backoff_default)
    # the waits between writes of an alias another pipeline first-wrote at the same instant
    alias_backoff: BackoffParams = field(default_factory=alias_race_default)
    # the waits between asks of a starting server's /health (mlflow-users; --wait-s in all)
    health_backoff: BackoffParams = field(default_factory=health_default)


BUILTIN_MODEL_KIND = "classifier"  # the model_kind of every built-in task


def registered_name(params: RegistryParams, task_name: str, model_kind: str) -> str:
    """``registry.model_name``, else ``<task>-<model_kind>`` (``digits-classifier``)."""
    return params.model_name or f"{task_name}-{model_kind}"


def model_name(params: RegistryParams, task: Any) -> str:
    """The registered model name of ``task`` (:func:`registered_name`, ``Task.model_kind``)."""
    return registered_name(params, task.name, task.model_kind)


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
    def lock(self) -> contextlib.AbstractContextManager[str]:
        """Registry-wide mutex: creating a registered model is unique in the backend DB
        (:func:`components.tracking.promotion_lock.hold`)."""
        return hold(
            self.client,
            self.name,
            self.lock_name,
            timeout_s=self.params.lock_timeout_s,
            stale_s=self.params.lock_stale_s,
            backoff=self.params.lock_backoff,
            clock=self.clock,
        )

    # changing -------------------------------------------------------------------------
    def _record(
        self, action: str, version: int, previous: int | None, *, forced: bool, reason: str
    ) -> dict[str, Any]:
        """Append a champion change to the history tag and return it."""
        event = {
            "action": action,
            "version": version,
            "previous": previous,
            "at": now(),
            "by": actor(),
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
                set_alias(
                    self.client, self.name, PREVIOUS, current, backoff=self.params.alias_backoff
                )
            failpoints.hit("promote.between_aliases", f"{self.name} v{version}")
            set_alias(self.client, self.name, CHAMPION, version, backoff=self.params.alias_backoff)
            failpoints.hit("promote.after_alias", f"{self.name} v{version}")
            event = self._record("promote", version, current, forced=force, reason=reason)
            self.client.set_model_version_tag(self.name, str(version), "promoted_at", event["at"])
            pin_holdout(self.client, self.name, mv)
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

    def test_split(self, mv: Any) -> dict[str, str]:
        """Where the test split ``mv`` was blessed on is stored, as a holdout pin's tags
        (:func:`components.tracking.holdout.test_split`)."""
        return test_split(self.client, mv)

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
            set_alias(self.client, self.name, CHAMPION, previous, backoff=self.params.alias_backoff)
            if current is not None and current != previous:
                set_alias(
                    self.client, self.name, PREVIOUS, current, backoff=self.params.alias_backoff
                )
            event = self._record("rollback", previous, current, forced=False, reason=reason)
        log.info("%s: rolled back champion %s -> v%d", self.name, version_label(current), previous)
        return event
