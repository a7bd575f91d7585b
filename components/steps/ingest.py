"""ingest: read raw data, verify it, split it and write the documented data set format.

What the source is and how it is read belong to the task's data format
(``components.tasks``: ``Task.data``): images from IDX files, image folders or the built-in
digits; texts from CSV/TSV/JSON Lines or the built-in reviews. This step only orchestrates:
read (and clean) through the format, check every input file's sha256 against
``ingest.sha256`` when declared, split stratified by class and deterministically for a seed
with identical samples always in the same split (so no sample leaks between train, val and
test), and write the splits, ``labels.json`` and a manifest atomically. See
``components.ml.dataset`` for the layout.

``python -m components.steps.ingest materialize`` writes the built-in digits as IDX files under
``data/raw/digits`` byte-identically on every machine, which is what ``data.dvc`` tracks.
"""

from __future__ import annotations

import argparse
import fnmatch
import logging
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import (
    StepError,
    atomic_path,
    combined_sha256,
    read_json,
    write_json,
    write_manifest,
)
from components.core.config import DEFAULT_PARAMS
from components.kernel.cli import output_dir, run_cli, step_main
from components.kernel.step import Out, Step, Value
from components.ml import dataset, snapshot
from components.ml.sources import join_uri
from components.tasks import Task
from components.tasks.data import SplitParams, Unit, label_names, sum_facts
from components.tasks.image_data import IngestParams, materialize_builtin_digits, write_idx

log = logging.getLogger(__name__)
SPLITS = snapshot.SPLITS

DEFAULT_PARAMS_FILE = str(DEFAULT_PARAMS)  # named in messages when no --params is given

__all__ = ["IngestParams", "IngestResult", "SplitParams", "run", "write_idx"]


@dataclass(frozen=True)
class IngestResult:
    out_dir: Path
    counts: dict[str, dict[str, int]]
    data_sha256: str
    dropped: dict[str, int]


# --------------------------------------------------------------------------- split


def verify_sha256(
    declared: dict[str, str],
    actual: dict[str, str],
    source: str,
    params_file: str = DEFAULT_PARAMS_FILE,
) -> None:
    for name, want in declared.items():
        got = actual.get(name)
        if got is None:
            raise StepError(
                f"{params_file}: ingest.sha256 names '{name}', not an input of {source} "
                f"(inputs: {', '.join(sorted(actual)[:5])}{', ...' if len(actual) > 5 else ''})"
            )
        if got != want.lower():
            raise StepError(
                f"{join_uri(source, name)}: sha256 {got} does not match declared {want}"
            )


def stratified_split(
    keys: Sequence[bytes], labels: np.ndarray, params: SplitParams, noun: str = "sample"
) -> dict[str, np.ndarray]:
    """Indices per split: stratified by label, seeded, identical samples (equal ``keys``)
    kept together."""
    groups: dict[bytes, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    conflicting = [g for g in groups.values() if len(set(labels[g].tolist())) > 1]
    if conflicting:
        raise StepError(
            f"{len(conflicting)} identical {noun}(s) carry different labels, e.g. sample indices "
            f"{conflicting[0][:5]}; fix the labels in the source"
        )
    rng = np.random.default_rng(params.seed)
    out: dict[str, list[int]] = {s: [] for s in dataset.SPLITS}
    by_class: dict[int, list[list[int]]] = {}
    for members in sorted(groups.values(), key=lambda g: g[0]):
        by_class.setdefault(int(labels[members[0]]), []).append(members)
    for label in sorted(by_class):
        class_groups = by_class[label]
        order = rng.permutation(len(class_groups))
        n = len(class_groups)
        n_test = int(round(n * params.test_fraction))
        n_val = int(round(n * params.val_fraction))
        for rank, gi in enumerate(order):
            split = "test" if rank < n_test else "val" if rank < n_test + n_val else "train"
            out[split].extend(class_groups[gi])
    return {s: np.asarray(sorted(v), dtype=np.int64) for s, v in out.items()}


# --------------------------------------------------------------------------- step


@dataclass(frozen=True)
class _Job:
    """What a worker needs to turn one unit into shards (picklable)."""

    fmt: Any
    params: Any
    params_file: str
    unit: Unit
    key: str  # the unit's content address (computed by the worker when empty)
    extra_key: dict[str, Any]
    shard_dir: Path
    previous: dict[str, dict[str, Any]]  # unit key -> its entry in the last snapshot
    previous_root: Path | None
    assignment: dict[bytes, int] | None  # permutation rule: key -> split index
    file_splits: dict[str, str]


@dataclass
class _UnitResult:
    unit: Unit
    key: str
    inputs: dict[str, str]
    shards: list[dict[str, Any]]
    reused: bool
    rows: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)  # the format's, summed (JSON)
    # uint64 key prefixes, labels and rows in their input files (finding conflicting labels)
    key_labels: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    labels_found: np.ndarray | None = None


