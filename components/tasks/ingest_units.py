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

import os
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from components.core.artifacts import StepError, read_json, sha256_file, write_json
from components.faults import failpoints
from components.ml.data import snapshot, stat_cache
from components.tasks.data import Skipped, Unit, sum_facts
from components.tasks.splitting import file_split, permutation

if TYPE_CHECKING:  # a worker imports this module: not paddle (components.tasks.base) with it
    from components.tasks import Task

SPLITS = snapshot.SPLITS
PART_FILE = "part.json"
PART_ARRAYS = "part.npz"
UNIT_INDEX = "unit-index.npz"  # each unit's key prefixes, labels and rows, beside the snapshot
UNREADABLE_SHOWN = 20  # unreadable input files named in ingest's one error (the rest counted)


@dataclass(frozen=True)
class UnitJob:
    """What a worker needs to turn one unit into shards (picklable)."""

    fmt: Any
    params: Any
    params_file: str
    unit: Unit
    extra_key: dict[str, Any]
    shard_dir: Path
    # the last snapshot's units with this unit's id, each with its shards and, when kept
    # (UNIT_INDEX), its key prefixes, labels and rows: what an unchanged unit reuses
    candidates: tuple[dict[str, Any], ...]
    previous_root: Path | None
    assignment: dict[bytes, int] | None  # permutation rule: key -> split index
    file_splits: dict[str, str]
    names: tuple[str, ...]  # the unit's input names (DataFormat.input_names), asked once
    known: dict[str, str] = field(default_factory=dict)  # inputs the stat cache vouches for
    # the stats of the unit's local inputs, taken by the listing's process before any read
    # (a unit the last snapshot has: to vouch for them); None: the worker takes them
    stats: UnitStats | None = None


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
    files_read: int = 0  # input files this run read (0: the stat cache vouched for them all)
    stats: UnitStats | None = None  # its local inputs' stats, taken before they were read


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
    """One unit into shards; runs in a worker process or in this one. A unit that may be
    unchanged (the last snapshot has a unit of its id) is hashed first: inputs the stat cache
    vouches for are not read, and when the key matches, its shards are reused. Otherwise the
    unit is read once: each file's bytes are hashed and decoded in one pass (when the format
    says its batches' hashes, ``UnitBatch.inputs``), split and written."""
    failpoints.hit("ingest.unit", job.unit.id)
    if job.stats is None:
        job = replace(job, stats=unit_stats(job.fmt, job.params, job.names))
    stats = job.stats
    inputs: dict[str, str] = {}
    hashed = 0
    if _may_reuse(job):
        inputs, hashed = _hash_inputs(job)
        reused = _reuse_matching(job, inputs)
        if reused is not None:
            return replace(reused, files_read=hashed, stats=stats)
    result = _read_unit(job, inputs)
    return replace(result, files_read=result.files_read + hashed, stats=stats)


def reuse_known(job: UnitJob) -> UnitResult | None:
    """The unit's reuse without reading any file, when the stat cache vouches for every
    input and the key matches the last snapshot's (run here, before any worker starts)."""
    if not _may_reuse(job) or any(n not in job.known for n in job.names):
        return None
    reused = _reuse_matching(job, {n: job.known[n] for n in job.names})
    return None if reused is None else replace(reused, stats=job.stats)


def _may_reuse(job: UnitJob) -> bool:
    return bool(job.candidates) and job.previous_root is not None and job.assignment is None


def _reuse_matching(job: UnitJob, inputs: dict[str, str]) -> UnitResult | None:
    key = unit_key(job, inputs)
    for old in job.candidates:
        if old["key"] == key:
            return _reuse(job, key, inputs, old)
    return None


def _hash_inputs(job: UnitJob) -> tuple[dict[str, str], int]:
    """sha256 of each input of the unit (the stat cache's where it vouches, else read: local
    files here, others by the format), and how many inputs were read for them."""
    names = job.names
    missing = [n for n in names if n not in job.known]
    stated = dict(zip(job.stats.names, job.stats.stats.paths, strict=True)) if job.stats else {}
    paths = {n: stated.get(n) or job.fmt.input_path(job.params, n) for n in missing}
    if all(paths.values()):
        hashed = {n: _sha256_of(str(p)) for n, p in paths.items()}
    else:
        hashed = job.fmt.unit_inputs(job.params, job.unit)
    return {n: job.known.get(n) or hashed.get(n, "") for n in names}, len(hashed)


