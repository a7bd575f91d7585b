"""The job's directory on the shared volume: the job's name from the data it trains on,
the inputs staged there, the outputs collected from it (see the package's docstring, 2., 3.
and 7.)."""

import json
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.core.artifacts import (
    StepError,
    atomic_path,
    read_json,
    sha256_bytes,
    sha256_file,
    write_text,
)
from components.faults import failpoints
from components.ml.data import snapshot
from pipelines.paddlejob.spec import Outputs

log = logging.getLogger(__package__)  # "pipelines.paddlejob": one logger, as before the split

# what the job writes into its directory (the train CLI's paths in the template)
OUTPUTS = {
    "model": "model",
    "checkpoints": "checkpoints",
    "metrics": "metrics/train.json",
    "plots": "plots/train.csv",
}


# --------------------------------------------------------------------------- the volume


# what the train step reads of a snapshot: the test split never goes to the shared volume
STAGED_SPLITS = ("train", "val")
STAGED_FILES = (snapshot.SNAPSHOT_FILE, "labels.json", "manifest.json")


def _staged_file(data_dir: Path, name: str) -> Path:
    path = data_dir / name
    if not path.is_file():
        raise StepError(f"{path}: missing; the data set is not a complete snapshot (run ingest)")
    return path


def job_key(task: Mapping[str, Any], train: Mapping[str, Any], data_dir: Path, run: str) -> str:
    """12 hex digits of the KFP run and of what the training's result depends on: the
    ``task`` and ``train`` sections and the data it reads: the train and val shards (the
    sha256 the snapshot's manifest pins for each, no shard is read) and the class names. The
    same for every retry of the task within the run."""
    snap = snapshot.load(data_dir)  # not a snapshot: one line (run ingest)
    data = {split: snap.split_sha256(split) for split in STAGED_SPLITS}
    data["labels.json"] = sha256_file(_staged_file(data_dir, "labels.json"))
    blob = json.dumps({"run": run, "task": task, "train": train, "data": data}, sort_keys=True)
    return sha256_bytes(blob.encode())[:12]


def stage(run_dir: Path, data_dir: Path, sections: Mapping[str, Any]) -> None:
    """The data the train step reads and params.yaml in the job's directory: the snapshot's
    ``snapshot.json``, ``labels.json`` and ``manifest.json`` and its train and val shards,
    each checked against the sha256 the manifest pins once copied (the test shards stay
    behind). Copied once: the shards' hashes are part of the job's name, so an existing copy
    is the same data."""
    import yaml

    data = run_dir / "data"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if data.is_dir():
            log.info("data already staged in %s (a retry of the same run)", data)
        else:
            snap = snapshot.load(data_dir)
            shards = [s for s in snap.shards if s.split in STAGED_SPLITS]
            with atomic_path(data) as tmp:
                tmp.mkdir()
                for name in STAGED_FILES:
                    shutil.copyfile(_staged_file(data_dir, name), tmp / name)
                for shard in shards:
                    _stage_shard(snap, shard, tmp)
            log.info(
                "staged the snapshot (%d train and val shards, %d bytes) into %s",
                len(shards),
                sum(s.bytes for s in shards),
                data,
            )
        failpoints.hit("paddlejob.stage", str(run_dir / "params.yaml"))
        write_text(run_dir / "params.yaml", yaml.safe_dump(dict(sections), sort_keys=False))
    except OSError as exc:
        raise StepError(f"staging the job's inputs into {run_dir} failed: {exc}") from exc


def _stage_shard(snap: snapshot.Snapshot, shard: snapshot.Shard, dest_root: Path) -> None:
    """Copy one shard below ``dest_root``; a missing or corrupt one is one line naming it."""
    src, dest = snap.path(shard), dest_root / shard.path
    if not src.is_file():
        raise StepError(
            f"{src}: shard missing (snapshot.json pins sha256 {shard.sha256}); run `dvc pull` "
            "or ingest again"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    got = sha256_file(dest)
    if got != shard.sha256:
        raise StepError(
            f"{src}: shard sha256 is {got}, snapshot.json pins {shard.sha256}: it is corrupt; "
            "run `dvc pull` or ingest again"
        )


def missing_outputs(run_dir: Path) -> list[str]:
    """The outputs rank 0 has not written (yet)."""
    return [rel for rel in OUTPUTS.values() if not (run_dir / rel).exists()]


def collect(run_dir: Path, job: str, outputs: Outputs) -> dict[str, Any]:
    """Copy the job's outputs into the artifacts; returns the metrics."""
    missing = missing_outputs(run_dir)
    if missing:
        raise StepError(
            f"PaddleJob {job} succeeded but {', '.join(str(run_dir / m) for m in missing)} "
            "is missing: global rank 0 writes every output of the train CLI there"
        )
    for name, rel in OUTPUTS.items():
        src, dst = run_dir / rel, Path(getattr(outputs, name))
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst)
    return read_json(outputs.metrics)