def _unit_key(job: _Job, inputs: dict[str, str]) -> str:
    return snapshot.unit_key(
        {
            "format_version": snapshot.FORMAT_VERSION,
            "unit": job.unit.id,
            "files": job.unit.files,
            "context": [list(c) for c in job.unit.context],
            "inputs": inputs,
            **job.extra_key,
        }
    )


def _file_split(src: str, patterns: dict[str, str], source: str) -> str | None:
    """The split ``ingest.split.files`` forces on a sample of input ``src``: patterns are
    globs under the source (a format that records whole URIs is matched without it)."""
    prefix = source.rstrip("/") + "/"
    rel = src[len(prefix) :] if src.startswith(prefix) else src
    for pattern, split in patterns.items():
        if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(src, pattern):
            return split
    return None


def _ingest_unit(job: _Job) -> _UnitResult:
    """Hash one unit's inputs; reuse its shards from the last snapshot, else read, split and
    write them. Runs in a worker process or in this one."""
    fmt, unit = job.fmt, job.unit
    inputs = fmt.unit_inputs(job.params, unit)
    key = _unit_key(job, inputs)
    old = job.previous.get(key)
    if old is not None and job.previous_root is not None and job.assignment is None:
        reused = _reuse(job, key, inputs, old)
        if reused is not None:
            return reused
    import pyarrow as pa

    schema = fmt.arrow_schema()
    limits = job.params.shards.limits()
    writers = {
        s: snapshot.ShardWriter(job.shard_dir, f"{key[:24]}-{s}", schema, limits, s, unit.id)
        for s in SPLITS
    }
    rule = job.params.split.rule()
    dropped: Counter = Counter()
    facts, prefixes, labels_all, rows_all = [], [], [], []
    for batch in fmt.read_unit(job.params, unit, job.params_file):
        dropped.update(batch.dropped)
        if not len(batch):
            continue
        facts.append(fmt.batch_facts(batch))
        if job.assignment is not None:
            where = np.asarray([job.assignment[k] for k in batch.keys], dtype=np.int8)
        else:
            where = snapshot.stable_split(batch.keys, rule)
        for i, src in enumerate(batch.sources):  # files the user put in one split
            forced = (
                _file_split(src, job.file_splits, job.params.source) if job.file_splits else None
            )
            if forced is not None:
                where[i] = SPLITS.index(forced)
        prefixes.append(_prefixes(batch.keys))
        labels_all.append(batch.labels)
        rows_all.append(np.asarray(batch.rows, dtype=np.int64))
        table = _record_batch(schema, batch)
        for index, split in enumerate(SPLITS):
            mask = np.flatnonzero(where == index)
            if mask.size:
                writers[split].add(table.take(pa.array(mask)))
    shards = [asdict(s) for split in SPLITS for s in writers[split].close()]
    labels = np.concatenate(labels_all) if labels_all else np.zeros(0, np.int64)
    return _UnitResult(
        unit,
        key,
        inputs,
        shards,
        False,
        rows=int(labels.size),
        dropped={k: int(v) for k, v in dropped.items()},
        facts=sum_facts(facts),
        key_labels=(_cat(prefixes, np.uint64), labels, _cat(rows_all, np.int64)),
        labels_found=np.unique(labels),
    )


def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _prefixes(keys: Sequence[bytes]) -> np.ndarray:
    """The first 8 bytes of each key as uint64 (for finding conflicting labels)."""
    return np.frombuffer(b"".join(k[:8] for k in keys), dtype=">u8").astype(np.uint64)