def _sha256_of(path: str) -> str:
    try:
        return sha256_file(path)
    except OSError as exc:
        raise StepError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _read_unit(job: UnitJob, inputs: dict[str, str]) -> UnitResult:
    """Read, split and write the unit's rows. Its shards are written under a temporary name
    and renamed to the unit's key once every input is hashed (the read itself hashes them
    when the format says its batches' hashes; else they were hashed before, or are now)."""
    fmt, unit = job.fmt, job.unit
    schema = fmt.arrow_schema()
    limits = job.params.shards.limits()
    pending = f".pending-{uuid.uuid4().hex[:16]}"
    writers = {
        s: snapshot.ShardWriter(job.shard_dir, f"{pending}-{s}", schema, limits, s, unit.id)
        for s in SPLITS
    }
    rule = job.params.split.rule()
    dropped: Counter = Counter()
    facts, prefixes, labels_all, rows_all = [], [], [], []
    unreadable: list[tuple[str, str]] = []
    unreadable_count = 0
    read: dict[str, str] = {}
    for batch in fmt.read_unit(job.params, unit, job.params_file):
        read.update(batch.inputs or {})
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
        columns = _columns(batch)
        for index, split in enumerate(SPLITS):
            mask = np.flatnonzero(where == index)
            if mask.size:
                writers[split].add(_record_batch(schema, columns, mask))
    inputs = {**inputs, **read}  # what was decoded wins: its bytes are the rows
    files_read = len(read)
    names = job.names
    if any(n not in inputs for n in names):  # a format that does not hash as it reads
        again, count = _hash_inputs(replace(job, known={**job.known, **inputs}))
        inputs, files_read = {**again, **read}, files_read + count
    unnamed = [n for n in names if not inputs.get(n)]
    if unnamed:
        raise StepError(
            f"data format {fmt.name!r}, unit {unit.id}: no sha256 for input(s) {unnamed[:3]} "
            "(DataFormat.unit_inputs must key its hashes by DataFormat.input_names)"
        )
    inputs = {n: inputs[n] for n in names}
    key = unit_key(job, inputs)
    shards = [
        asdict(_renamed(job.shard_dir, s, pending, key[:24]))
        for split in SPLITS
        for s in writers[split].close()
    ]
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
        files_read=files_read,
    )


def _renamed(shard_dir: Path, shard: snapshot.Shard, old: str, new: str) -> snapshot.Shard:
    """A shard written under a temporary name, renamed to carry its unit's key."""
    name = Path(shard.path).name
    target = new + name[len(old) :]
    os.replace(shard_dir / name, shard_dir / target)
    return replace(shard, path=f"{snapshot.SHARD_DIR}/{target}")


def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _prefixes(keys: Sequence[bytes]) -> np.ndarray:
    """The first 8 bytes of each key as uint64 (for finding conflicting labels)."""
    return np.frombuffer(b"".join(k[:8] for k in keys), dtype=">u8").astype(np.uint64)


def _reuse(
    job: UnitJob, key: str, inputs: dict[str, str], old: dict[str, Any]
) -> UnitResult | None:
    """Link the unit's shards from the last snapshot (None when one is gone or changed); its
    key prefixes, labels and rows come from the last snapshot's unit index, or are read back
    from the shards when it has none."""
    assert job.previous_root is not None
    records = old["shards"]
    sources = [job.previous_root / s["path"] for s in records]
    if not all(
        p.is_file() and p.stat().st_size == s["bytes"]
        for p, s in zip(sources, records, strict=True)
    ):
        return None
    for src, shard in zip(sources, records, strict=True):
        snapshot.link_or_copy(src, job.shard_dir.parent / shard["path"])
    arrays = old.get("arrays")
    if arrays is None:
        arrays = _read_key_labels(sources)
    prefixes, lbl, rows = arrays
    return UnitResult(
        job.unit,
        key,
        inputs,
        [{k: v for k, v in s.items() if k != "unit_key"} for s in records],
        True,
        rows=int(lbl.size),
        dropped=dict(old.get("dropped", {})),
        facts=dict(old.get("facts", {})),
        key_labels=(prefixes, lbl, rows),
        labels_found=np.unique(lbl),
    )


