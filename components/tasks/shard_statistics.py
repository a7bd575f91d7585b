"""validate's map: one shard's statistics, read in bounded record batches.

:func:`shard_stats` verifies a shard's sha256 against ``snapshot.json`` (a corrupt or missing
shard is one line naming it and the sha256 the manifest pins), then adds its Arrow record
batches up into its row of the shard table (columns, nulls, the label dtype and range, and
the data format's own columns: ``DataFormat.shard_stats``), its rows per label and its rows'
(key, label) pairs, which the reduce (``components.tasks.shard_reduce``) needs for
duplicates and overlap. :func:`map_shards` runs it over a process pool (``validate.workers``)
or here.

An orchestrator spreads the map over nodes: each node writes its shards' results as a part
(:func:`write_part`) and the reduce reads every part back (:func:`read_parts`), each shard
exactly once.

Library layer: imported by the validate step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import StepError, read_json, write_json
from components.faults import failpoints
from components.ml.data import snapshot
from components.tasks.data import CommonValidateParams, DataFormat, Examples

BATCH_ROWS = 256  # rows per record batch read (256 RGB 224x224 images: 38 MB)
PAIR_BYTES = snapshot.KEY_BYTES + 8  # a row's key and its big-endian int64 label
PART_FILE = "part.json"
PART_ARRAYS = "part.npz"


@dataclass(frozen=True)
class ShardJob:
    """What a worker needs to add up one shard (picklable: no snapshot, no task)."""

    fmt: DataFormat
    params: Any  # the validate section as the format reads it
    num_classes: int
    root: str  # the snapshot directory
    shard: snapshot.Shard


@dataclass
class ShardResult:
    """One shard added up: its row of the shard table, the format's facts, the rows per
    label within the label set, and its rows' (key, label) pairs (sorted ``|S40``)."""

    row: dict[str, Any]
    facts: dict[str, Any]
    counts: dict[int, int]
    pairs: np.ndarray


def _type_name(arrow_type: Any) -> str:
    """``int64``, ``float32`` ... for numbers, else the Arrow type (``string``)."""
    import pyarrow as pa

    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type):
        return np.dtype(arrow_type.to_pandas_dtype()).name
    return str(arrow_type)


def _schema(fmt: DataFormat, schema: Any) -> str:
    """``ok``, or how a shard's columns differ from the format's (names, and the key)."""
    expected = fmt.arrow_schema()
    missing = [n for n in expected.names if n not in schema.names]
    unexpected = [n for n in schema.names if n not in expected.names]
    parts = [f"missing {missing}"] if missing else []
    parts += [f"unexpected {unexpected}"] if unexpected else []
    if "key" in schema.names:
        found, want = schema.field("key").type, expected.field("key").type
        if found != want:
            parts.append(f"key is {found}, expected {want}")
    return "; ".join(parts) or "ok"


@dataclass
class _Labels:
    """A shard's labels: dtype, range, rows per label, rows outside the label set."""

    num_classes: int
    dtype: str = ""
    low: int | None = None
    high: int | None = None
    counts: Counter[int] = field(default_factory=Counter)
    outside: Examples = field(default_factory=Examples)

    def add(self, batch: Any, first: int) -> np.ndarray:
        """Add a batch; returns its labels as int64 (-1 where none can be read)."""
        import pyarrow as pa

        n = batch.num_rows
        if "label" not in batch.schema.names:
            return np.full(n, -1, np.int64)
        column = batch.column("label")
        self.dtype = self.dtype or _type_name(column.type)
        valid = np.asarray(column.is_valid())
        if pa.types.is_integer(column.type):
            values = column.fill_null(0).to_numpy().astype(np.int64)
            integral = np.ones(n, bool)
        elif pa.types.is_floating(column.type):
            raw = column.fill_null(0).to_numpy()
            integral = np.isfinite(raw) & (raw == np.round(raw))
            values = np.where(integral, raw, -1).astype(np.int64)
        else:  # the dtype rule reports it; the label set cannot be checked
            return np.full(n, -1, np.int64)
        if valid.any():
            lo, hi = int(values[valid].min()), int(values[valid].max())
            self.low = lo if self.low is None else min(self.low, lo)
            self.high = hi if self.high is None else max(self.high, hi)
        inside = valid & integral & (values >= 0) & (values < self.num_classes)
        bad = np.flatnonzero(valid & ~inside)
        if bad.size:
            shown = values[bad] if integral[bad].all() else column.take(bad).to_pylist()
            self.outside.add(batch, first, bad, shown)
        found, counts = np.unique(values[inside], return_counts=True)
        self.counts.update(dict(zip(found.tolist(), counts.tolist(), strict=True)))
        return np.where(valid, values, -1)


