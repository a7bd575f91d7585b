"""validate: check an ingested data set with a Great Expectations suite before training.

Streams the snapshot (``components.ml.snapshot``) shard by shard and never holds a split: each
shard's sha256 is checked against ``snapshot.json`` as it is read (a corrupt or missing shard
is one line naming it and the sha256 the manifest pins), then its Arrow record batches are
added up into one row of statistics. That is a map over the shards (a process pool of
``validate.workers``; on Kubeflow a ``ParallelFor`` over shard groups: :func:`plan_groups`,
:func:`run_map`, ``run(parts=...)``), followed by a reduce. Great Expectations (an
in-memory context; nothing is sent anywhere) then checks the aggregated tables:

- ``<split>_shards``: one row per shard. The rules every format has: the shard's columns
  (``docs/data-format.md``), no nulls, labels stored as int64 and within the label set. The
  task's data format (``Task.data``) adds its own columns and rules: images
  (``components.tasks.image_data``) the pixel dtype (``validate.expected_dtype``), the
  shape (``validate.image_shape`` or the train split's), that an image holds H x W x C
  values, the pixel range (``validate.pixel_min``..``pixel_max``) and NaNs; texts
  (``components.tasks.text_data``) the type, valid UTF-8, blank texts and the length in
  characters (``validate.min_chars``..``max_chars``).
- ``splits``: the rows of each split (``validate.min_rows``..``max_rows``) and that every
  class appears in it.
- ``class_counts``: the fraction of each class per split, within
  ``validate.class_fraction_min``..``class_fraction_max``.
- ``split_overlap``: per pair of splits, the samples (keys) they share; a sample may appear
  in only one split.
- ``duplicates``: per split, the rows that repeat an earlier row exactly (same key and
  label), at most ``validate.max_duplicate_fraction`` of the split, and the samples (keys)
  stored under more than one label (none allowed).

Memory: a batch of :data:`BATCH_ROWS` rows per process, plus the key sets. Duplicates and
overlap are exact: every row contributes its 32-byte key and its 8-byte label (40 bytes),
the reduce sorts one split's pairs at a time and keeps each split's distinct keys (32
bytes a sample) for the overlap: 1.28M samples are 51 MB of pairs and 41 MB of keys; the
reduce's peak is about 120 bytes a sample (measured: 156 MB for 1.28M samples in one split).
Nothing else grows with the data set (a shard table row per shard aside).

Outputs (written atomically, also when the data fails): ``result.json`` (the Great
Expectations validation results), ``data_docs/index.html`` (the Data Docs site, readable with
no network: ``components.core.data_docs``),
``summary.json`` and ``manifest.json``. A failed expectation makes the step exit non-zero
with one readable line per broken rule, naming the shard (or split), the column, the rule,
what was expected and what was found.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from components.core.artifacts import (
    StepError,
    atomic_path,
    read_json,
    write_json,
    write_manifest,
)
from components.core.data_docs import make_offline
from components.kernel.step import DATA, Out, Step
from components.ml import dataset, snapshot
from components.tasks import Task
from components.tasks.data import (
    EXAMPLES,
    CommonValidateParams,
    DataFormat,
    Examples,
    check_format,
    sample_where,
    show,
    sum_facts,
)

# Before Great Expectations is first imported (lazily, below): no usage statistics sent anywhere.
os.environ["GX_ANALYTICS_ENABLED"] = "false"

log = logging.getLogger(__name__)

SITE_NAME = "validate"
PARTIAL_COUNT = 20  # unexpected rows Great Expectations keeps per expectation (lines shown)
BATCH_ROWS = 256  # rows per record batch read (256 RGB 224x224 images: 38 MB)
PAIR_BYTES = snapshot.KEY_BYTES + 8  # a row's key and its big-endian int64 label
LABEL_DTYPE = "int64"  # the documented stored label dtype (docs/data-format.md)

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


@dataclass(frozen=True)
class ValidateResult:
    """A validation that returns passed (a failed one raises, listing every failure)."""

    evaluated: int


# --------------------------------------------------------------------------- map: one shard


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


def _map(jobs: list[ShardJob], workers: int) -> Iterator[ShardResult]:
    """Run the jobs on a process pool (``workers`` > 1) or here, in order."""
    return snapshot.ordered_map(shard_stats, jobs, workers, "validate shards", "shard")


# --------------------------------------------------------------------------- reduce


@dataclass
class _Split:
    shards: int = 0
    rows: int = 0
    counts: Counter[int] = field(default_factory=Counter)
    facts: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[np.ndarray] = field(default_factory=list)


@dataclass
class _KeyStats:
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


def key_stats(parts: list[np.ndarray], rows: int) -> _KeyStats:
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
    return _KeyStats(
        rows=rows,
        duplicate_rows=duplicates,
        conflicting=int(conflict_keys.size),
        distinct=distinct,
        duplicate_examples=dup_examples,
        conflict_examples=[bytes(k) for k in conflict_keys[:EXAMPLES]],
    )


def _locate(snap: snapshot.Snapshot, wanted: set[bytes]) -> dict[bytes, list[tuple[str, str, int]]]:
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


@dataclass(frozen=True)
class _Table:
    name: str  # also the Data Docs asset name
    frame: pd.DataFrame
    suite: str
    index_columns: list[str]  # identify an unexpected row in messages


def _frame(rows: list[dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(columns))


@dataclass
class Reduced:
    """Everything the suites check, and what ``summary.json`` reports."""

    tables: list[_Table]
    facts: dict[str, dict[str, Any]]  # the format's facts per split
    splits: dict[str, int]  # rows
    duplicates: dict[str, dict[str, Any]]
    overlap: dict[str, int]
    key_bytes: int  # the distinct key sets held for the overlap


def reduce(
    results: Iterable[ShardResult],
    snap: snapshot.Snapshot,
    fmt: DataFormat,
    num_classes: int,
) -> Reduced:
    """The aggregated tables from the shards' results (in any order)."""
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
    stats = {name: key_stats(s.pairs, s.rows) for name, s in per_split.items()}
    overlaps = {
        (a, b): np.intersect1d(stats[a].distinct, stats[b].distinct, assume_unique=True)
        for a, b in PAIRS
    }
    wanted = {k for st in stats.values() for k in st.duplicate_examples + st.conflict_examples}
    wanted |= {bytes(k) for shared in overlaps.values() for k in shared[:EXAMPLES]}
    places = _locate(snap, wanted)
    key_bytes = sum(int(st.distinct.nbytes) for st in stats.values())

    columns = (*SHARD_COLUMNS, *fmt.shard_columns)
    tables = [
        _Table(
            f"{s}_shards", _frame(sorted(r, key=lambda x: x["name"]), columns), "shards", ["name"]
        )
        for s, r in shard_rows.items()
    ]
    split_rows, class_rows, dup_rows = [], [], []
    for name, s in per_split.items():
        missing = [c for c in range(num_classes) if not s.counts.get(c)]
        split_rows.append(
            {
                "name": f"{name} split",
                "split": name,
                "shards": s.shards,
                "rows": s.rows,
                "rows_found": f"found {s.rows} in {s.shards} shard(s)",
                "classes_missing": len(missing),
                "classes_found": f"missing {_set(missing)}",
            }
        )
        for label, count in sorted(s.counts.items()):
            class_rows.append(
                {
                    "name": f"{name} split",
                    "split": name,
                    "label": int(label),
                    "count": int(count),
                    "fraction": count / s.rows,
                }
            )
        st = stats[name]
        fraction = st.duplicate_rows / st.rows if st.rows else 0.0
        dups = [_pair_example(places.get(k, []), labels=False) for k in st.duplicate_examples]
        conflicts = [_pair_example(places.get(k, []), labels=True) for k in st.conflict_examples]
        dup_rows.append(
            {
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
        )
    overlap_rows = []
    for (a, b), shared in overlaps.items():
        examples = []
        for k in shared[:EXAMPLES]:
            where = places.get(bytes(k), [])
            first_a = next((w for s, w, _ in where if s == a), "?")
            first_b = next((w for s, w, _ in where if s == b), "?")
            examples.append(f"{first_a} == {first_b}")
        overlap_rows.append(
            {
                "name": f"{a} + {b} splits",
                "splits": f"{a}+{b}",
                "shared": int(shared.size),
                "shared_found": f"found {shared.size} sample(s) in both"
                + _eg(examples, int(shared.size)),
            }
        )
    tables += [
        _Table("splits", _frame(split_rows, SPLIT_COLUMNS), "splits", ["name"]),
        _Table(
            "class_counts",
            _frame(class_rows, CLASS_COUNT_COLUMNS),
            "class_counts",
            ["name", "label"],
        ),
        _Table("split_overlap", _frame(overlap_rows, OVERLAP_COLUMNS), "split_overlap", ["name"]),
        _Table("duplicates", _frame(dup_rows, DUPLICATE_COLUMNS), "duplicates", ["name"]),
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


# --------------------------------------------------------------------------- suites


def _shard_expectations(fmt: DataFormat, num_classes: int) -> list[Any]:
    """The rules every format's shards have (the format adds its own)."""
    import great_expectations.expectations as gxe

    classes = _set(range(num_classes))
    names = ", ".join(fmt.arrow_schema().names)
    return [
        gxe.ExpectColumnValuesToBeInSet(
            column="schema",
            value_set=["ok"],
            description="shard columns",
            meta={
                "column": "schema",
                "rule": f"a shard's columns must be {names} (docs/data-format.md)",
                "found": "schema_found",
            },
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="nulls",
            max_value=0,
            description="no nulls",
            meta={"rule": "values must not be null", "found": "nulls_found"},
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="label_dtype",
            value_set=[LABEL_DTYPE],
            description="label dtype",
            meta={
                "column": "label",
                "rule": f"labels must be stored as {LABEL_DTYPE}",
                "found": "label_dtype_found",
            },
        ),
        *[
            gxe.ExpectColumnValuesToBeBetween(
                column=column,
                min_value=0,
                max_value=num_classes - 1,
                description="label set",
                meta={"column": "label", "rule": f"values must be in {classes}", "found": found},
            )
            for column, found in (("label_min", "label_found"), ("label_max", "label_found"))
        ],
    ]


def _split_expectations(params: CommonValidateParams) -> list[Any]:
    import great_expectations.expectations as gxe

    bounds = {"min_value": params.min_rows, "max_value": params.max_rows}
    return [
        gxe.ExpectColumnValuesToBeBetween(
            column="rows",
            **bounds,
            description="row count per split",
            meta={"rule": f"row count per split must be {_range(bounds)}", "found": "rows_found"},
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="classes_missing",
            max_value=0,
            description="every class present",
            meta={"column": "label", "rule": "every class must appear", "found": "classes_found"},
        ),
    ]


def _class_count_expectations(params: CommonValidateParams) -> list[Any]:
    import great_expectations.expectations as gxe

    bounds = {"min_value": params.class_fraction_min, "max_value": params.class_fraction_max}
    return [
        gxe.ExpectColumnValuesToBeBetween(
            column="fraction",
            **bounds,
            description="class balance",
            meta={"rule": f"each class must make up a fraction {_range(bounds)} of the split"},
        )
    ]


def _overlap_expectations() -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnValuesToBeBetween(
            column="shared",
            max_value=0,
            description="no leakage",
            meta={
                "column": "key",
                "rule": "a sample may appear in only one split",
                "found": "shared_found",
            },
        )
    ]


def _duplicate_expectations(params: CommonValidateParams, fmt: DataFormat) -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnValuesToBeBetween(
            column="duplicate_fraction",
            min_value=0,
            max_value=params.max_duplicate_fraction,
            description="duplicate rows",
            meta={
                "rule": f"at most {show(params.max_duplicate_fraction)} of a split's rows may "
                f"be exact duplicates ({fmt.duplicate_rule}) of another row",
                "found": "duplicates_found",
            },
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="conflicting",
            max_value=0,
            description="one label per sample",
            meta={
                "column": "label",
                "rule": f"identical {fmt.sample_noun}s (same key) must have one label",
                "found": "conflicts_found",
            },
        ),
    ]