def _read_key_labels(paths: Sequence[Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Key prefixes, labels and rows of shards, read back (a snapshot without a unit index)."""
    import pyarrow.parquet as pq

    prefixes, labels, rows = [], [], []
    for path in paths:
        table = pq.read_table(path, columns=["key", "label", "row"])
        prefixes.append(_prefixes(table.column("key").to_pylist()))
        labels.append(snapshot.int64s(table.column("label")))
        rows.append(snapshot.int64s(table.column("row")))
    return _cat(prefixes, np.uint64), _cat(labels, np.int64), _cat(rows, np.int64)


def _columns(batch: Any) -> dict[str, Any]:
    """A unit batch's values by shard column name."""
    return {
        "key": batch.keys,
        "label": batch.labels,
        "source": batch.sources,
        "row": batch.rows,
        **batch.columns,
    }


def _record_batch(schema: Any, columns: dict[str, Any], mask: np.ndarray) -> Any:
    """The rows ``mask`` of a unit batch's ``columns`` as an Arrow record batch of ``schema``."""
    import pyarrow as pa

    picked = mask.tolist()
    return pa.RecordBatch.from_arrays(
        [_column(_take(columns[f.name], mask, picked), f.type) for f in schema], schema=schema
    )


def _take(values: Any, mask: np.ndarray, picked: list[int]) -> Any:
    if isinstance(values, np.ndarray):
        return values[mask]
    return [values[i] for i in picked]


_NUMPY_OF = {"int32": np.int32, "int64": np.int64, "float32": np.float32, "float64": np.float64}


def _column(values: Any, type_: Any) -> Any:
    """An Arrow column laid out from numpy or joined buffers, never value by value
    (``pa.array`` appends one by one, ~50 MB/s for image bytes, and imports pandas: 0.3 s
    in every worker)."""
    import pyarrow as pa

    n = len(values)
    dtype = _NUMPY_OF.get(str(type_))
    if dtype is not None and isinstance(values, np.ndarray) and values.ndim == 1:
        data = np.ascontiguousarray(values, dtype=dtype)
        return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(data)])
    if pa.types.is_fixed_size_binary(type_) and all(len(v) == type_.byte_width for v in values):
        return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(b"".join(values))])
    if n and (
        (type_ == pa.binary() and isinstance(values[0], bytes))
        or (type_ == pa.string() and isinstance(values[0], str))
    ):
        blobs = values if type_ == pa.binary() else [v.encode("utf-8") for v in values]
        lengths = np.fromiter((len(v) for v in blobs), dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] < 2**31:
            data = pa.py_buffer(b"".join(blobs))
            return pa.Array.from_buffers(
                type_, n, [None, pa.py_buffer(offsets.astype(np.int32)), data]
            )
    return pa.array(values, type=type_)


def write_unit_index(dest: Path, results: Sequence[UnitResult]) -> Path:
    """Each unit's key prefixes, labels and rows in ``dest`` (:data:`UNIT_INDEX`), by unit
    key: what the next run's unchanged units take instead of reading their shards back."""
    kept = [(r.key, r.key_labels) for r in results if r.key_labels is not None]
    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum([len(kl[0]) for _, kl in kept], out=offsets[1:])
    path = dest / UNIT_INDEX
    with open(path, "wb") as fh:
        np.savez(
            fh,
            unit_keys=np.asarray([key for key, _ in kept], dtype="S64"),
            offsets=offsets,
            keys=_cat([kl[0] for _, kl in kept], np.uint64),
            labels=_cat([kl[1] for _, kl in kept], np.int64),
            rows=_cat([kl[2] for _, kl in kept], np.int64),
        )
    return path


def _unit_index(root: Path) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The unit index of the snapshot in ``root`` by unit key (empty when it has none, or it
    cannot be read: the shards are read back instead)."""
    path = root / UNIT_INDEX
    if not path.is_file():
        return {}
    try:
        with np.load(path, allow_pickle=False) as z:
            names = [k.decode() for k in z["unit_keys"].tolist()]
            bounds = z["offsets"].tolist()
            keys, labels, rows = z["keys"], z["labels"], z["rows"]
    except (OSError, ValueError, KeyError):
        return {}
    return {
        name: (keys[a:b], labels[a:b], rows[a:b])
        for name, a, b in zip(names, bounds[:-1], bounds[1:], strict=True)
    }


def previous_units(out_dir: Path) -> tuple[dict[str, list[dict[str, Any]]], Path | None]:
    """The last snapshot's units by id, each with its shards and (from its unit index) its
    key prefixes, labels and rows: what an unchanged unit reuses."""
    try:
        snap = snapshot.load(out_dir)
    except StepError:
        return {}, None
    index = _unit_index(out_dir)
    shards_of: dict[str, list[dict[str, Any]]] = {}
    for s in snap.doc["shards"]:
        shards_of.setdefault(s.get("unit_key", ""), []).append(s)
    by_id: dict[str, list[dict[str, Any]]] = {}
    for unit_doc in snap.doc.get("units", []):
        key = unit_doc["key"]
        doc = {**unit_doc, "shards": shards_of.get(key, []), "arrays": index.get(key)}
        by_id.setdefault(unit_doc["id"], []).append(doc)
    return by_id, out_dir


def map_units(jobs: list[UnitJob], pool: snapshot.WorkerPool) -> list[UnitResult]:
    """The units' results in order: those the stat cache shows unchanged are reused here, the
    rest run on ``pool`` (started now if it was not started ahead)."""
    results: list[UnitResult | None] = [reuse_known(job) for job in jobs]
    todo = [i for i, r in enumerate(results) if r is None]
    done = pool.map(ingest_unit, [jobs[i] for i in todo], "ingest units", "unit")
    for i, result in zip(todo, done, strict=True):
        results[i] = result
    return results  # type: ignore[return-value]


def worker_modules(fmt: Any) -> tuple[str, ...]:
    """What a unit worker imports before its first unit (a pool started ahead imports them
    while the listing runs): this module, the format's and the modules it reads with."""
    return (__name__, type(fmt).__module__, "pyarrow.parquet", *fmt.reader_modules)


