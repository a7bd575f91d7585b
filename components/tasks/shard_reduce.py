"""validate's reduce: the shards' statistics (``components.tasks.shard_statistics``) as the
tables the suites check (``components.tasks.expectations``), in any order of shards.

- ``<split>_shards``: one row per shard (validate's columns and the format's);
- ``splits``: rows and missing classes per split; ``class_counts``: each class's fraction;
- ``split_overlap``: per pair of splits, the samples (keys) they share;
- ``duplicates``: per split, the rows repeating an earlier row exactly (same key and label)
  and the samples (keys) stored under more than one label.

Duplicates and overlap are exact: every row contributes its 32-byte key and its 8-byte label
(40 bytes); :func:`key_stats` sorts one split's pairs at a time and keeps each split's
distinct keys (32 bytes a sample) for the overlap. The examples a failure line quotes are
found by reading only the key, label, source and row columns again (:func:`locate`).

Library layer: imported by the validate step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from components.ml.data import dataset, snapshot
from components.tasks.data import EXAMPLES, DataFormat, sample_where, sum_facts
from components.tasks.expectations import Table, set_text
from components.tasks.shard_statistics import PAIR_BYTES, ShardResult

SHARD_COLUMNS = (
    "name", "split", "rows", "schema", "schema_found", "nulls", "nulls_found",
    "label_dtype", "label_dtype_found", "label_min", "label_max", "label_found",
)  # fmt: skip
SPLIT_COLUMNS = (
    "name",
    "split",
    "shards",
    "rows",
    "rows_found",
    "classes_missing",
    "classes_found",
)
CLASS_COUNT_COLUMNS = ("name", "split", "label", "count", "fraction")
OVERLAP_COLUMNS = ("name", "splits", "shared", "shared_found")
DUPLICATE_COLUMNS = (
    "name", "split", "rows", "duplicate_rows", "duplicate_fraction", "duplicates_found",
    "conflicting", "conflicts_found",
)  # fmt: skip
PAIRS = (("train", "val"), ("train", "test"), ("val", "test"))
Places = dict[bytes, list[tuple[str, str, int]]]  # key -> (split, where, label)


@dataclass
class _Split:
    shards: int = 0
    rows: int = 0
    counts: Counter[int] = field(default_factory=Counter)
    facts: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[np.ndarray] = field(default_factory=list)


@dataclass
class KeyStats:
    """One split's duplicates and conflicts, and its distinct keys (sorted ``|S32``)."""

    rows: int
    duplicate_rows: int
    conflicting: int
    distinct: np.ndarray
    duplicate_examples: list[bytes]
    conflict_examples: list[bytes]


def _keys_of(pairs: np.ndarray) -> np.ndarray:
    """The key part (first 32 bytes) of ``|S40`` pairs, as ``|S32``."""
    width = snapshot.KEY_BYTES
    raw = pairs.view(np.uint8).reshape(len(pairs), PAIR_BYTES)[:, :width]
    return np.ascontiguousarray(raw).view(f"S{width}").ravel()


def key_stats(parts: list[np.ndarray], rows: int) -> KeyStats:
    """Exact duplicates (same key and label) and conflicts (one key, several labels) of a
    split from its shards' pairs; the pairs are released as soon as they are counted."""
    pairs = np.concatenate(parts) if parts else np.zeros(0, f"S{PAIR_BYTES}")
    parts.clear()
    pairs.sort()
    repeat = pairs[1:] == pairs[:-1]
    duplicates = int(repeat.sum())
    dup_examples = [bytes(k) for k in np.unique(_keys_of(pairs[1:][repeat][:64]))[:EXAMPLES]]
    unique = pairs[np.concatenate([[True], ~repeat])] if len(pairs) else pairs
    del pairs, repeat
    keys = _keys_of(unique)
    del unique
    same = keys[1:] == keys[:-1]
    conflict_keys = np.unique(keys[1:][same])
    distinct = keys[np.concatenate([[True], ~same])] if len(keys) else keys
    return KeyStats(
        rows=rows,
        duplicate_rows=duplicates,
        conflicting=int(conflict_keys.size),
        distinct=distinct,
        duplicate_examples=dup_examples,
        conflict_examples=[bytes(k) for k in conflict_keys[:EXAMPLES]],
    )