def _context(docs_dir: Path) -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
        data_docs_sites={
            SITE_NAME: {
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(docs_dir),
                },
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            }
        },
    )
    return gx.get_context(project_config=config, mode="ephemeral")


def _run_suites(
    tables: list[_Table], suites: dict[str, list[Any]], docs_dir: Path
) -> list[tuple[_Table, Any]]:
    """Validate every table against its suite; build the Data Docs site into ``docs_dir``."""
    import great_expectations as gx

    context = _context(docs_dir)
    source = context.data_sources.add_pandas("ingested")
    gx_suites = {}
    for name, expectations in suites.items():
        suite = context.suites.add(gx.ExpectationSuite(name=name))
        for expectation in expectations:
            suite.add_expectation(expectation)
        gx_suites[name] = suite
    results = []
    for table in tables:
        batch = source.add_dataframe_asset(table.name).add_batch_definition_whole_dataframe("all")
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=table.name, data=batch, suite=gx_suites[table.suite])
        )
        result = definition.run(
            batch_parameters={"dataframe": table.frame},
            result_format={
                "result_format": "SUMMARY",
                "partial_unexpected_count": PARTIAL_COUNT,
                "unexpected_index_column_names": table.index_columns,
            },
        )
        results.append((table, result))
    context.build_data_docs(site_names=[SITE_NAME])
    make_offline(docs_dir)  # no CDN: the pages and the index's tables read with no network
    return results