def _reuse(job: _Job, key: str, inputs: dict[str, str], old: dict[str, Any]) -> _UnitResult | None:
    """Link the unit's shards from the last snapshot (None when one is gone or changed)."""
    assert job.previous_root is not None
    records = old["shards"]
    sources = [job.previous_root / s["path"] for s in records]
    if not all(
        p.is_file() and p.stat().st_size == s["bytes"]
        for p, s in zip(sources, records, strict=True)
    ):
        return None
    import pyarrow.parquet as pq

    prefixes, labels, rows = [], [], []
    for src, shard in zip(sources, records, strict=True):
        dest = job.shard_dir.parent / shard["path"]
        snapshot.link_or_copy(src, dest)
        table = pq.read_table(dest, columns=["key", "label", "row"])
        prefixes.append(_prefixes(table.column("key").to_pylist()))
        labels.append(table.column("label").to_numpy())
        rows.append(table.column("row").to_numpy())
    lbl = _cat(labels, np.int64)
    return _UnitResult(
        job.unit,
        key,
        inputs,
        [{k: v for k, v in s.items() if k != "unit_key"} for s in records],
        True,
        rows=int(lbl.size),
        dropped=dict(old.get("dropped", {})),
        facts=dict(old.get("facts", {})),
        key_labels=(_cat(prefixes, np.uint64), lbl, _cat(rows, np.int64)),
        labels_found=np.unique(lbl),
    )


def _record_batch(schema: Any, batch: Any) -> Any:
    import pyarrow as pa

    columns = {
        "key": batch.keys,
        "label": batch.labels,
        "source": batch.sources,
        "row": batch.rows,
        **batch.columns,
    }
    return pa.RecordBatch.from_arrays(
        [_column(columns[f.name], f.type) for f in schema], schema=schema
    )


def _column(values: Any, type_: Any) -> Any:
    """An Arrow column; a variable-size binary column of ``bytes`` (image pixels) is laid out
    from one joined buffer (``pa.array`` appends value by value: ~50 MB/s measured)."""
    import pyarrow as pa

    if type_ == pa.binary() and values and isinstance(values[0], bytes):
        lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] < 2**31:
            data = pa.py_buffer(b"".join(values))
            return pa.Array.from_buffers(
                type_, len(values), [None, pa.py_buffer(offsets.astype(np.int32)), data]
            )
    return pa.array(values, type=type_)


def _previous(out_dir: Path) -> tuple[dict[str, dict[str, Any]], Path | None]:
    """The last snapshot's units by key, each with its shards (what an unchanged unit
    reuses)."""
    try:
        snap = snapshot.load(out_dir)
    except StepError:
        return {}, None
    by_key: dict[str, dict[str, Any]] = {}
    for unit_doc in snap.doc.get("units", []):
        shards = [s for s in snap.doc["shards"] if s.get("unit_key") == unit_doc["key"]]
        by_key[unit_doc["key"]] = {**unit_doc, "shards": shards}
    return by_key, out_dir


def _permutation(fmt: Any, params: Any, units: list[Unit], params_file: str) -> dict[bytes, int]:
    """The old split (a seeded permutation per class over all samples): a key -> split map.
    Unstable under growth; kept so a pipeline can reproduce a split made before snapshots."""
    keys: list[bytes] = []
    labels: list[np.ndarray] = []
    for unit in units:
        for batch in fmt.read_unit(params, unit, params_file):
            keys += batch.keys
            labels.append(batch.labels)
    lbl = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    indices = stratified_split(keys, lbl, params.split, fmt.sample_noun)
    out: dict[bytes, int] = {}
    for index, split in enumerate(SPLITS):
        for i in indices[split].tolist():
            out[keys[i]] = index
    return out


def _map(jobs: list[_Job], workers: int) -> Iterator[_UnitResult]:
    """Run the jobs on a process pool (``workers`` > 1) or here, in order."""
    return snapshot.ordered_map(_ingest_unit, jobs, workers, "ingest units", "unit")


def source_fingerprint(task: Task, params: Any, params_file: str = DEFAULT_PARAMS_FILE) -> str:
    """One sha256 over every raw input of the source: a cache key for orchestrators, so an
    ingest of a moving source (a URL, a bucket prefix) reruns exactly when its bytes change."""
    fmt = task.data
    hashes: dict[str, str] = {}
    for unit in fmt.units(params, params_file):
        hashes.update(fmt.unit_inputs(params, unit))
    return combined_sha256(hashes)