def _pairs(batch: Any, labels: np.ndarray) -> np.ndarray:
    """The (key, label) of each row with a 32-byte key, as ``|S40`` (key then label)."""
    import pyarrow as pa

    if "key" not in batch.schema.names:
        return np.zeros(0, f"S{PAIR_BYTES}")
    column = batch.column("key")
    if column.type != pa.binary(snapshot.KEY_BYTES):  # the schema rule reports it
        return np.zeros(0, f"S{PAIR_BYTES}")
    n, width = len(column), snapshot.KEY_BYTES
    keys = np.frombuffer(column.buffers()[1], np.uint8, n * width, column.offset * width)
    out = np.empty((n, PAIR_BYTES), np.uint8)
    out[:, :width] = keys.reshape(n, width)
    out[:, width:] = labels.astype(">i8").view(np.uint8).reshape(n, 8)
    if column.null_count:
        out = out[np.asarray(column.is_valid())]
    return np.ascontiguousarray(out).view(f"S{PAIR_BYTES}").ravel()


def shard_stats(job: ShardJob) -> ShardResult:
    """The map: verify one shard's sha256, then stream its record batches into its row of
    the shard table, its label counts and its (key, label) pairs."""
    snap = snapshot.Snapshot(Path(job.root), {})
    shard = job.shard
    failpoints.hit("validate.shard", shard.path)
    snapshot.verify(snap, [shard])
    schema = snapshot.open_shard(snap, shard).schema_arrow
    labels = _Labels(job.num_classes)
    own = job.fmt.shard_stats(job.params)
    nulls: Counter[str] = Counter()
    pairs: list[np.ndarray] = []
    rows = 0
    for batch in snapshot.iter_batches(snap, shard.split, batch_rows=BATCH_ROWS, shards=[shard]):
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            if column.null_count:
                nulls[name] += column.null_count
        values = labels.add(batch, rows)
        pairs.append(_pairs(batch, values))
        own.add(batch, rows)
        rows += batch.num_rows
    columns, facts = own.result()
    problems = _schema(job.fmt, schema)
    row = {
        "name": shard.path,
        "split": shard.split,
        "rows": rows,
        "schema": problems,
        "schema_found": f"found {problems}",
        "nulls": sum(nulls.values()),
        "nulls_found": f"found {sum(nulls.values())} null values ("
        + ", ".join(f"{k}: {v}" for k, v in sorted(nulls.items()))
        + ")",
        "label_dtype": labels.dtype or None,
        "label_dtype_found": f"found {labels.dtype or 'no label column'}",
        "label_min": labels.low,
        "label_max": labels.high,
        "label_found": labels.outside.found(rows, "outside the label set"),
        **columns,
    }
    merged = np.concatenate(pairs) if pairs else np.zeros(0, f"S{PAIR_BYTES}")
    merged.sort()
    return ShardResult(row, facts, dict(labels.counts), merged)


def map_shards(jobs: list[ShardJob], workers: int) -> Iterator[ShardResult]:
    """Run the jobs on a process pool (``workers`` > 1) or here, in order."""
    return snapshot.ordered_map(shard_stats, jobs, workers, "validate shards", "shard")


def shard_jobs(
    params: CommonValidateParams, fmt: DataFormat, snap: snapshot.Snapshot, num_classes: int
) -> list[ShardJob]:
    """One job per shard of the snapshot, in snapshot order."""
    return [ShardJob(fmt, params, num_classes, str(snap.root), s) for s in snap.shards]


# --------------------------------------------------------------------------- parts


def write_part(
    dest: Path, snap: snapshot.Snapshot, mine: list[tuple[int, ShardJob]], workers: int = 1
) -> None:
    """Add up the shards of ``mine`` (their place in the snapshot, their job) into a part in
    ``dest``: the results as JSON and the (key, label) pairs as arrays."""
    docs, arrays = [], {}
    results = map_shards([j for _, j in mine], workers)
    for (position, job), result in zip(mine, results, strict=True):
        docs.append(
            {
                "position": position,
                "path": job.shard.path,
                "row": result.row,
                "facts": result.facts,
                "counts": {str(k): v for k, v in result.counts.items()},
            }
        )
        arrays[str(position)] = result.pairs
    write_json(dest / PART_FILE, {"snapshot": snap.sha256, "shards": docs})
    with open(dest / PART_ARRAYS, "wb") as fh:
        np.savez(fh, **arrays)


def read_parts(parts: Sequence[Path], snap: snapshot.Snapshot) -> Iterator[ShardResult]:
    """The shards' results written by :func:`write_part`; every shard exactly once."""
    expected = {i: s.path for i, s in enumerate(snap.shards)}
    seen: set[int] = set()
    for part in parts:
        if not (part / PART_FILE).is_file():
            raise StepError(f"{part}: not a validate part (no {PART_FILE}); run the map first")
        doc = read_json(part / PART_FILE)
        if doc.get("snapshot") != snap.sha256:
            raise StepError(f"{part}: made from another snapshot than {snap.root}")
        with np.load(part / PART_ARRAYS, allow_pickle=False) as arrays:
            for entry in doc["shards"]:
                position = int(entry["position"])
                if expected.get(position) != entry["path"] or position in seen:
                    raise StepError(f"{part}: shard {entry['path']} is not expected here")
                seen.add(position)
                counts = {int(k): int(v) for k, v in entry["counts"].items()}
                yield ShardResult(entry["row"], entry["facts"], counts, arrays[str(position)])
    missing = sorted(set(expected) - seen)
    if missing:
        raise StepError(
            f"validate parts {[str(p) for p in parts]}: shards {[expected[i] for i in missing]} "
            "missing"
        )