def locate(snap: snapshot.Snapshot, wanted: set[bytes]) -> Places:
    """Where the ``wanted`` keys are: (split, "shard row i (input:row)", label), reading
    only the key, label, source and row columns (for the examples of failure lines)."""
    found: dict[bytes, list[tuple[str, str, int]]] = {}
    if not wanted:
        return found
    want = np.asarray(sorted(wanted), dtype=f"S{snapshot.KEY_BYTES}")
    for shard in snap.shards:
        names = snapshot.open_shard(snap, shard).schema_arrow.names
        if "key" not in names:
            continue
        columns = [c for c in ("key", "label", "source", "row") if c in names]
        first = 0
        for batch in snapshot.iter_batches(
            snap, shard.split, batch_rows=65536, columns=columns, shards=[shard]
        ):
            keys = np.asarray(batch.column("key").to_pylist(), dtype=f"S{snapshot.KEY_BYTES}")
            for i in np.flatnonzero(np.isin(keys, want)).tolist():
                places = found.setdefault(bytes(keys[i]), [])
                if len(places) < 2 * EXAMPLES:
                    where = _where(batch, i, first, shard.path)
                    label = batch.column("label")[i].as_py() if "label" in columns else -1
                    places.append((shard.split, where, label))
            first += batch.num_rows
    return found


def _where(batch: Any, index: int, first: int, path: str) -> str:
    return f"{path} {sample_where(batch, index, first)}"


def _pair_example(places: list[tuple[str, str, int]], *, labels: bool) -> str:
    shown = places[:2]
    if labels:
        return " == ".join(f"{w} label {lbl}" for _, w, lbl in shown)
    return " == ".join(w for _, w, _ in shown)


# --------------------------------------------------------------------------- tables