# --------------------------------------------------------------------------- messages


def _set(values: Iterable[Any]) -> str:
    vals = list(values)
    ints = [v for v in vals if isinstance(v, int | np.integer) and not isinstance(v, bool)]
    if len(ints) == len(vals) >= 3 and sorted(ints) == list(range(min(ints), max(ints) + 1)):
        return f"{{{min(ints)}..{max(ints)}}}"
    return "{" + ", ".join(show(v) for v in vals) + "}"


def _range(kwargs: dict[str, Any]) -> str:
    lo, hi = kwargs.get("min_value"), kwargs.get("max_value")
    if lo is None:
        return f"<= {show(hi)}"
    if hi is None:
        return f">= {show(lo)}"
    return f"within [{show(lo)}, {show(hi)}]"


def _rule(kind: str, kwargs: dict[str, Any], description: str | None) -> str:
    if kind == "expect_column_values_to_be_in_set":
        return f"values must be in {_set(kwargs['value_set'])}"
    if kind == "expect_column_values_to_be_between":
        return f"values must be {_range(kwargs)}"
    return f"{description or kind} failed"


def _int_like(value: Any) -> Any:
    """Great Expectations returns index values as strings when index columns mix types."""
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def describe_failure(table: _Table, result: Any) -> list[str]:
    """Readable line(s) for one failed expectation: one per shard (or split) it failed on,
    naming it, the column, the rule, what was expected and what was found."""
    config = result.expectation_config
    kwargs, meta = dict(config.kwargs), dict(config.meta or {})
    res = result.result or {}
    column = meta.get("column") or kwargs.get("column")
    where = f"column '{column}'" if column else "table"
    info = result.exception_info or {}
    if info.get("raised_exception"):
        first = str(info.get("exception_message") or "unknown error").strip().splitlines()
        return [
            f"{table.name}: {where}: {config.description}: could not be evaluated "
            f"({first[0] if first else 'unknown error'})"
        ]
    rule = meta.get("rule") or _rule(config.type, kwargs, config.description)
    rows = list(res.get("partial_unexpected_index_list") or [])
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_name.setdefault(str(row.get("name")), []).append(row)
    lines = []
    for name, name_rows in by_name.items():
        if meta.get("found"):
            lines.append(f"{name}: {where}: {rule}; {_found(table, name, meta['found'], column)}")
        else:  # several rows per name (class_counts): "label 3: 0.61"
            shown = [
                f"label {show(_int_like(r.get('label')))}: {show(_value(table, r, column))}"
                for r in name_rows[:EXAMPLES]
            ]
            more = ", ..." if len(name_rows) > EXAMPLES else ""
            lines.append(
                f"{name}: {where}: {rule}; found {len(name_rows)} class(es) outside "
                f"(e.g. {'; '.join(shown)}{more})"
            )
    total = int(res.get("unexpected_count") or 0)
    if total > len(rows):
        lines.append(f"{table.name}: {where}: {rule}; and {total - len(rows)} more")
    return lines or [f"{table.name}: {where}: {rule}; found {total} unexpected"]