def _jobs(
    params: Any,
    task: Task,
    shard_dir: Path,
    params_file: str,
    previous: dict[str, dict[str, Any]],
    previous_root: Path | None,
) -> list[_Job]:
    """One job per unit of the source, in unit order."""
    fmt = task.data
    units = fmt.units(params, params_file)
    fixed_names = fmt.fixed_label_names(params, params_file)
    assignment = (
        _permutation(fmt, params, units, params_file)
        if params.split.method == "permutation"
        else None
    )
    extra_key = {
        "data_format": fmt.name,
        "decode": fmt.decode_params(params),
        "split": params.split.rule().doc(),
        "split_files": params.split.files,
        "shards": asdict(params.shards),
        # the class names the source fixes (a class folder's label id is its place among them)
        "names": fixed_names,
    }
    return [
        _Job(fmt, params, params_file, unit, "", extra_key, shard_dir, previous, previous_root,
             assignment, dict(params.split.files))
        for unit in units
    ]  # fmt: skip


# --------------------------------------------------------------------------- map / reduce
# On one machine ``run`` maps the units on a process pool (``ingest.workers``) and reduces.
# An orchestrator spreads the map over nodes instead: ``plan_groups`` names the groups,
# ``run_map`` ingests one group's units into a part (shards + what the reduce needs), and
# ``run`` with ``parts`` reduces the parts into the snapshot (the KFP DAG: a ParallelFor).

PART_FILE = "part.json"
PART_ARRAYS = "part.npz"


def plan_groups(params: Any, task: Task, *, params_file: str = DEFAULT_PARAMS_FILE) -> list[str]:
    """``"i/n"`` for each of the ``n`` unit groups (``ingest.workers``, at most one per unit)."""
    return snapshot.groups(min(int(params.workers), len(task.data.units(params, params_file))))


def run_map(
    params: Any,
    task: Task,
    group: str,
    out_dir: str | Path,
    *,
    params_file: str = DEFAULT_PARAMS_FILE,
) -> int:
    """Ingest the units of ``group`` (every n-th unit, from the i-th) into ``out_dir``: their
    shards and a part file the reduce reads. Returns how many units it ingested."""
    index, count = snapshot.parse_group(group, "ingest")
    out_dir = Path(out_dir)
    with atomic_path(out_dir) as tmp:
        shard_dir = tmp / snapshot.SHARD_DIR
        shard_dir.mkdir(parents=True)
        jobs = _jobs(params, task, shard_dir, params_file, {}, None)
        mine = [(i, job) for i, job in enumerate(jobs) if i % count == index]
        results = list(_map([job for _, job in mine], 1))
        _write_part(tmp, [i for i, _ in mine], results)
    log.info("ingest group %s: %d of %d units", group, len(mine), len(jobs))
    return len(mine)


def _write_part(dest: Path, order: list[int], results: list[_UnitResult]) -> None:
    docs, arrays = [], {}
    for position, r in zip(order, results, strict=True):
        docs.append(
            {
                "position": position,
                "unit": asdict(r.unit),
                "key": r.key,
                "inputs": r.inputs,
                "shards": r.shards,
                "reused": r.reused,
                "rows": r.rows,
                "dropped": r.dropped,
                "facts": r.facts,
            }
        )
        if r.key_labels is not None:
            for name, arr in zip(("keys", "labels", "rows"), r.key_labels, strict=True):
                arrays[f"{position}_{name}"] = arr
    write_json(dest / PART_FILE, {"units": docs})
    with open(dest / PART_ARRAYS, "wb") as fh:
        np.savez(fh, **arrays)


def _read_parts(parts: Sequence[Path], shard_dir: Path) -> list[_UnitResult]:
    """The units of every part, in unit order, their shards linked into ``shard_dir``."""
    found: dict[int, _UnitResult] = {}
    for part in parts:
        part = Path(part)
        if not (part / PART_FILE).is_file():
            raise StepError(f"{part}: not an ingest part (no {PART_FILE}); run the map first")
        doc = read_json(part / PART_FILE)
        with np.load(part / PART_ARRAYS, allow_pickle=False) as arrays:
            for entry in doc["units"]:
                pos = int(entry["position"])
                unit_doc = dict(entry["unit"])
                unit_doc["files"] = tuple(unit_doc["files"])
                unit_doc["context"] = tuple(tuple(c) for c in unit_doc["context"])
                names = [f"{pos}_{n}" for n in ("keys", "labels", "rows")]
                key_labels = tuple(arrays[n] for n in names) if names[0] in arrays.files else None
                for shard in entry["shards"]:
                    snapshot.link_or_copy(part / shard["path"], shard_dir.parent / shard["path"])
                found[pos] = _UnitResult(
                    Unit(**unit_doc),
                    entry["key"],
                    entry["inputs"],
                    entry["shards"],
                    entry["reused"],
                    rows=int(entry["rows"]),
                    dropped=entry["dropped"],
                    facts=entry["facts"],
                    key_labels=key_labels,  # type: ignore[arg-type]
                    labels_found=np.unique(key_labels[1]) if key_labels else None,
                )
    missing = sorted(set(range(max(found) + 1 if found else 0)) - set(found))
    if missing or not found:
        raise StepError(f"ingest parts {[str(p) for p in parts]}: units {missing} missing")
    return [found[i] for i in sorted(found)]


