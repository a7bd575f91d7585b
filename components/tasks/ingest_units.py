"""ingest's map: one unit of the source (a group of input files) into Parquet shards.

A unit's content address (:func:`unit_key`: the sha256 of its inputs, the format and the
split rule) decides whether its shards from the last snapshot are reused (linked, not
rewritten: :func:`previous_units`) or it is read through the data format, split
(``components.tasks.splitting``) and written (:func:`ingest_unit`). :func:`map_units` runs the
jobs (:func:`unit_jobs`, one a unit) on a process pool (``ingest.workers``) or here; each
result carries what the reduce needs: the unit's shards, inputs, facts, and its rows' key
prefixes and labels (finding identical samples under different labels).

An orchestrator spreads the map over nodes: each node writes its units' shards and a part
(:func:`write_part`); the reduce reads every part back (:func:`read_parts`).

Library layer: imported by the ingest step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from components.core.artifacts import StepError, read_json, write_json
from components.faults import failpoints
from components.ml.data import snapshot
from components.tasks.data import Skipped, Unit, sum_facts
from components.tasks.splitting import file_split, permutation

if TYPE_CHECKING:  # a worker imports this module: not paddle (components.tasks.base) with it
    from components.tasks import Task

SPLITS = snapshot.SPLITS
PART_FILE = "part.json"
PART_ARRAYS = "part.npz"
UNREADABLE_SHOWN = 20  # unreadable input files named in ingest's one error (the rest counted)


@dataclass(frozen=True)
class UnitJob:
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
class UnitResult:
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
    # input files that did not decode: the first UNREADABLE_SHOWN (path, reason), and how many
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    unreadable_count: int = 0


def unit_key(job: UnitJob, inputs: dict[str, str]) -> str:
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


def _split_of(job: UnitJob, batch: Any, rule: snapshot.SplitRule) -> np.ndarray:
    """Each row's split index: the permutation's, else the rule's; then the file's, where
    ``ingest.split.files`` names it."""
    if job.assignment is not None:
        where = np.asarray([job.assignment[k] for k in batch.keys], dtype=np.int8)
    else:
        where = snapshot.stable_split(batch.keys, rule)
    for i, src in enumerate(batch.sources):  # files the user put in one split
        forced = file_split(src, job.file_splits, job.params.source) if job.file_splits else None
        if forced is not None:
            where[i] = SPLITS.index(forced)
    return where


def ingest_unit(job: UnitJob) -> UnitResult:
    """Hash one unit's inputs; reuse its shards from the last snapshot, else read, split and
    write them. Runs in a worker process or in this one."""
    fmt, unit = job.fmt, job.unit
    failpoints.hit("ingest.unit", unit.id)
    inputs = fmt.unit_inputs(job.params, unit)
    key = unit_key(job, inputs)
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
    unreadable: list[tuple[str, str]] = []
    unreadable_count = 0
    for batch in fmt.read_unit(job.params, unit, job.params_file):
        dropped.update(batch.dropped)
        unreadable_count += len(batch.unreadable)
        unreadable.extend(batch.unreadable[: UNREADABLE_SHOWN - len(unreadable)])
        if not len(batch):
            continue
        facts.append(fmt.batch_facts(batch))
        where = _split_of(job, batch, rule)
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
    return UnitResult(
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
        unreadable=unreadable,
        unreadable_count=unreadable_count,
    )


def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _prefixes(keys: Sequence[bytes]) -> np.ndarray:
    """The first 8 bytes of each key as uint64 (for finding conflicting labels)."""
    return np.frombuffer(b"".join(k[:8] for k in keys), dtype=">u8").astype(np.uint64)


def _reuse(
    job: UnitJob, key: str, inputs: dict[str, str], old: dict[str, Any]
) -> UnitResult | None:
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
    return UnitResult(
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


def previous_units(out_dir: Path) -> tuple[dict[str, dict[str, Any]], Path | None]:
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


def map_units(jobs: list[UnitJob], workers: int) -> Iterator[UnitResult]:
    """Run the jobs on a process pool (``workers`` > 1) or here, in order."""
    return snapshot.ordered_map(ingest_unit, jobs, workers, "ingest units", "unit")


def unit_jobs(
    params: Any,
    task: Task,
    shard_dir: Path,
    params_file: str,
    previous: dict[str, dict[str, Any]],
    previous_root: Path | None,
    listed: list[Unit] | None = None,
) -> list[UnitJob]:
    """One job per unit of the source (``listed``, else listed here), in unit order."""
    fmt = task.data
    units = fmt.units(params, params_file) if listed is None else listed
    fixed_names = fmt.fixed_label_names(params, params_file)
    assignment = (
        permutation(fmt, params, units, params_file)
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
        UnitJob(fmt, params, params_file, unit, "", extra_key, shard_dir, previous,
                previous_root, assignment, dict(params.split.files))
        for unit in units
    ]  # fmt: skip


def write_part(
    dest: Path, order: list[int], results: list[UnitResult], skipped: Skipped | None = None
) -> None:
    """The units' results (``order``: their places among the source's units) as a part in
    ``dest``, next to their shards: JSON, and the key prefixes, labels and rows as arrays;
    and the files the listing skipped (every part lists the whole source)."""
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
    skipped = skipped or Skipped()
    write_json(
        dest / PART_FILE,
        {"units": docs, "skipped": {"counts": skipped.counts, "examples": skipped.examples}},
    )
    with open(dest / PART_ARRAYS, "wb") as fh:
        np.savez(fh, **arrays)


def read_parts(parts: Sequence[Path], shard_dir: Path) -> list[UnitResult]:
    """The units of every part, in unit order, their shards linked into ``shard_dir``."""
    found: dict[int, UnitResult] = {}
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
                found[pos] = UnitResult(
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


def read_skipped(parts: Sequence[Path]) -> Skipped:
    """The files the source's listing skipped, as the first part recorded them (every part
    lists the whole source)."""
    doc = read_json(Path(parts[0]) / PART_FILE).get("skipped", {}) if parts else {}
    return Skipped(dict(doc.get("counts", {})), dict(doc.get("examples", {})))
