"""Data snapshots: stable splits, content-addressed Parquet shards, streaming reads.

An ingested data set (``outputs/ingest``) is a *snapshot*:

- ``snapshot.json``: the manifest. The shards (path, sha256, rows, split, per-class counts,
  the input unit they came from), counts per split and class, the per-class deviation from
  the configured split fractions, the input units (their files' combined sha256) and the
  split rule.
- ``shards/<unit key>-<split>-<n>.parquet``: bounded-size Apache Parquet files. Every row is
  one sample: ``key`` (32 bytes: the sample's identity, a sha256), ``label`` (int64),
  ``source`` (the input file it came from) and ``row`` (its place there), plus the data
  format's own columns (images: ``image`` raw uint8 bytes with ``height``, ``width``,
  ``channels``; texts: ``text``). pandas, DuckDB, Spark, Ray and Hugging Face datasets read
  them as they are (``docs/data-format.md``).
- ``labels.json``: class names and the data format.

A sample's split is a pure function of its identity (:func:`stable_split`): adding or
removing data never moves an existing sample to another split, and identical samples (equal
keys) always share one. Shards are named by their unit's key: a sha256 over the unit's input
files, the decode parameters and the split rule, so an unchanged input file keeps its shards
byte for byte from one snapshot to the next (ingest links them instead of decoding again) and
DVC stores them once.

Readers never load a split whole: :func:`iter_batches` yields Arrow record batches shard by
shard, row group by row group; :func:`split_keys` reads only the key column.

Library layer: imported by steps and tasks, imports no step.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import StepError, combined_sha256, read_json, sha256_file, write_json
from components.faults import failpoints

SPLITS = ("train", "val", "test")
SNAPSHOT_FILE = "snapshot.json"
SHARD_DIR = "shards"
FORMAT_VERSION = 1
KEY_BYTES = 32
BASE_FIELDS = ("key", "label", "source", "row")  # every shard's first columns


# --------------------------------------------------------------------------- the split rule


@dataclass(frozen=True)
class SplitRule:
    """How samples are assigned to splits.

    ``hash`` (default): by the sample's identity alone: the first 8 bytes of its key as a
    number in [0, 1) below ``test_fraction`` is test, below ``test + val`` is val, else train.
    Stable under growth. ``permutation``: the old seeded permutation per class over all
    samples: reproduces splits made before snapshots, but **moves samples between splits
    whenever the data grows** (documented, kept for old pipelines only)."""

    method: str = "hash"
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    seed: int = 42  # permutation only

    def doc(self) -> dict[str, Any]:
        out = asdict(self)
        if self.method == "hash":
            out.pop("seed")
        return out


def unit_interval(keys: np.ndarray) -> np.ndarray:
    """Each key's position in [0, 1): its first 8 bytes, big-endian, over 2**64."""
    arr = np.frombuffer(b"".join(keys), dtype=">u8").reshape(len(keys), KEY_BYTES // 8)[:, 0]
    return arr.astype(np.float64) / 2.0**64


def stable_split(keys: Sequence[bytes], rule: SplitRule) -> np.ndarray:
    """The split (an index into :data:`SPLITS`) of each key under the ``hash`` rule."""
    if not len(keys):
        return np.zeros(0, dtype=np.int8)
    u = unit_interval(np.asarray(keys, dtype=object))
    out = np.zeros(len(keys), dtype=np.int8)  # train
    out[u < rule.test_fraction + rule.val_fraction] = 1  # val
    out[u < rule.test_fraction] = 2  # test
    return out


# --------------------------------------------------------------------------- the manifest


@dataclass(frozen=True)
class Shard:
    path: str  # relative to the snapshot directory
    sha256: str
    rows: int
    bytes: int
    split: str
    unit: str  # the input unit it was written from
    counts: dict[str, int] = field(default_factory=dict)  # label id (str) -> rows
    unit_key: str = ""  # the unit's content address (what names the shard)


@dataclass
class Snapshot:
    """A snapshot's manifest (``snapshot.json``) and where it lives."""

    root: Path
    doc: dict[str, Any]

    @property
    def shards(self) -> list[Shard]:
        return [Shard(**s) for s in self.doc["shards"]]

    def split_shards(self, split: str) -> list[Shard]:
        return [s for s in self.shards if s.split == split]

    def rows(self, split: str) -> int:
        return sum(s.rows for s in self.split_shards(split))

    def split_sha256(self, split: str) -> str:
        """One sha256 over the shards of ``split`` (names and contents)."""
        return combined_sha256({s.path: s.sha256 for s in self.split_shards(split)})

    @property
    def sha256(self) -> str:
        """The manifest's own hash: the snapshot's identity in lineage tags."""
        return sha256_file(self.root / SNAPSHOT_FILE)

    @property
    def data_format(self) -> str:
        return str(self.doc.get("data_format", "image"))

    def path(self, shard: Shard) -> Path:
        return self.root / shard.path


def load(data_dir: str | Path) -> Snapshot:
    """The snapshot in ``data_dir``; a missing or unreadable manifest is one readable line."""
    root = Path(data_dir)
    path = root / SNAPSHOT_FILE
    if root.exists() and not root.is_dir():
        raise StepError(f"{root}: is a file, not an ingested data set directory (run ingest)")
    if not path.is_file():
        raise StepError(
            f"{path}: no snapshot manifest (run ingest; data sets written before snapshots "
            "must be ingested again)"
        )
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("shards"), list):
        raise StepError(f"{path}: field 'shards' must be a list of shards")
    if doc.get("format_version") != FORMAT_VERSION:
        raise StepError(
            f"{path}: field 'format_version' is {doc.get('format_version')!r}, this code reads "
            f"{FORMAT_VERSION}; run ingest again"
        )
    return Snapshot(root, doc)