def new_units(listed: Sequence[Unit], previous: dict[str, list[dict[str, Any]]]) -> int:
    """How many listed units have no unit of their id in the last snapshot (they will be
    read, so their workers may start before the old units are stat-ed)."""
    return sum(unit.id not in previous for unit in listed)


@dataclass(frozen=True)
class UnitStats:
    """The stats of a unit's local inputs (their names, and the stats by row)."""

    names: list[str]
    stats: stat_cache.Stats


def unit_stats(fmt: Any, params: Any, input_names: Sequence[str]) -> UnitStats:
    """Stat a unit's local inputs (before any is read: a file changed after its stat was
    taken has another stat next time, so it is hashed again)."""
    names, paths = [], []
    cwd = os.getcwd()
    for name in input_names:
        path = fmt.input_path(params, name)
        if path is not None:
            names.append(name)
            paths.append(path if path.startswith("/") else os.path.join(cwd, path))
    stats, where = stat_cache.take(paths)
    return UnitStats([names[i] for i in where], stats)


def write_stat_cache(dest: Path, results: Sequence[UnitResult], taken_ns: int) -> Path:
    """The stat cache of every local input the results hashed, their stats taken after
    ``taken_ns`` (when this run started: the racy-entry rule measures from it)."""
    parts = [r for r in results if r.stats is not None and r.stats.names]
    merged = stat_cache.Stats(
        [p for r in parts for p in r.stats.stats.paths],  # type: ignore[union-attr]
        np.concatenate([r.stats.stats.ids for r in parts])
        if parts
        else np.zeros((0, 2), np.uint64),  # type: ignore[union-attr]
        np.concatenate([r.stats.stats.times for r in parts])
        if parts
        else np.zeros((0, 3), np.int64),  # type: ignore[union-attr]
        taken_ns,
    )
    digests = [r.inputs.get(name) for r in parts for name in r.stats.names]  # type: ignore[union-attr]
    return stat_cache.write(dest, merged, digests)


def unit_jobs(
    params: Any,
    task: Task,
    shard_dir: Path,
    params_file: str,
    previous: dict[str, list[dict[str, Any]]],
    previous_root: Path | None,
    listed: list[Unit] | None = None,
    cache: stat_cache.StatCache | None = None,
) -> list[UnitJob]:
    """One job per unit of the source (``listed``, else listed here), in unit order. A unit
    the last snapshot has (by id) is stat-ed here, and its job carries the hashes of its
    inputs the stat ``cache`` vouches for; every other unit is stat-ed by its worker."""
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
    jobs = []
    for unit in units:
        candidates = tuple(previous.get(unit.id, ()))
        names = tuple(fmt.input_names(params, unit))
        stats, known = None, {}
        if candidates and previous_root is not None:
            stats = unit_stats(fmt, params, names)
            if cache is not None:
                vouched = cache.vouch(stats.stats)
                known = {n: h for n, h in zip(stats.names, vouched, strict=True) if h}
        jobs.append(
            UnitJob(fmt, params, params_file, unit, extra_key, shard_dir, candidates,
                    previous_root, assignment, dict(params.split.files), names, known, stats)
        )  # fmt: skip
    return jobs


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
                "files_read": r.files_read,
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
                    files_read=int(entry.get("files_read", 0)),
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