def run(
    params: Any,
    task: Task,
    out_dir: str | Path,
    *,
    params_file: str = DEFAULT_PARAMS_FILE,
    expected_source_sha256: str = "",
    parts: Sequence[str | Path] | None = None,
) -> IngestResult:
    """Read, verify and split the source into a snapshot of Parquet shards.

    ``params`` is the ingest section as the task's data format reads it; ``params_file`` is
    only named in error messages about the params. Units whose inputs did not change since
    the snapshot already in ``out_dir`` keep their shards (linked, not rewritten). With
    ``parts`` (what :func:`run_map` wrote for every group) the units are not read here, only
    reduced. With ``expected_source_sha256`` (the orchestrator's fingerprint, its cache key)
    the source must still hold those bytes, or nothing is written."""
    out_dir = Path(out_dir)
    fmt = task.data
    fixed_names = fmt.fixed_label_names(params, params_file)
    previous, previous_root = _previous(out_dir)
    with atomic_path(out_dir) as tmp:
        shard_dir = tmp / snapshot.SHARD_DIR
        shard_dir.mkdir(parents=True)
        if parts is not None:
            results = _read_parts([Path(p) for p in parts], shard_dir)
        else:
            jobs = _jobs(params, task, shard_dir, params_file, previous, previous_root)
            results = list(_map(jobs, params.workers))
        inputs = {k: v for r in results for k, v in r.inputs.items()}
        verify_sha256(params.sha256, inputs, params.source, params_file)
        if expected_source_sha256 and combined_sha256(inputs) != expected_source_sha256:
            raise StepError(
                f"{params.source} changed while the pipeline ran (its fingerprint was "
                f"{expected_source_sha256[:12]}…, now {combined_sha256(inputs)[:12]}…); "
                "run the pipeline again"
            )
        total = sum(r.rows for r in results)
        if total == 0:
            raise StepError(f"{params.source}: no samples")
        names = label_names(
            fixed_names,
            [
                (fmt.label_source(params, r.unit), r.key_labels[1])
                for r in results
                if r.key_labels is not None
            ],
            params_file,
        )
        _check_conflicts(results, fmt.sample_noun)
        try:
            facts = fmt.merge_facts([r.facts for r in results])
        except StepError as exc:
            raise StepError(f"{params.source}: {exc}") from exc
        dropped: Counter = Counter()
        for r in results:
            dropped.update(r.dropped)
        shards = []
        for r in results:
            for shard in r.shards:
                shards.append({**shard, "unit_key": r.key})
        counts = {split: {name: 0 for name in names} for split in SPLITS}
        for shard in shards:
            for label, n in shard["counts"].items():
                counts[shard["split"]][names[int(label)]] += n
        totals = {s: sum(c.values()) for s, c in counts.items()}
        reused = sum(1 for r in results if r.reused)
        log.info(
            "%d %ss in %d units (%d reused from the last snapshot, %d read): %s",
            total, fmt.sample_noun, len(results), reused, len(results) - reused, totals,
        )  # fmt: skip
        for reason, count in dropped.items():
            if count:
                log.info("dropped %d %s(s): %s", count, fmt.sample_noun, reason)
        snapshot.write_manifest(
            tmp,
            {
                "data_format": fmt.name,
                "source": params.source,
                "split_rule": params.split.rule().doc(),
                "split_files": dict(params.split.files),
                "shards": shards,
                "counts": counts,
                "totals": totals,
                "split_deviation": split_deviation(counts, params.split),
                "units": [
                    {
                        "id": r.unit.id,
                        "key": r.key,
                        "files": len(r.unit.files),
                        "inputs_sha256": combined_sha256(r.inputs),
                        "rows": r.rows,
                        "reused": r.reused,
                        "dropped": r.dropped,
                        "facts": r.facts,
                    }
                    for r in results
                ],
                **facts,
            },
        )
        dataset.write_label_names(tmp, names, fmt.name)
        write_manifest(
            tmp,
            "ingest",
            inputs={},
            outputs={
                snapshot.SNAPSHOT_FILE: tmp / snapshot.SNAPSHOT_FILE,
                "labels.json": tmp / "labels.json",
            },
            params=asdict(params),
            extra={
                "source": params.source,
                "kind": params.kind,
                "format": fmt.name,
                "input_sha256": inputs,
                "read": int(total + sum(dropped.values())),
                "dropped": {k: int(v) for k, v in dropped.items()},
                "counts": counts,
                "totals": totals,
                "units": len(results),
                "units_reused": reused,
                **facts,
            },
        )
        data_sha = combined_sha256({s["path"]: s["sha256"] for s in shards})
    return IngestResult(
        out_dir=out_dir,
        counts=counts,
        data_sha256=data_sha,
        dropped={k: int(v) for k, v in dropped.items()},
    )