def write_manifest(root: Path, doc: dict[str, Any]) -> Path:
    return write_json(root / SNAPSHOT_FILE, {"format_version": FORMAT_VERSION, **doc})


# --------------------------------------------------------------------------- writing shards


@dataclass(frozen=True)
class ShardLimits:
    shard_max_mb: float = 64.0  # a shard file is closed past this many MB of sample bytes
    row_group_mb: float = 4.0  # rows are flushed as a Parquet row group past this
    compression: str = "zstd"  # Parquet codec: none | snappy | zstd | gzip


class ShardWriter:
    """Write one unit's rows of one split as bounded Parquet shards, atomically each."""

    def __init__(
        self,
        out_dir: Path,
        name: str,
        schema: Any,
        limits: ShardLimits,
        split: str,
        unit: str,
    ) -> None:
        self.out_dir, self.name, self.schema = out_dir, name, schema
        self.limits, self.split, self.unit = limits, split, unit
        self.done: list[Shard] = []
        self._writer: Any = None
        self._tmp: Path | None = None
        self._pending: list[Any] = []
        self._pending_bytes = 0
        self._file_bytes = 0
        self._rows = 0
        self._counts: dict[str, int] = {}

    def add(self, batch: Any) -> None:
        """Append a ``pyarrow.RecordBatch`` of this split's rows; a row group never holds
        more than about ``row_group_mb`` MB, however large the batch."""
        if batch.num_rows == 0:
            return
        limit = self.limits.row_group_mb * 2**20
        per_row = max(1, batch.nbytes // batch.num_rows)
        step = max(1, int(limit // per_row))
        for start in range(0, batch.num_rows, step):
            part = batch.slice(start, step)
            self._pending.append(part)
            self._pending_bytes += part.num_rows * per_row
            if self._pending_bytes >= limit:
                self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._pending:
            return
        table = pa.Table.from_batches(self._pending, schema=self.schema)
        self._pending, self._pending_bytes = [], 0
        if self._writer is None:
            self._tmp = self.out_dir / f".{self.name}-{len(self.done):04d}.{os.getpid()}.tmp"
            codec = None if self.limits.compression == "none" else self.limits.compression
            self._writer = pq.ParquetWriter(
                self._tmp,
                self.schema,
                compression=codec,
                write_statistics=["label", "row"],
                use_dictionary=_dictionary_columns(self.schema),
            )
        self._writer.write_table(table, row_group_size=table.num_rows)
        self._rows += table.num_rows
        self._file_bytes += table.nbytes
        labels, counts = np.unique(int64s(table.column("label")), return_counts=True)
        for label, count in zip(labels, counts, strict=True):
            self._counts[str(int(label))] = self._counts.get(str(int(label)), 0) + int(count)
        if self._file_bytes >= self.limits.shard_max_mb * 2**20:
            self._close()

    def _close(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        assert self._tmp is not None
        final = self.out_dir / f"{self.name}-{len(self.done):04d}.parquet"
        os.replace(self._tmp, final)
        self.done.append(
            Shard(
                path=f"{SHARD_DIR}/{final.name}",
                sha256=sha256_file(final),
                rows=self._rows,
                bytes=final.stat().st_size,
                split=self.split,
                unit=self.unit,
                counts=dict(sorted(self._counts.items(), key=lambda kv: int(kv[0]))),
            )
        )
        self._writer, self._tmp = None, None
        self._rows, self._file_bytes, self._counts = 0, 0, {}

    def close(self) -> list[Shard]:
        self._flush()
        self._close()
        return self.done


def _dictionary_columns(schema: Any) -> list[str]:
    """Columns worth a Parquet dictionary: not the binary ones (keys, pixels: all distinct,
    so building a dictionary for them is work thrown away)."""
    import pyarrow as pa

    binary = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary)
    return [f.name for f in schema if not any(test(f.type) for test in binary)]


def link_or_copy(src: Path, dest: Path) -> None:
    """Reuse a shard of the previous snapshot: a hard link where possible (same bytes, no
    copy), else a copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


# --------------------------------------------------------------------------- reading


def open_shard(snap: Snapshot, shard: Shard) -> Any:
    """A ``ParquetFile`` for ``shard``: missing, truncated or unreadable shards are one line
    naming the shard and the sha256 the manifest pins."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = snap.path(shard)
    failpoints.hit(f"snapshot.open.{shard.split}", str(path))
    if not path.is_file():
        raise StepError(
            f"{path}: shard missing (snapshot.json pins sha256 {shard.sha256}); run "
            "`dvc pull` or ingest again"
        )
    size = path.stat().st_size
    if size != shard.bytes:
        raise StepError(
            f"{path}: shard is {size} bytes, snapshot.json pins {shard.bytes} bytes with "
            f"sha256 {shard.sha256}: it is corrupt; run `dvc pull` or ingest again"
        )
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise StepError(
            f"{path}: not a readable Parquet shard ({exc}); snapshot.json pins sha256 "
            f"{shard.sha256}"
        ) from exc


def verify(snap: Snapshot, shards: Iterable[Shard] | None = None) -> None:
    """Check every shard's sha256 against the manifest (one line for the first that fails)."""
    for shard in snap.shards if shards is None else shards:
        path = snap.path(shard)
        if not path.is_file():
            open_shard(snap, shard)
        got = sha256_file(path)
        if got != shard.sha256:
            raise StepError(
                f"{path}: shard sha256 is {got}, snapshot.json pins {shard.sha256}: it is "
                "corrupt; run `dvc pull` or ingest again"
            )


def iter_batches(
    data_dir: str | Path | Snapshot,
    split: str,
    *,
    batch_rows: int = 1024,
    columns: Sequence[str] | None = None,
    shards: Sequence[Shard] | None = None,
) -> Iterator[Any]:
    """Arrow record batches of ``split`` in manifest order, never more than one row group
    of one shard in memory."""
    import pyarrow as pa

    snap = data_dir if isinstance(data_dir, Snapshot) else load(data_dir)
    for shard in snap.split_shards(split) if shards is None else shards:
        pf = open_shard(snap, shard)
        try:
            yield from pf.iter_batches(
                batch_size=batch_rows, columns=list(columns) if columns else None
            )
        except (pa.ArrowException, OSError) as exc:
            raise StepError(
                f"{snap.path(shard)}: cannot read the Parquet shard ({exc}); snapshot.json "
                f"pins sha256 {shard.sha256}"
            ) from exc


def split_keys(data_dir: str | Path | Snapshot, splits: Sequence[str]) -> np.ndarray:
    """The keys of ``splits`` as a sorted ``|S32`` array (only the key column is read)."""
    parts = [
        np.asarray(batch.column("key").to_pylist(), dtype=f"S{KEY_BYTES}")
        for split in splits
        for batch in iter_batches(data_dir, split, batch_rows=65536, columns=["key"])
    ]
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=f"S{KEY_BYTES}")


def write_keys(path: Path, keys: np.ndarray) -> Path:
    """A key set as a file (``.npy``, sorted ``|S32``): what a version records it trained on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        np.save(fh, np.sort(keys.astype(f"S{KEY_BYTES}")), allow_pickle=False)
    return path


def read_keys(path: Path) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise StepError(f"{path}: not a key set (.npy of |S{KEY_BYTES}) ({exc})") from exc
    if arr.dtype != np.dtype(f"S{KEY_BYTES}") or arr.ndim != 1:
        raise StepError(f"{path}: expected a 1-d |S{KEY_BYTES} array, got {arr.dtype} {arr.shape}")
    return arr


def subset(
    data_dir: str | Path, dest: str | Path, splits: Sequence[str], *, copy: bool = True
) -> Snapshot:
    """A snapshot of only ``splits`` of ``data_dir`` (its shards copied or linked, its
    ``labels.json`` and a manifest of those shards): what is logged as a pinned holdout."""
    snap = load(data_dir)
    dest = Path(dest)
    (dest / SHARD_DIR).mkdir(parents=True, exist_ok=True)
    kept = [s for s in snap.shards if s.split in splits]
    for shard in kept:
        (shutil.copyfile if copy else link_or_copy)(snap.path(shard), dest / shard.path)
    shutil.copyfile(snap.root / "labels.json", dest / "labels.json")
    skip = ("shards", "format_version", "counts", "totals", "split_deviation", "units")
    doc = {k: v for k, v in snap.doc.items() if k not in skip}
    doc["shards"] = [asdict(s) for s in kept]
    doc["counts"] = {k: v for k, v in snap.doc.get("counts", {}).items() if k in splits}
    doc["totals"] = {k: v for k, v in snap.doc.get("totals", {}).items() if k in splits}
    doc["subset_of"] = {"sha256": snap.sha256, "splits": list(splits)}
    write_manifest(dest, doc)
    return load(dest)


def groups(count: int) -> list[str]:
    """``"i/n"`` names of ``count`` map groups (an orchestrator's fan-out over units or
    shards: group ``i`` takes every n-th item from the i-th)."""
    return [f"{i}/{count}" for i in range(max(1, count))]


def parse_group(group: str, what: str) -> tuple[int, int]:
    """``(i, n)`` of a :func:`groups` name; anything else is one line naming ``what``."""
    try:
        index, count = (int(x) for x in group.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise StepError(f"{what} group {group!r}: expected i/n with 0 <= i < n")
    return index, count


def _pool_worker_init(parent: int, step: str) -> None:
    """A pool worker's first act: die with the process that started it (``PR_SET_PDEATHSIG``),
    so a SIGKILLed step leaves no worker behind; exit at once when that process is already
    gone (it died before the request). Failpoints armed for ``step`` hold here too."""
    from components.core import children

    children.die_with_parent()
    if os.getppid() != parent:
        os._exit(1)
    failpoints.set_step(step)


def int64s(column: Any) -> np.ndarray:
    """An int64 Arrow column (chunked or not) as numpy, read from its buffers (``to_numpy``
    imports pandas: 0.3 s in every pool worker)."""
    chunks = getattr(column, "chunks", [column])
    parts = [
        np.frombuffer(c.buffers()[1], dtype=np.int64)[c.offset : c.offset + len(c)] for c in chunks
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _warm(modules: Sequence[str]) -> None:
    """A pool worker's first job when the pool is started ahead: import what its jobs need."""
    import importlib

    for name in modules:
        importlib.import_module(name)


class WorkerPool:
    """A spawned process pool for :meth:`map` (the local form of an orchestrator's fan-out),
    started at its first map or ahead of it (:meth:`start`: while the caller still lists and
    stats its inputs, the workers start and import ``modules``). With ``workers`` <= 1, or a
    single job and no pool started, the jobs run in this process.

    The workers die with this process (:func:`_pool_worker_init`); the pool is started, and
    its results taken, on the calling thread, which must outlive it (the parent-death signal
    follows the thread that started a worker). multiprocessing's resource tracker, started
    with the first worker, ends when the last process holding its pipe (this one and the
    workers) is gone. Leaving the ``with`` block cancels what has not started and waits."""

    def __init__(self, workers: int, modules: Sequence[str] = ()) -> None:
        self.workers = int(workers)
        self.modules = tuple(modules)
        self._pool: Any = None
        self.size = 0  # worker processes started (0: none, the work runs in this process)

    def start(self, workers: int | None = None) -> None:
        """Start ``workers`` (default: all) processes now, each importing ``modules`` first;
        a no-op when started already or when the work runs here."""
        count = min(self.workers, self.workers if workers is None else workers)
        if self._pool is not None or count <= 1:
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self._pool = ProcessPoolExecutor(
            max_workers=count,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_pool_worker_init,
            initargs=(os.getpid(), failpoints.current_step()),
        )
        self.size = count
        for _ in range(count):  # a worker is spawned per job submitted while none is idle
            self._pool.submit(_warm, self.modules)

    def map(
        self, fn: Callable[[Any], Any], jobs: Sequence[Any], desc: str, unit: str
    ) -> Iterator[Any]:
        """``fn`` over ``jobs``, results in order, with a progress bar."""
        from tqdm import tqdm

        if self._pool is None and len(jobs) > 1:
            self.start(len(jobs))
        bar = tqdm(total=len(jobs), desc=desc, unit=unit, leave=False)
        try:
            results = self._pool.map(fn, jobs) if self._pool is not None else map(fn, jobs)
            for result in results:
                bar.update()
                yield result
        finally:
            bar.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def ordered_map(
    fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int, desc: str, unit: str
) -> Iterator[Any]:
    """``fn`` over ``jobs`` in order, on a :class:`WorkerPool` of ``workers`` processes."""
    with WorkerPool(workers) as pool:
        yield from pool.map(fn, jobs, desc, unit)


def unit_key(parts: dict[str, Any]) -> str:
    """The content address of a unit's shards: sha256 over what decides their bytes."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
