"""A tracked run's model as a registered version, once across pipeline runs.

What ``register`` versions (:func:`logged_model`, checked against ``run.json``), with which
tags (:func:`run_lineage`, :func:`version_tags`, :func:`key_metrics`), and the recovery of
registrations that died: :func:`register_version` reuses this pipeline run's version, adopts
a dead pipeline run's version of the same model (:func:`content_key`) and marks the others
``orphaned`` (:func:`settle_dead_registrations`); the dead runs end FAILED with the reason.
:func:`record_training_data` stores with the version what later blessings need: the split it
is blessed on and the keys of the samples it was made from.

Library layer: imported by the register step, imports no step.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import StepError
from components.core.config import params_sha256
from components.ml.data import snapshot
from components.tracking.liveness import (
    FAILURE_TAG,
    HOST_TAG,
    PID_TAG,
    START_TAG,
    dead_owner,
    mark_failed,
    owner_tags,
)
from components.tracking.model import BUNDLE_TAG, SERVED_TAG
from components.tracking.registry import (
    CHALLENGER,
    HOLDOUT_FORMAT,
    KEYS_COUNT_TAG,
    KEYS_SHA_TAG,
    LINEAGE_TAGS,
    SNAPSHOT_TAG,
    SPLIT_FORMAT_TAG,
    TAG_LIMIT,
    TRAINING_SPLITS,
    global_tracking_uri,
    log_test_split,
    log_training_keys,
)

log = logging.getLogger(__name__)

# copied when present: the local image id, the component image the steps ran in, and what
# the served files compute (components.tracking.model.SERVED_TAG)
EXTRA_TAGS = (
    "serving_image",  # only when an image was built (track's serving_image_tags)
    "serving_image_id",
    "serving_image_built",
    "serving_image_not_built",
    "component_image",
    "retrain_reason",  # the monitor alarm that started the run (track, RETRAIN_REASON_ENV)
    "served_sha256",
    SNAPSHOT_TAG,  # the training snapshot (track's; register's data set for older runs)
)
# the idempotency key of a version across pipeline runs: same code, data, params and model
CONTENT_KEY_TAG = "content_key"
ORPHAN_TAG = "orphaned"  # a version a dead pipeline run left, superseded: why
ADOPTED_TAG = "adopted_by_runs"  # later pipeline runs that finished this version


def logged_model(client: Any, run_info: dict[str, Any], run_file: Path) -> Any:
    """The LoggedModel ``run.json`` names, checked to belong to its run."""
    from mlflow.exceptions import MlflowException

    model_id = run_info.get("model_id")
    if not model_id:
        raise StepError(
            f"{run_file}: field 'model_id' missing: the run was tracked without an MLflow "
            "model (older track step?); run track again"
        )
    try:
        model = client.get_logged_model(model_id)
    except MlflowException as exc:
        raise StepError(
            f"{run_file}: field 'model_id' {model_id}: no such logged model at the tracking "
            f"URI ({exc.error_code})"
        ) from exc
    if model.source_run_id != run_info["run_id"]:
        raise StepError(
            f"{run_file}: logged model {model_id} belongs to run {model.source_run_id}, "
            f"not to field 'run_id' {run_info['run_id']}"
        )
    return model


def run_lineage(mlrun: Any, model: Any, data_dir: Path) -> tuple[dict[str, str], str]:
    """The lineage tags of the tracked run ``mlrun`` (:data:`LINEAGE_TAGS` and
    :data:`EXTRA_TAGS`, "" when absent; a run tracked before snapshots gets ``data_dir``'s)
    and, when the run was tracked with other data than ``data_dir``, why that refuses the
    blessing (else ""). Raises when the logged ``model`` is not the bundle the run recorded."""
    run_id = mlrun.info.run_id
    lineage = {t: mlrun.data.tags.get(t, "") for t in LINEAGE_TAGS + EXTRA_TAGS}
    data_snapshot = snapshot.load(data_dir).sha256
    trained_on_other_data = ""
    if not lineage[SNAPSHOT_TAG]:
        log.info(
            "run %s has no %s tag (tracked before snapshots): recording %s's (%s)",
            run_id,
            SNAPSHOT_TAG,
            data_dir,
            data_snapshot[:12],
        )
        lineage[SNAPSHOT_TAG] = data_snapshot
    elif lineage[SNAPSHOT_TAG] != data_snapshot:
        trained_on_other_data = (
            f"the run was tracked with snapshot {lineage[SNAPSHOT_TAG][:12]} (tag "
            f"{SNAPSHOT_TAG}) but register was given {data_dir} (snapshot {data_snapshot[:12]}): "
            "the training keys and the holdout leak check would be of other data; run register "
            "on the ingest output the run was tracked with"
        )
    logged_sha = model.tags.get(BUNDLE_TAG, "")
    if lineage[BUNDLE_TAG] and lineage[BUNDLE_TAG] != logged_sha:
        raise StepError(
            f"run {run_id}: tag {BUNDLE_TAG} {lineage[BUNDLE_TAG][:12]} differs from the logged "
            f"model {model.model_id}'s {logged_sha[:12] or '(none)'}: the model is not the "
            "bundle the run recorded"
        )
    return lineage, trained_on_other_data


def version_tags(lineage: dict[str, str], mlrun: Any, task: str, model: Any) -> dict[str, str]:
    """The tags of a new version: the run's lineage and key metrics, the task, the run and
    model ids, this process's owner tags and the :func:`content_key` (when known)."""
    tags = {
        **{k: v for k, v in lineage.items() if v},
        **key_metrics(mlrun.data.metrics),
        "task": task,
        "mlflow_run_id": mlrun.info.run_id,
        "mlflow_model_id": model.model_id,
        **owner_tags(),
    }
    key = content_key(task, lineage)
    if key:
        tags[CONTENT_KEY_TAG] = key
    return tags


def content_key(task: str, tags: dict[str, str]) -> str:
    """sha256 of what makes two registrations the same model: the task, the code, the data,
    the params and what the served files compute (not their process-bound bytes:
    :func:`components.tracking.model.served_sha256`); "" when one of them is unknown."""

    parts = {k: tags.get(k, "") for k in ("git_sha", "data_sha256", "params_sha256", SERVED_TAG)}
    if not all(parts.values()) or parts["git_sha"].endswith("-dirty"):
        return ""  # an uncommitted tree is not one identity of the code
    return params_sha256({"task": task, **parts})


def adopters(mv: Any) -> list[str]:
    """The pipeline runs (MLflow run ids) that adopted version ``mv``, in order."""
    return [r for r in mv.tags.get(ADOPTED_TAG, "").split(",") if r]


def registering_run(mv: Any) -> str:
    """The pipeline run that owns version ``mv``: the last that adopted it, else its own."""
    return (adopters(mv) or [mv.run_id])[-1]


def died_registering(client: Any, mv: Any, stale_after_s: float) -> str | None:
    """Why version ``mv`` was left by a pipeline run that died, or None while it may be
    complete or still in progress: the MLflow run of the pipeline run that owns it
    (:func:`registering_run`) was closed FAILED/KILLED (the pipeline failed after track:
    KFP's exit handler, a crash closed by the next track), or that register process is gone
    before it recorded the blessing (the version's owner tags,
    :func:`components.tracking.liveness.dead_owner`)."""
    from mlflow.exceptions import MlflowException

    if HOST_TAG not in mv.tags:
        return None  # registered without owner tags (by hand, an older register): not ours
    run_id = registering_run(mv)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        run = None
    if run is not None and run.info.status in ("FAILED", "KILLED"):
        reason = run.data.tags.get(FAILURE_TAG, "")
        return f"its pipeline run {run_id} ended {run.info.status}" + (
            f" ({reason})" if reason else ""
        )
    if "blessed" not in mv.tags:
        why = dead_owner(mv.tags, mv.creation_timestamp / 1000.0, stale_after_s)
        if why:
            return f"its register died before blessing it: {why}"
    return None


def _fail_run(client: Any, run_id: str, reason: str) -> None:
    """End a pipeline run whose register died FAILED with ``reason`` (once)."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        return
    mark_failed(client, run, "FAILED", reason)


def settle_dead_registrations(
    client: Any, name: str, run_id: str, key: str, stale_after_s: float
) -> int | None:
    """Versions of ``name`` that pipeline runs left when they died after creating them.

    The convergence rule across pipeline runs (a KFP rerun is a new pipeline run, with a new
    MLflow run and LoggedModel): a dead run's version with this run's :func:`content_key`
    (the same model from the same code, data and params) is *adopted*: returned, so this
    run finishes it (alias, blessing, promotion) instead of registering the model twice. Any
    other dead run's version is marked :data:`ORPHAN_TAG` with the reason, unless an alias
    still points at it (a champion that was promoted before its run died stays what it
    is). Either way the dead run ends FAILED with ``failure_reason`` if nobody said so.
    Versions of live registers, complete versions of successful runs and versions without
    owner tags are left alone."""
    model = client.get_registered_model(name)
    aliased = {int(v) for a, v in model.aliases.items() if a != CHALLENGER}
    adopted = None
    versions = sorted(client.search_model_versions(f"name='{name}'"), key=lambda v: int(v.version))
    for mv in versions:
        if run_id in adopters(mv):  # this pipeline run adopted it already: a retried register
            return int(mv.version)
    for mv in versions:
        if mv.run_id == run_id or mv.tags.get(ORPHAN_TAG):
            continue
        why = died_registering(client, mv, stale_after_s)
        if why is None:
            continue
        number = int(mv.version)
        owner_run = registering_run(mv)
        _fail_run(client, owner_run, f"the pipeline died after registering {name} v{number}: {why}")
        if adopted is None and key and mv.tags.get(CONTENT_KEY_TAG) == key:
            _adopt(client, name, mv, run_id, why, key)
            adopted = number
        elif number not in aliased:
            note = f"{why}; superseded by the registration of run {run_id}"
            client.set_model_version_tag(name, mv.version, ORPHAN_TAG, note[:TAG_LIMIT])
            log.warning("%s v%d marked %s: %s", name, number, ORPHAN_TAG, note)
    return adopted


def _adopt(client: Any, name: str, mv: Any, run_id: str, why: str, key: str) -> None:
    """Pipeline run ``run_id`` finishes the dead run's version ``mv`` (the same model)."""
    runs = ",".join([*adopters(mv), run_id])
    client.set_model_version_tag(name, mv.version, ADOPTED_TAG, runs[:TAG_LIMIT])
    if "blessed" in mv.tags:  # this run blesses it again, or dies trying
        client.delete_model_version_tag(name, mv.version, "blessed")
    log.warning(
        "%s v%d: %s; the same model (content key %s): adopted by run %s, no second version",
        name,
        int(mv.version),
        why,
        key[:12],
        run_id,
    )


def register_version(
    client: Any,
    uri: str,
    name: str,
    run_id: str,
    model: Any,
    tags: dict[str, str],
    description: str,
    stale_after_s: float = 600.0,
) -> int:
    """The version of ``name`` for the LoggedModel ``model`` of run ``run_id``: the one this
    pipeline run already made (a register that died or was retried after versioning), one a
    dead pipeline run left with the same model (:func:`settle_dead_registrations`), else a
    new one.

    Source ``models:/<model_id>`` with ``model_id`` and ``run_id``: what MLflow 3 itself
    (``mlflow.register_model``, the UI) registers a LoggedModel as. The registry resolves it
    to the LoggedModel's artifact location once, at creation, and
    ``get_model_version_download_uri`` returns that: the MLflow model root (MLmodel +
    ``artifacts/bundle``). A database-backed registry resolves it through MLflow's
    process-global tracking URI, so that is ``uri`` while the version is created.
    ``tags`` carry this process's owner tags: until the blessing is recorded, a later run
    judges by them whether this register died.
    """
    from mlflow.exceptions import MlflowException

    owner = {k: v for k, v in tags.items() if k in (HOST_TAG, PID_TAG, START_TAG)}
    existing = client.search_model_versions(f"name='{name}' and run_id='{run_id}'")
    for mv in sorted(existing, key=lambda v: int(v.version)):
        if mv.tags.get("mlflow_model_id") == model.model_id:
            # a register of this pipeline run that died (or was retried) after versioning
            log.warning(
                "%s v%s already holds model %s of run %s: reusing it (no second version)",
                name,
                mv.version,
                model.model_id,
                run_id,
            )
            _take_over(client, name, int(mv.version), owner)
            return int(mv.version)
    try:
        client.create_registered_model(
            name,
            description="PaddlePaddle classifier; aliases "
            "champion / challenger / previous-champion",
        )
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    adopted = settle_dead_registrations(
        client, name, run_id, tags.get(CONTENT_KEY_TAG, ""), stale_after_s
    )
    if adopted is not None:
        _take_over(client, name, adopted, owner)
        return adopted
    with global_tracking_uri(uri):
        mv = client.create_model_version(
            name,
            source=f"models:/{model.model_id}",
            run_id=run_id,
            tags=tags,
            description=description,
            model_id=model.model_id,
        )
    return int(mv.version)


def _take_over(client: Any, name: str, version: int, owner: dict[str, str]) -> None:
    """This register process now owns the unfinished version (if it dies too, the next
    run sees that)."""
    for key, value in owner.items():
        client.set_model_version_tag(name, str(version), key, value)


def key_metrics(metrics: dict[str, float]) -> dict[str, str]:
    """The run's headline metrics as version tags (what ``registry status`` shows)."""
    return {
        k: str(round(metrics[m], 6))
        for k, m in (
            ("accuracy", "test.accuracy"),
            ("macro_f1", "test.macro_f1"),
            ("latency_ms_b1", "test.latency_ms_b1"),
            ("baseline_accuracy", "test.baseline_accuracy"),
            ("qat_accuracy", "qat.accuracy"),
            ("qat_size_ratio", "qat.size_ratio"),
            ("qat_latency_ratio_b64", "qat.latency_ratio_b64"),
        )
        if m in metrics
    }


def record_training_data(
    client: Any, registered: Any, data_dir: Path, split: str, snapshot_sha: str
) -> tuple[str, np.ndarray]:
    """With the version's run (``registered``, the ModelVersion): the split it is blessed on
    (the holdout a promotion pins is read from there) and the keys of the samples it was made
    from (which later blessings keep out of its scores), each with its version tags. Returns
    (the split's sha256, the training keys)."""
    name, version = registered.name, str(registered.version)
    split_sha = log_test_split(client, registered.run_id, data_dir, split)
    client.set_model_version_tag(name, version, "test_split_sha256", split_sha)
    client.set_model_version_tag(name, version, SPLIT_FORMAT_TAG, HOLDOUT_FORMAT)
    training_keys = snapshot.split_keys(data_dir, TRAINING_SPLITS)
    keys_sha = log_training_keys(client, registered.run_id, training_keys)
    client.set_model_version_tag(name, version, KEYS_COUNT_TAG, str(training_keys.size))
    client.set_model_version_tag(name, version, KEYS_SHA_TAG, keys_sha)
    if not registered.tags.get(SNAPSHOT_TAG):  # adopted from a run that did not record it
        client.set_model_version_tag(name, version, SNAPSHOT_TAG, snapshot_sha)
    return split_sha, training_keys