def split_deviation(counts: dict[str, dict[str, int]], split: SplitParams) -> dict[str, Any]:
    """Per class: each split's share minus the configured fraction (points), and the worst."""
    want = {
        "train": 1 - split.val_fraction - split.test_fraction,
        "val": split.val_fraction,
        "test": split.test_fraction,
    }
    per_class: dict[str, dict[str, float]] = {}
    worst = 0.0
    for name in counts["train"]:
        n = sum(counts[s][name] for s in SPLITS)
        if not n:
            continue
        per_class[name] = {s: round(100 * (counts[s][name] / n - want[s]), 3) for s in SPLITS}
        worst = max(worst, *(abs(v) for v in per_class[name].values()))
    return {"points": per_class, "max_abs_points": round(worst, 3)}


def _check_conflicts(results: list[_UnitResult], noun: str) -> None:
    """Identical samples (equal keys) under different labels: one line naming where."""
    parts = [(i, r.key_labels) for i, r in enumerate(results) if r.key_labels is not None]
    if not parts:
        return
    keys = np.concatenate([kl[0] for _, kl in parts])
    labels = np.concatenate([kl[1] for _, kl in parts])
    rows = np.concatenate([kl[2] for _, kl in parts])
    owner = np.concatenate([np.full(len(kl[0]), i) for i, kl in parts])
    order = np.lexsort((rows, owner, keys))
    k, lb = keys[order], labels[order]
    bad_pairs = (k[1:] == k[:-1]) & (lb[1:] != lb[:-1])
    if not bad_pairs.any():
        return
    first = int(np.flatnonzero(bad_pairs)[0])
    same = order[np.flatnonzero(keys[order] == k[first])]
    where: dict[str, list[int]] = {}
    for i in same.tolist():
        unit = results[int(owner[i])].unit
        if unit.rows_are_files:
            where.setdefault(unit.where(int(rows[i])), [])
        else:
            where.setdefault(unit.id, []).append(int(rows[i]))
    shown = "; ".join(
        f"{name} rows {sorted(r)[:5]}" if r else name for name, r in list(where.items())[:4]
    )
    groups = int(np.unique(k[1:][bad_pairs]).size)
    raise StepError(
        f"{groups} identical {noun}(s) carry different labels, e.g. {shown} (labels "
        f"{sorted(set(labels[same].tolist()))}); fix the labels in the source"
    )


# --------------------------------------------------------------------------- CLI


STEP = Step(
    name="ingest",
    doc=__doc__,
    params=None,
    params_of_task=lambda task: task.data.ingest_params,
    sections=("task", "ingest"),
    run=run,
    outputs=(
        Out(
            "data",
            "outputs/ingest",
            "out_dir",
            kfp="Dataset",
            dvc="snapshot",
            help="the data set (a snapshot; unchanged inputs keep their shards)",
        ),
    ),
    values=(
        Value(
            "source_sha256",
            "expected_source_sha256",
            help="refuse to write unless the source still has this fingerprint",
        ),
    ),
    extra_deps=("data/raw",),
)


def main(argv: Sequence[str] | None = None) -> int:
    """The step CLI, plus ``materialize`` (write builtin:digits as IDX files)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["materialize"]:
        return step_main(STEP, argv[1:] if argv[:1] == ["run"] else argv)
    parser = argparse.ArgumentParser(prog="python -m components.steps.ingest materialize")
    parser.add_argument("--out", default="data/raw/digits")
    args = parser.parse_args(argv[1:])

    def _go() -> None:
        for name, digest in materialize_builtin_digits(output_dir(args.out)).items():
            log.info("wrote %s/%s sha256=%s", args.out, name, digest)

    return run_cli(_go)


if __name__ == "__main__":
    sys.exit(main())
