"""The pinned holdout a champion is judged on, and the training keys a version was made from:
both stored with a version's run, read back checked against the hashes its tags record.

Library layer: imported by the registry, register and the champion comparison.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import StepError, sha256_file
from components.ml.data import snapshot
from components.tracking.promotion_lock import now

log = logging.getLogger("components.tracking.registry")  # the registry's logger, as before

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


def test_split(client: Any, mv: Any) -> dict[str, str]:
    """Where the test split ``mv`` was blessed on is stored (its run's ``holdout/``), as
    the tags a holdout pin records and :func:`fetch_holdout` reads."""
    uri = client.get_run(mv.run_id).info.artifact_uri.rstrip("/") + "/" + HOLDOUT_DIR
    return {
        "holdout_version": str(mv.version),
        "holdout_sha256": str(mv.tags.get("test_split_sha256", "")),
        "holdout_uri": uri,
    }


def pin_holdout(client: Any, name: str, mv: Any) -> None:
    """The first champion's test split (version ``mv`` of ``name``) becomes the holdout
    every later blessing uses.

    A pin made before data snapshots (a ``test.npz`` / ``test.jsonl`` file, no
    ``holdout_format`` tag) cannot be read any more: the first champion whose split was
    logged as a snapshot replaces it (recorded in ``holdout_replaced``)."""
    tags = client.get_registered_model(name).tags
    legacy = bool(tags.get("holdout_sha256")) and tags.get(HOLDOUT_FORMAT_TAG) != HOLDOUT_FORMAT
    if tags.get("holdout_sha256") and not legacy:
        return
    sha = mv.tags.get("test_split_sha256")
    if not sha or mv.tags.get(SPLIT_FORMAT_TAG) != HOLDOUT_FORMAT:
        log.warning(
            "%s v%s carries no test split in the snapshot format (tags test_split_sha256, "
            "%s): no holdout pinned%s",
            name,
            mv.version,
            SPLIT_FORMAT_TAG,
            " (the pre-snapshot pin stays, unreadable)" if legacy else " yet",
        )
        return
    if legacy:
        note = (
            f"v{tags.get('holdout_version')} (sha256 {tags['holdout_sha256'][:12]}), stored "
            f"before data snapshots, replaced by v{mv.version} at {now()}"
        )
        client.set_registered_model_tag(name, "holdout_replaced", note)
        log.warning("%s: pinned holdout %s", name, note)
    for key, value in (*test_split(client, mv).items(), (HOLDOUT_FORMAT_TAG, HOLDOUT_FORMAT)):
        client.set_registered_model_tag(name, key, str(value))
    log.info("%s: pinned holdout = test split of v%s (sha256 %s)", name, mv.version, sha[:12])
