"""register: version the model in the MLflow registry as the challenger, and bless it.

1. Registers the MLflow model the tracked run logged (``run.json``: ``model_id``; a pyfunc
   whose ``artifacts/bundle`` is the packaged bundle: fp32 PIR + legacy, the gated int8
   model, signature, manifests; :mod:`components.tracking.model`) as a new version of
   ``registry.model_name`` (default ``<task>-classifier``). The version's source is
   ``models:/<model_id>`` (with ``model_id`` and ``run_id``; the tag ``mlflow_model_id`` too),
   its download URI the LoggedModel's artifact location, so ``models:/<name>/<version>``
   downloads (and ``mlflow.pyfunc.load_model`` loads) the MLflow model root: MLmodel + the
   bundle. It copies the lineage tags of the run onto the version
   (``git_sha``, ``data_sha256``, ``snapshot_sha256``, ``params_sha256``, ``ge_success``,
   ``qat_gate_passed``, the serving image and its infra validation, ``bundle_sha256``) plus
   key metrics, and points alias ``challenger`` at it. With the version's run it stores the
   split it is blessed on (``holdout/``: a mini snapshot, tag ``test_split_sha256``) and the
   keys of the samples it was made from (``training_keys/keys.npy``: train + val, tag
   ``training_keys_sha256``).
2. Blesses it: the registered challenger and, if one exists, the registered champion are both
   downloaded (each bundle re-hashed against its ``bundle_sha256`` tag) and scored by the same
   code as ``evaluate``, sample by sample, on the current test split and on the pinned holdout
   (docs/gates.md). Blessed means: lineage complete, accuracy at least
   ``register.min_accuracy``, no sample of the pinned holdout in the challenger's training
   snapshot (tag ``holdout_leak_check``), and no significant regression against the champion,
   which is scored only on samples outside its own training snapshot (tag
   ``champion_exclusions``; a champion without recorded keys, or fewer than
   ``register.min_clean_samples`` left, is not compared and the blessing refused).
   ``blessing.json`` records the decision, every reason, and both models' metrics.

Promotion (pushing the image, moving ``champion``) is the next step, ``promote``; the
registry's own commands (status, a manual or forced promotion, rollback) are
``paddle-mlops registry --help``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from components.core.artifacts import StepError, read_json, write_json
from components.core.config import params_model, params_sha256
from components.core.uris import redact_uri
from components.faults import failpoints
from components.kernel.step import DATA, In, Out, Step
from components.ml import dataset, gates, snapshot
from components.ml.scoring import score_model
from components.tasks import Task
from components.tasks.base import Scores
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
    CHAMPION,
    HOLDOUT_FORMAT,
    HOLDOUT_FORMAT_TAG,
    HOLDOUT_TAGS,
    KEYS_COUNT_TAG,
    KEYS_SHA_TAG,
    LINEAGE_TAGS,
    SNAPSHOT_TAG,
    SPLIT_FORMAT_TAG,
    TAG_LIMIT,
    TRAINING_SPLITS,
    Registry,
    RegistryParams,
    download_version,
    fetch_holdout,
    fetch_training_keys,
    global_tracking_uri,
    log_test_split,
    log_training_keys,
    model_name,
    set_alias,
    step_run,
)
from components.tracking.registry import client as mlflow_client

log = logging.getLogger(__name__)

# copied when present: the local image id, the component image the steps ran in, and what
# the served files compute (components.tracking.model.SERVED_TAG)
_EXTRA_TAGS = (
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


@params_model
class RegisterParams:
    # absolute floor on the test split
    min_accuracy: Annotated[float, Field(ge=0, le=1)] = 0.95
    # points of accuracy the challenger may trail the champion
    max_regression: gates.Points = 0.0
    max_class_regression: gates.Points = 2.0  # points of recall, any class
    alpha: gates.Alpha = 0.1  # one-sided exact McNemar level
    min_class_flips: gates.Flips = 3  # a class limit counts from this many samples lost (net)
    split: str = "test"
    # the task's baseline (evaluate's baseline_accuracy, same split) must be beaten to bless
    require_beats_baseline: bool = False
    # the champion is scored only on samples outside its own training snapshot; fewer left
    # than this (of the split or of the pinned holdout) and the blessing is refused
    min_clean_samples: Annotated[int, Field(ge=1)] = 100

    def limits(self) -> gates.PairedLimits:
        return gates.PairedLimits(
            alpha=self.alpha,
            max_drop=self.max_regression,
            max_class_drop=self.max_class_regression,
            min_class_flips=self.min_class_flips,
        )


@dataclass(frozen=True)
class Blessing:
    blessed: bool
    reasons: list[str]
    challenger: dict[str, Any]
    champion: dict[str, Any] | None
    # per data set ("test", "holdout"): paired counts of challenger vs champion, and the rules
    comparisons: dict[str, Any] = field(default_factory=dict)
    # the task's own rules vs the champion (Task.blessing_checks): failures and facts
    task_rules: dict[str, Any] = field(default_factory=dict)
    # the holdout leak check and the samples left out of the champion's scores (Integrity)
    integrity: dict[str, Any] = field(default_factory=dict)
    # every rule the challenger met, one line each (``reasons`` are the ones it failed)
    passed: list[str] = field(default_factory=list)

    def why(self) -> list[str]:
        """The reasons for the decision: the failed rules when refused, else the met ones."""
        return list(self.reasons) if not self.blessed else list(self.passed)


@dataclass
class Integrity:
    """What the data allow to compare: ``failures`` refuse the blessing (one line each);
    ``leak`` is the holdout leak check (also the version tag ``holdout_leak_check``);
    ``exclusions`` the samples left out of the champion's scores, per data set (also the
    version tag ``champion_exclusions``)."""

    failures: list[str] = field(default_factory=list)
    leak: dict[str, Any] = field(default_factory=dict)
    exclusions: dict[str, Any] = field(default_factory=dict)

    def leak_tag(self) -> str:
        leak = self.leak
        if not leak.get("checked"):
            return f"not checked: {leak.get('why', 'no pinned holdout')}"
        verdict = "failed" if leak["leaked"] else "passed"
        return (
            f"{verdict}: {leak['leaked']} of {leak['holdout_samples']} samples of the pinned "
            f"holdout (v{leak['pinned_from_version']}) in the training snapshot (train/val)"
        )


@dataclass(frozen=True)
class RegisterResult:
    name: str
    version: int
    blessing: Blessing


# --------------------------------------------------------------------------- blessing


def score_registered(
    model_dir: Path, task: Task, data_dir: Path, split: str
) -> tuple[dict[str, Any], Scores]:
    """Score a downloaded model version exactly as ``evaluate`` does.

    Returns the summary kept in ``blessing.json`` (``accuracy``: the share of samples whose
    outcome is right, the task's ``outcome``; the task's metrics) and the scores (per-sample
    outcomes for the paired comparison with the other model on the same samples).
    """

    scores, _, _ = score_model(model_dir, task, data_dir, split)
    sig_file = model_dir / "signature.json"
    signature = read_json(sig_file) if sig_file.exists() else {}
    summary = {
        "accuracy": scores.report["accuracy"],
        "macro_f1": scores.report["macro_f1"],
        **{k: v for k, v in scores.metrics.items() if k not in ("accuracy", "macro_f1")},
        "inputs": signature.get("inputs"),
    }
    return summary, scores


def bless(
    params: RegisterParams,
    lineage: dict[str, str],
    challenger: dict[str, Any],
    champion: dict[str, Any] | None,
    paired: dict[str, dict[str, Any]] | None = None,
    task_rules: dict[str, Any] | None = None,
    outcome: str = "accuracy",
    integrity: Integrity | None = None,
) -> Blessing:
    """Every rule the challenger must meet; all failures are reported, not just the first.

    ``paired`` holds, per data set (``test``, ``holdout``), the :func:`gates.compare` counts
    of the champion (reference) vs the challenger (candidate) on the same samples;
    ``task_rules`` the task's own verdict vs the champion (``failures``, ``facts``);
    ``outcome`` what ``accuracy`` measures for this task (e.g. a generator's class agreement);
    ``integrity`` what the data allow (:class:`Integrity`: a holdout leak, a champion that
    cannot be scored on samples it did not train on).
    """
    integrity = integrity or Integrity()
    reasons: list[str] = []
    passed: list[str] = []
    missing = [t for t in LINEAGE_TAGS if not lineage.get(t)]
    if missing:
        reasons.append(f"lineage tags missing: {', '.join(missing)}")
    else:
        passed.append(f"lineage complete ({len(LINEAGE_TAGS)} tags)")
    acc = challenger["accuracy"]
    if acc < params.min_accuracy:
        reasons.append(f"{outcome} {acc:.4f} is below register.min_accuracy {params.min_accuracy}")
    else:
        passed.append(f"{outcome} {acc:.4f} >= register.min_accuracy {params.min_accuracy}")
    baseline = challenger.get("baseline_accuracy")
    if params.require_beats_baseline:
        if baseline is None:
            reasons.append(
                "register.require_beats_baseline: the run has no baseline_accuracy (the task "
                "has no baseline, or evaluate did not run it)"
            )
        elif acc <= baseline:
            reasons.append(
                f"accuracy {acc:.4f} does not beat the baseline's {baseline:.4f} on the same "
                "samples (register.require_beats_baseline)"
            )
        else:
            passed.append(f"accuracy {acc:.4f} beats the baseline's {baseline:.4f}")
    reasons += integrity.failures
    if not integrity.failures:
        passed.append(f"holdout leak check: {integrity.leak_tag()}")
    if champion is None:
        passed.append("no champion yet: nothing to regress against")
    comparisons: dict[str, Any] = {}
    if champion is not None:
        if champion.get("inputs") != challenger.get("inputs"):
            reasons.append(
                f"champion v{champion['version']} takes inputs {champion.get('inputs')}, the "
                f"challenger {challenger.get('inputs')}: not comparable on the same data; "
                "promote with --force --reason if the change is intended"
            )
        else:
            for data, comparison in (paired or {}).items():
                where = f"the {params.split} split" if data == "test" else "the pinned holdout"
                if comparison.get("excluded"):
                    where += (
                        f" ({comparison['excluded']} samples champion v{champion['version']} "
                        "trained on left out)"
                    )
                verdict = gates.decide(
                    comparison,
                    params.limits(),
                    what=f"on {where}",
                    reference=f"champion v{champion['version']}",
                    params_prefix="register",
                    drop_param="max_regression",
                    class_drop_param="max_class_regression",
                )
                reasons += verdict.failures
                comparisons[data] = {**comparison, "rules": verdict.rules, "passed": verdict.passed}
                if verdict.passed:
                    o = comparison["overall"]
                    passed.append(
                        f"no significant regression vs champion v{champion['version']} on "
                        f"{where}: {o['worse']} worse, {o['better']} better of {o['samples']}, "
                        f"drop {o['drop_points']:.2f} points, McNemar p={o['p_value']:.3g} "
                        f"(register.max_regression {params.max_regression}, "
                        f"register.alpha {params.alpha})"
                    )
            task_failures = list((task_rules or {}).get("failures", []))
            reasons += task_failures
            if task_rules and not task_failures:
                passed.append(f"the {outcome} task's own rules vs the champion hold")
    return Blessing(
        not reasons,
        reasons,
        challenger,
        champion,
        comparisons,
        dict(task_rules or {}),
        asdict(integrity),
        passed,
    )


# --------------------------------------------------------------------------- step


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
            runs = ",".join([*adopters(mv), run_id])
            client.set_model_version_tag(name, mv.version, ADOPTED_TAG, runs[:TAG_LIMIT])
            if "blessed" in mv.tags:  # this run blesses it again, or dies trying
                client.delete_model_version_tag(name, mv.version, "blessed")
            log.warning(
                "%s v%d: %s; the same model (content key %s): adopted by run %s, no second version",
                name,
                number,
                why,
                key[:12],
                run_id,
            )
            adopted = number
        elif number not in aliased:
            note = f"{why}; superseded by the registration of run {run_id}"
            client.set_model_version_tag(name, mv.version, ORPHAN_TAG, note[:TAG_LIMIT])
            log.warning("%s v%d marked %s: %s", name, number, ORPHAN_TAG, note)
    return adopted


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


def in_key_set(keys: np.ndarray, key_set: np.ndarray) -> np.ndarray:
    """Which of ``keys`` are in ``key_set`` (sorted ``|S32``, as key files store them): a
    binary search per key, so a batch costs O(batch * log(set)), not a sort of the set."""
    if not key_set.size or not keys.size:
        return np.zeros(keys.shape, dtype=bool)
    at = np.minimum(np.searchsorted(key_set, keys), key_set.size - 1)
    return key_set[at] == keys


def clean_split(
    data_dir: Path, split: str, exclude: np.ndarray, dest: Path, batch_rows: int = 1024
) -> tuple[Path, int, int]:
    """``split`` of ``data_dir`` without the samples whose key is in ``exclude`` (a sorted
    ``|S32`` key set): ``data_dir`` itself when none is, else a mini snapshot in ``dest`` (the
    kept rows' shards in the snapshot format, written batch by batch, never the whole split
    in memory; ``labels.json``; a manifest saying what was left out). Returns (the directory,
    the split's samples, how many were left out)."""
    import pyarrow as pa

    snap = snapshot.load(data_dir)
    keys = snapshot.split_keys(snap, [split])
    excluded = int(np.count_nonzero(in_key_set(keys, exclude)))
    if not excluded:
        return data_dir, int(keys.size), 0
    (dest / snapshot.SHARD_DIR).mkdir(parents=True, exist_ok=True)
    shards: list[snapshot.Shard] = []
    for shard in snap.split_shards(split):
        writer = None
        for batch in snapshot.iter_batches(snap, split, batch_rows=batch_rows, shards=[shard]):
            if writer is None:
                writer = snapshot.ShardWriter(
                    dest / snapshot.SHARD_DIR,
                    Path(shard.path).stem,
                    batch.schema,
                    snapshot.ShardLimits(),
                    split,
                    shard.unit,
                )
            batch_keys = np.asarray(batch.column("key").to_pylist(), dtype=keys.dtype)
            writer.add(batch.filter(pa.array(~in_key_set(batch_keys, exclude))))
        if writer is not None:
            shards += writer.close()
    shutil.copyfile(snap.root / "labels.json", dest / "labels.json")
    counts: dict[str, int] = {}
    for shard in shards:
        for label, n in shard.counts.items():
            counts[label] = counts.get(label, 0) + n
    doc = {
        k: v
        for k, v in snap.doc.items()
        if k not in ("shards", "format_version", "counts", "totals", "split_deviation")
    }
    doc.update(
        shards=[asdict(s) for s in shards],
        counts={split: dict(sorted(counts.items(), key=lambda kv: int(kv[0])))},
        totals={split: sum(s.rows for s in shards)},
        filtered_from={"sha256": snap.sha256, "split": split, "excluded": excluded},
    )
    snapshot.write_manifest(dest, doc)
    return dest, int(keys.size), excluded


def _describe_rule(rule: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in rule.items()) or "an unrecorded rule"


def check_holdout(
    client: Any,
    uri: str,
    model_tags: dict[str, str],
    data_dir: Path,
    split: str,
    split_sha: str,
    training_keys: np.ndarray,
    dest: Path,
    integrity: Integrity,
) -> Path | None:
    """The pinned holdout (``data_dir`` itself when its split is the pinned bytes), after the
    leak check: any of its samples among ``training_keys`` (the challenger's train + val) is a
    failure. None when nothing is pinned yet or the pin predates snapshots."""
    holdout = {t: model_tags[t] for t in HOLDOUT_TAGS if model_tags.get(t)}
    if len(holdout) != len(HOLDOUT_TAGS):
        integrity.leak = {"checked": False, "why": "no pinned holdout yet"}
        return None
    pinned_from = int(holdout["holdout_version"])
    if model_tags.get(HOLDOUT_FORMAT_TAG) != HOLDOUT_FORMAT:
        why = f"the pinned holdout (v{pinned_from}) was stored before data snapshots"
        integrity.leak = {"checked": False, "why": why, "pinned_from_version": pinned_from}
        integrity.failures.append(
            f"holdout leak check impossible: {why} and cannot be read; after review, promote "
            "with `paddle-mlops registry promote --force --reason TEXT`, which pins the new "
            "champion's test split"
        )
        return None
    if holdout["holdout_sha256"] == split_sha:  # the same shards: no download, their bytes
        h_dir = data_dir
        local = snapshot.load(data_dir)
        snapshot.verify(local, local.split_shards(split))
    else:
        h_dir = fetch_holdout(client, uri, holdout, dest, split)
    h_snap = snapshot.load(h_dir)
    h_keys = snapshot.split_keys(h_snap, [split])
    leaked = int(np.count_nonzero(in_key_set(h_keys, training_keys)))
    integrity.leak = {
        "checked": True,
        "pinned_from_version": pinned_from,
        "holdout_samples": int(h_keys.size),
        "leaked": leaked,
    }
    if leaked:
        integrity.failures.append(
            f"holdout leak: {leaked} of {h_keys.size} samples of the pinned holdout "
            f"(v{pinned_from}) are in the challenger's training snapshot (train/val of "
            f"{data_dir}); re-ingest with a split rule that keeps them out (the holdout was "
            f"split by {_describe_rule(dict(h_snap.doc.get('split_rule') or {}))})"
        )
    return h_dir


def _too_few(where: str, samples: int, excluded: int, champion: int, params: Any) -> str:
    return (
        f"only {samples - excluded} of {samples} samples of {where} are outside champion "
        f"v{champion}'s training snapshot ({excluded} it trained on left out), fewer than "
        f"register.min_clean_samples {params.min_clean_samples}: not compared on contaminated "
        "numbers; re-ingest so that its training samples stay out of the split, or promote "
        "with `paddle-mlops registry promote --force --reason TEXT` after review"
    )


def compare_with_champion(
    client: Any,
    uri: str,
    registry: Registry,
    version: int,
    params: RegisterParams,
    task: Task,
    data_dir: Path,
    split_sha: str,
    training_keys: np.ndarray,
) -> tuple[
    dict[str, Any], dict[str, Any] | None, dict[str, dict[str, Any]], dict[str, Any], Integrity
]:
    """Score the challenger and the champion (if any) as registered, sample by sample, on
    ``data_dir``'s split and on the pinned holdout: (challenger, champion, paired counts, the
    task's own rules on the split: ``failures`` and ``facts``, :class:`Integrity`).

    The challenger is refused if its training snapshot (``training_keys``) holds a sample of
    the pinned holdout. The champion is scored only on samples outside its own training
    snapshot (its recorded training keys): those are left out of both models' paired scores
    (:func:`clean_split`); a champion without recorded keys, or fewer than
    ``register.min_clean_samples`` left, is not compared and the blessing refused."""
    name = registry.name
    model_tags = client.get_registered_model(name).tags
    integrity = Integrity()
    paired: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        challenger_dir = download_version(client, uri, name, version, tmp / "c")
        challenger, c_scores = score_registered(challenger_dir, task, data_dir, params.split)
        challenger["version"] = version
        h_dir = check_holdout(
            client,
            uri,
            model_tags,
            data_dir,
            params.split,
            split_sha,
            training_keys,
            tmp / "h",
            integrity,
        )
        if integrity.leak.get("why") == "no pinned holdout yet":
            log.warning("%s has no pinned holdout yet: blessing on %s only", name, params.split)
        champion_version = registry.aliases().get(CHAMPION)
        if champion_version is None:
            return challenger, None, paired, {}, integrity
        champion_dir = download_version(client, uri, name, champion_version, tmp / "p")
        sig_file = champion_dir / "signature.json"
        champion = {
            "version": champion_version,
            "inputs": (read_json(sig_file) if sig_file.exists() else {}).get("inputs"),
        }
        seen = fetch_training_keys(client, uri, name, champion_version, tmp / "pk")
        if seen is None:
            integrity.exclusions = {
                "vs_champion": champion_version,
                "skipped": "no recorded training keys",
            }
            integrity.failures.append(
                f"champion v{champion_version} has no recorded training keys (registered "
                "before versions recorded their training snapshot): it cannot be scored only "
                "on samples it did not train on, so it is not compared; after review, promote "
                f"the challenger with `paddle-mlops registry promote --version {version} "
                "--force --reason TEXT` (champions registered from now on carry their keys)"
            )
            return challenger, champion, paired, {}, integrity
        integrity.exclusions = {"vs_champion": champion_version}
        names = dataset.read_label_names(data_dir)
        task_rules: dict[str, Any] = {}
        t_dir, samples, excluded = clean_split(data_dir, params.split, seen, tmp / "clean-test")
        integrity.exclusions["test"] = {
            "samples": samples,
            "excluded": excluded,
            "scored": samples - excluded,
        }
        if samples - excluded < params.min_clean_samples:
            integrity.failures.append(
                _too_few(f"the {params.split} split", samples, excluded, champion_version, params)
            )
        else:
            if excluded:
                log.info(
                    "%s: %d of %d %s samples are in champion v%d's training snapshot: both "
                    "models are compared on the other %d",
                    name,
                    excluded,
                    samples,
                    params.split,
                    champion_version,
                    samples - excluded,
                )
                _, c_clean = score_registered(challenger_dir, task, t_dir, params.split)
            else:
                c_clean = c_scores
            summary, p_scores = score_registered(champion_dir, task, t_dir, params.split)
            champion = {**summary, "version": champion_version}
            failures, facts = task.blessing_checks(c_clean, p_scores)
            task_rules = {"failures": failures, "facts": facts}
            paired["test"] = {
                **gates.compare(c_clean.y_true, p_scores.y_pred, c_clean.y_pred, names),
                "excluded": excluded,
            }
        pin = {
            "pinned_from_version": int(model_tags.get("holdout_version") or 0),
            "sha256": model_tags.get("holdout_sha256", ""),
        }
        if h_dir is None or champion["inputs"] != challenger["inputs"]:
            pass
        elif h_dir == data_dir:  # the same shards as the split: the same counts
            integrity.exclusions["holdout"] = integrity.exclusions["test"]
            if "test" in paired:
                paired["holdout"] = {**paired["test"], **pin}
        else:
            hc_dir, h_samples, h_excluded = clean_split(
                h_dir, params.split, seen, tmp / "clean-holdout"
            )
            integrity.exclusions["holdout"] = {
                "samples": h_samples,
                "excluded": h_excluded,
                "scored": h_samples - h_excluded,
            }
            if h_samples - h_excluded < params.min_clean_samples:
                where = f"the pinned holdout (v{pin['pinned_from_version']})"
                integrity.failures.append(
                    _too_few(where, h_samples, h_excluded, champion_version, params)
                )
            else:
                h_names = dataset.read_label_names(hc_dir)
                _, h_champion = score_registered(champion_dir, task, hc_dir, params.split)
                _, h_challenger = score_registered(challenger_dir, task, hc_dir, params.split)
                paired["holdout"] = {
                    **gates.compare(
                        h_challenger.y_true, h_champion.y_pred, h_challenger.y_pred, h_names
                    ),
                    "excluded": h_excluded,
                    **pin,
                }
    return challenger, champion, paired, task_rules, integrity


def record_blessing(client: Any, name: str, version: int, run_id: str, blessing: Blessing) -> None:
    """The decision on the version (tags ``blessed``, ``blessing_reasons``: the failed rules
    when refused, the met ones when blessed) and on ``run_id``, register's run (the same tags,
    metrics ``blessing.<data>.*``)."""
    why = "; ".join(blessing.why())[:TAG_LIMIT]
    for tag, value in (("blessed", str(blessing.blessed).lower()), ("blessing_reasons", why)):
        client.set_model_version_tag(name, str(version), tag, value)
        client.set_tag(run_id, tag, value)
    integrity = Integrity(**blessing.integrity) if blessing.integrity else Integrity()
    client.set_model_version_tag(name, str(version), "holdout_leak_check", integrity.leak_tag())
    if integrity.exclusions:
        client.set_model_version_tag(
            name,
            str(version),
            "champion_exclusions",
            json.dumps(integrity.exclusions, separators=(",", ":"))[:TAG_LIMIT],
        )
    if integrity.leak.get("checked"):
        client.log_metric(run_id, "blessing.holdout_leaked", float(integrity.leak["leaked"]))
    champion = blessing.champion
    for data, comparison in blessing.comparisons.items():
        o = comparison["overall"]
        summary = {
            "vs_champion": champion["version"] if champion else None,
            "samples": o["samples"],
            "excluded": comparison.get("excluded", 0),
            "worse": o["worse"],
            "better": o["better"],
            "p_value": round(o["p_value"], 6),
            "drop_points": round(o["drop_points"], 4),
            "passed": comparison["passed"],
        }
        client.set_model_version_tag(
            name, str(version), f"blessing_{data}", json.dumps(summary, separators=(",", ":"))
        )
        client.log_batch(
            run_id,
            metrics=[
                _metric(f"blessing.{data}.{k}", float(v))
                for k, v in summary.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            ],
        )
    client.log_metric(run_id, "blessed", float(blessing.blessed))


def run(
    params: RegisterParams,
    task: Task,
    run_file: str | Path,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    registry_params: RegistryParams | None = None,
    tracking_uri: str | None = None,
) -> RegisterResult:
    """Register the run ``run_file`` names (or ``run.json`` in that directory) as the
    ``challenger`` and bless it; promotion is the ``promote`` step's."""

    run_file, data_dir, out_dir = Path(run_file), Path(data_dir), Path(out_dir)
    run_file = run_file / "run.json" if run_file.is_dir() else run_file
    run_info = read_json(run_file)
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or run_info["tracking_uri"]
    if uri == run_info["tracking_uri"] and "***" in uri:
        raise StepError(
            f"{run_file}: field 'tracking_uri' {uri} is redacted (it held credentials); set "
            "MLFLOW_TRACKING_URI (and MLFLOW_TRACKING_USERNAME/PASSWORD or TOKEN)"
        )
    client = mlflow_client(uri)
    registry_params = registry_params or RegistryParams()
    name = model_name(registry_params, task)
    registry = Registry(client, name, registry_params)
    mlrun = client.get_run(run_info["run_id"])
    run_id = mlrun.info.run_id
    with step_run(
        client,
        run_id,
        "register",
        {"registered_model": name},
        stale_after_s=registry_params.lock_stale_s,
    ) as step_id:
        result = _register(
            params,
            task,
            client,
            uri,
            registry,
            run_info,
            run_file,
            mlrun,
            data_dir,
            out_dir,
            step_id,
        )
        client.set_tag(step_id, "model_version", str(result.version))
        client.log_artifact(step_id, str(out_dir / "blessing.json"))
    return result


def _register(
    params: RegisterParams,
    task: Task,
    client: Any,
    uri: str,
    registry: Registry,
    run_info: dict[str, Any],
    run_file: Path,
    mlrun: Any,
    data_dir: Path,
    out_dir: Path,
    step_id: str,
) -> RegisterResult:
    """:func:`run`'s work inside register's own run ``step_id``."""
    name, run_id = registry.name, mlrun.info.run_id
    registry_params = registry.params
    model = logged_model(client, run_info, run_file)
    lineage = {t: mlrun.data.tags.get(t, "") for t in LINEAGE_TAGS + _EXTRA_TAGS}
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
    tags = {
        **{k: v for k, v in lineage.items() if v},
        **key_metrics(mlrun.data.metrics),
        "task": task.name,
        "mlflow_run_id": run_id,
        "mlflow_model_id": model.model_id,
        **owner_tags(),
    }
    key = content_key(task.name, lineage)
    if key:
        tags[CONTENT_KEY_TAG] = key
    description = f"pipeline run {run_id} ({lineage.get('git_sha')}), model {model.model_id}"
    version = register_version(
        client, uri, name, run_id, model, tags, description, registry_params.lock_stale_s
    )
    # the version's own run and model: another (dead) pipeline run's when it was adopted
    registered = client.get_model_version(name, str(version))
    failpoints.hit("register.after_version", f"{name} v{version}")
    set_alias(client, name, CHALLENGER, version)
    log.info(
        "registered %s v%d (alias %s) from model %s, bundle sha256 %s",
        name,
        version,
        CHALLENGER,
        model.model_id,
        (lineage[BUNDLE_TAG] or "none")[:12],
    )

    # with the version's run: the holdout a promotion pins is read from there, and the
    # samples it was made from, which later blessings keep out of its scores
    split_sha = log_test_split(client, registered.run_id, data_dir, params.split)
    client.set_model_version_tag(name, str(version), "test_split_sha256", split_sha)
    client.set_model_version_tag(name, str(version), SPLIT_FORMAT_TAG, HOLDOUT_FORMAT)
    training_keys = snapshot.split_keys(data_dir, TRAINING_SPLITS)
    keys_sha = log_training_keys(client, registered.run_id, training_keys)
    client.set_model_version_tag(name, str(version), KEYS_COUNT_TAG, str(training_keys.size))
    client.set_model_version_tag(name, str(version), KEYS_SHA_TAG, keys_sha)
    if not registered.tags.get(SNAPSHOT_TAG):  # adopted from a run that did not record it
        client.set_model_version_tag(name, str(version), SNAPSHOT_TAG, lineage[SNAPSHOT_TAG])
    challenger, champion, paired, task_rules, integrity = compare_with_champion(
        client, uri, registry, version, params, task, data_dir, split_sha, training_keys
    )
    if trained_on_other_data:
        integrity.failures.insert(0, trained_on_other_data)
    if "test.baseline_accuracy" in mlrun.data.metrics:  # evaluate's, on the same split
        challenger["baseline_accuracy"] = float(mlrun.data.metrics["test.baseline_accuracy"])
        beats = challenger["accuracy"] > challenger["baseline_accuracy"]
        client.set_model_version_tag(name, str(version), "beats_baseline", str(beats).lower())
    blessing = bless(
        params,
        lineage,
        challenger,
        champion,
        paired,
        task_rules,
        outcome=task.outcome,
        integrity=integrity,
    )
    record_blessing(client, name, version, step_id, blessing)
    write_json(
        out_dir / "blessing.json",
        {"model": name, "version": version, **asdict(blessing), "params": asdict(params)},
    )
    if blessing.blessed:
        log.info(
            "%s v%d blessed (%s %.4f%s)",
            name,
            version,
            task.outcome,
            challenger["accuracy"],
            f", champion v{champion['version']} {champion['accuracy']:.4f}"
            if champion
            else ", no champion yet",
        )
    else:
        log.warning(
            "%s v%d NOT blessed:\n%s",
            name,
            version,
            "\n".join(f"  - {r}" for r in blessing.reasons),
        )
    write_json(
        out_dir / "registration.json",
        {
            "model": name,
            "version": version,
            "blessed": blessing.blessed,
            # the champion the blessing judged against: promote refuses if it moved since
            "judged_against": champion["version"] if champion else None,
            # the pipeline run register was given (promote nests its own run under it)
            "pipeline_run_id": run_id,
            "tracking_uri": redact_uri(uri),
            "model_id": registered.model_id or model.model_id,
            "version_run_id": registered.run_id,
            "source": redact_uri(client.get_model_version_download_uri(name, str(version))),
            "aliases": registry.aliases(),
        },
    )
    return RegisterResult(name, version, blessing)


def _metric(key: str, value: float) -> Any:
    from mlflow.entities import Metric

    return Metric(key, value, int(time.time() * 1000), 0)


STEP = Step(
    name="register",
    doc=__doc__,
    params=RegisterParams,
    sections=("task", "register", "registry"),
    shared=(("registry", "registry_params", RegistryParams),),
    run=run,
    inputs=(
        In("run_info", "outputs/track", "run_file", source="track.run_info", help="run.json"),
        DATA,
    ),
    outputs=(
        Out(
            "registration",
            "outputs/register",
            "out_dir",
            dvc="uncached",
            help="registration.json, blessing.json",
        ),
    ),
    result="blessing.blessed",
    result_type=bool,
)