def _found(table: _Table, name: str, column: str, checked: Any) -> str:
    match = table.frame[table.frame["name"] == name]
    if match.empty:
        return "found ?"
    text = match.iloc[0][column]
    return str(text) if isinstance(text, str) and text else f"found {match.iloc[0][checked]}"


def _value(table: _Table, row: dict[str, Any], column: Any) -> Any:
    match = table.frame[
        (table.frame["name"] == row.get("name"))
        & (table.frame["label"] == _int_like(row.get("label")))
    ]
    return match.iloc[0][column] if not match.empty else "?"


# --------------------------------------------------------------------------- step


def _checked_run(
    tables: list[_Table], suites: dict[str, list[Any]], docs_dir: Path
) -> list[tuple[_Table, Any]]:
    """:func:`_run_suites`, with any Great Expectations error as one readable line."""
    try:
        return _run_suites(tables, suites, docs_dir)
    except StepError:
        raise
    except Exception as exc:  # no Great Expectations traceback reaches the user
        log.debug("great_expectations failed", exc_info=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise StepError(
            f"validate: Great Expectations failed: {type(exc).__name__}: {first}"
        ) from exc


def _count(results: list[tuple[_Table, Any]]) -> tuple[int, int, list[str]]:
    """Expectations evaluated, how many failed, and the readable lines (each once)."""
    evaluated, failed, lines = 0, 0, []
    for table, result in results:
        for expectation in result.results:
            evaluated += 1
            if not expectation.success:
                failed += 1
                lines += [x for x in describe_failure(table, expectation) if x not in lines]
    return evaluated, failed, lines


def _jobs(
    params: CommonValidateParams, fmt: DataFormat, snap: snapshot.Snapshot, num_classes: int
) -> list[ShardJob]:
    return [ShardJob(fmt, params, num_classes, str(snap.root), s) for s in snap.shards]


# ---------------------------------------------------------------- map / reduce on an orchestrator
# On one machine ``run`` maps the shards on a process pool (``validate.workers``) and
# reduces. An orchestrator spreads the map over nodes instead: ``plan_groups`` names the
# groups, ``run_map`` adds up one group's shards into a part, and ``run`` with ``parts``
# reduces the parts (the KFP DAG: a ParallelFor over the groups, then the reduce).

PART_FILE = "part.json"
PART_ARRAYS = "part.npz"


def plan_groups(params: CommonValidateParams, data_dir: str | Path) -> list[str]:
    """``"i/n"`` for each of the ``n`` shard groups (``validate.workers``, at most one per
    shard)."""
    return snapshot.groups(min(int(params.workers), len(snapshot.load(data_dir).shards)))


def run_map(
    params: CommonValidateParams,
    task: Task,
    data_dir: str | Path,
    group: str,
    out_dir: str | Path,
) -> int:
    """Add up the shards of ``group`` (every n-th shard, from the i-th) of the snapshot in
    ``data_dir`` into a part in ``out_dir``. Returns how many shards it read."""
    index, count = snapshot.parse_group(group, "validate")
    fmt = task.data
    snap = snapshot.load(data_dir)
    check_format(data_dir, fmt, task.name)
    jobs = _jobs(params, fmt, snap, len(dataset.read_label_names(data_dir)))
    mine = [(i, job) for i, job in enumerate(jobs) if i % count == index]
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        docs, arrays = [], {}
        for (position, job), result in zip(mine, _map([j for _, j in mine], 1), strict=True):
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
        write_json(tmp / PART_FILE, {"snapshot": snap.sha256, "shards": docs})
        with open(tmp / PART_ARRAYS, "wb") as fh:
            np.savez(fh, **arrays)
    log.info("validate group %s: %d of %d shards", group, len(mine), len(jobs))
    return len(mine)


def _read_parts(parts: Sequence[Path], snap: snapshot.Snapshot) -> Iterator[ShardResult]:
    """The shards' results written by :func:`run_map`; every shard exactly once."""
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


def run(
    params: CommonValidateParams,
    task: Task,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    parts: Sequence[str | Path] | None = None,
) -> ValidateResult:
    """Validate the snapshot in ``data_dir`` with the rules of ``task``'s data format
    (``params`` is the validate section as that format reads it); write the results to
    ``out_dir``. With ``parts`` (what :func:`run_map` wrote for every group) the shards are
    not read here, only reduced.

    Raises ``StepError`` listing every broken expectation after the outputs are written.
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    fmt = task.data
    snap = snapshot.load(data_dir)
    names = dataset.read_label_names(data_dir)
    check_format(data_dir, fmt, task.name)
    if parts is not None:
        results: Iterable[ShardResult] = _read_parts([Path(p) for p in parts], snap)
    else:
        results = _map(_jobs(params, fmt, snap, len(names)), params.workers)
    reduced = reduce(results, snap, fmt, len(names))
    format_rules, facts = fmt.shard_expectations(params, reduced.facts)
    log.info(
        "validating %d shards %s (%s data %s), %d classes; key sets %.1f MB",
        len(snap.shards),
        reduced.splits,
        fmt.name,
        facts,
        len(names),
        reduced.key_bytes / 2**20,
    )
    suites = {
        "shards": _shard_expectations(fmt, len(names)) + format_rules,
        "splits": _split_expectations(params),
        "class_counts": _class_count_expectations(params),
        "split_overlap": _overlap_expectations(),
        "duplicates": _duplicate_expectations(params, fmt),
    }
    for split, dup in reduced.duplicates.items():
        log.info(
            "%s: %d of %d rows are exact duplicates (%.4f), %d sample(s) under several labels",
            split,
            dup["duplicate_rows"],
            dup["rows"],
            dup["duplicate_fraction"],
            dup["conflicting"],
        )

    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        results_ge = _checked_run(reduced.tables, suites, (tmp / "data_docs").resolve())
        evaluated, failed, lines = _count(results_ge)
        success = not failed
        write_json(
            tmp / "result.json",
            {"success": success, "validation_results": [r.to_json_dict() for _, r in results_ge]},
        )
        write_json(
            tmp / "summary.json",
            {
                "success": success,
                "evaluated": evaluated,
                "failed": failed,
                "failures": lines,
                "format": fmt.name,
                **facts,
                "snapshot_sha256": snap.sha256,
                "shards": len(snap.shards),
                "splits": reduced.splits,
                "rows": {t.name: len(t.frame) for t in reduced.tables},
                "duplicates": reduced.duplicates,
                "overlap": reduced.overlap,
                "key_set_bytes": reduced.key_bytes,
                "data_docs": "data_docs/index.html",
            },
        )
        write_manifest(
            tmp,
            "validate",
            inputs={
                snapshot.SNAPSHOT_FILE: data_dir / snapshot.SNAPSHOT_FILE,
                "labels.json": data_dir / "labels.json",
            },
            outputs={
                "result.json": tmp / "result.json",
                "summary.json": tmp / "summary.json",
                "data_docs": tmp / "data_docs",
            },
            params=asdict(params),
            extra={
                "success": success,
                "evaluated": evaluated,
                "failed": failed,
                "snapshot_sha256": snap.sha256,
                "shards_verified": len(snap.shards),
            },
        )
    log.info(
        "validate: %d expectations evaluated, %d failed; Data Docs at %s",
        evaluated,
        failed,
        out_dir / "data_docs" / "index.html",
    )
    if not success:
        raise StepError(
            f"data validation failed ({failed} of {evaluated} expectations; details in "
            f"{out_dir / 'summary.json'}):\n" + "\n".join(f"  - {f}" for f in lines)
        )
    return ValidateResult(evaluated=evaluated)


STEP = Step(
    name="validate",
    doc=__doc__,
    params=None,
    params_of_task=lambda task: task.data.validate_params,
    sections=("task", "validate"),
    run=run,
    inputs=(DATA,),
    outputs=(
        Out("report", "outputs/validate", "out_dir", help="summary, suites, Data Docs"),
        Out("data_docs", "", "", kfp="HTML", derived_from=("report", "data_docs/index.html")),
    ),
)