def _frame(rows: list[dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(columns))


@dataclass
class Reduced:
    """Everything the suites check, and what ``summary.json`` reports."""

    tables: list[Table]
    facts: dict[str, dict[str, Any]]  # the format's facts per split
    splits: dict[str, int]  # rows
    duplicates: dict[str, dict[str, Any]]
    overlap: dict[str, int]
    key_bytes: int  # the distinct key sets held for the overlap


def _collect(
    results: Iterable[ShardResult],
) -> tuple[dict[str, _Split], dict[str, list[dict[str, Any]]]]:
    """The shards' results added up per split, and each split's rows of the shard table."""
    per_split = {s: _Split() for s in dataset.SPLITS}
    shard_rows: dict[str, list[dict[str, Any]]] = {s: [] for s in dataset.SPLITS}
    for result in results:
        split = per_split.setdefault(result.row["split"], _Split())
        split.shards += 1
        split.rows += int(result.row["rows"])
        split.counts.update(result.counts)
        split.facts.append(result.facts)
        split.pairs.append(result.pairs)
        shard_rows.setdefault(result.row["split"], []).append(result.row)
    return per_split, shard_rows


def _split_row(name: str, s: _Split, num_classes: int) -> dict[str, Any]:
    missing = [c for c in range(num_classes) if not s.counts.get(c)]
    return {
        "name": f"{name} split",
        "split": name,
        "shards": s.shards,
        "rows": s.rows,
        "rows_found": f"found {s.rows} in {s.shards} shard(s)",
        "classes_missing": len(missing),
        "classes_found": f"missing {set_text(missing)}",
    }


def _class_rows(name: str, s: _Split) -> list[dict[str, Any]]:
    return [
        {
            "name": f"{name} split",
            "split": name,
            "label": int(label),
            "count": int(count),
            "fraction": count / s.rows,
        }
        for label, count in sorted(s.counts.items())
    ]


def _duplicate_row(name: str, st: KeyStats, places: Places) -> dict[str, Any]:
    fraction = st.duplicate_rows / st.rows if st.rows else 0.0
    dups = [_pair_example(places.get(k, []), labels=False) for k in st.duplicate_examples]
    conflicts = [_pair_example(places.get(k, []), labels=True) for k in st.conflict_examples]
    return {
        "name": f"{name} split",
        "split": name,
        "rows": st.rows,
        "duplicate_rows": st.duplicate_rows,
        "duplicate_fraction": fraction,
        "duplicates_found": f"found {st.duplicate_rows} of {st.rows} rows "
        f"({fraction:.3f})" + _eg(dups, st.duplicate_rows),
        "conflicting": st.conflicting,
        "conflicts_found": f"found {st.conflicting} sample(s) under several labels"
        + _eg(conflicts, st.conflicting),
    }


def _overlap_row(a: str, b: str, shared: np.ndarray, places: Places) -> dict[str, Any]:
    examples = []
    for k in shared[:EXAMPLES]:
        where = places.get(bytes(k), [])
        first_a = next((w for s, w, _ in where if s == a), "?")
        first_b = next((w for s, w, _ in where if s == b), "?")
        examples.append(f"{first_a} == {first_b}")
    return {
        "name": f"{a} + {b} splits",
        "splits": f"{a}+{b}",
        "shared": int(shared.size),
        "shared_found": f"found {shared.size} sample(s) in both" + _eg(examples, int(shared.size)),
    }


def reduce(
    results: Iterable[ShardResult],
    snap: snapshot.Snapshot,
    fmt: DataFormat,
    num_classes: int,
) -> Reduced:
    """The aggregated tables from the shards' results (in any order)."""
    per_split, shard_rows = _collect(results)
    stats = {name: key_stats(s.pairs, s.rows) for name, s in per_split.items()}
    overlaps = {
        (a, b): np.intersect1d(stats[a].distinct, stats[b].distinct, assume_unique=True)
        for a, b in PAIRS
    }
    wanted = {k for st in stats.values() for k in st.duplicate_examples + st.conflict_examples}
    wanted |= {bytes(k) for shared in overlaps.values() for k in shared[:EXAMPLES]}
    places = locate(snap, wanted)
    key_bytes = sum(int(st.distinct.nbytes) for st in stats.values())

    columns = (*SHARD_COLUMNS, *fmt.shard_columns)
    tables = [
        Table(
            f"{s}_shards", _frame(sorted(r, key=lambda x: x["name"]), columns), "shards", ["name"]
        )
        for s, r in shard_rows.items()
    ]
    split_rows = [_split_row(name, s, num_classes) for name, s in per_split.items()]
    class_rows = [row for name, s in per_split.items() for row in _class_rows(name, s)]
    dup_rows = [_duplicate_row(name, stats[name], places) for name in per_split]
    overlap_rows = [_overlap_row(a, b, shared, places) for (a, b), shared in overlaps.items()]
    tables += [
        Table("splits", _frame(split_rows, SPLIT_COLUMNS), "splits", ["name"]),
        Table(
            "class_counts",
            _frame(class_rows, CLASS_COUNT_COLUMNS),
            "class_counts",
            ["name", "label"],
        ),
        Table("split_overlap", _frame(overlap_rows, OVERLAP_COLUMNS), "split_overlap", ["name"]),
        Table("duplicates", _frame(dup_rows, DUPLICATE_COLUMNS), "duplicates", ["name"]),
    ]
    return Reduced(
        tables=tables,
        facts={name: sum_facts(s.facts) for name, s in per_split.items()},
        splits={name: s.rows for name, s in per_split.items()},
        duplicates={
            r["split"]: {
                "rows": r["rows"],
                "duplicate_rows": r["duplicate_rows"],
                "duplicate_fraction": r["duplicate_fraction"],
                "conflicting": r["conflicting"],
            }
            for r in dup_rows
        },
        overlap={r["splits"]: r["shared"] for r in overlap_rows},
        key_bytes=key_bytes,
    )


def _eg(examples: list[str], total: int) -> str:
    if not examples:
        return ""
    more = ", ..." if total > len(examples) else ""
    return f" (e.g. {'; '.join(examples)}{more})"
