"""The training input pipeline: a split of a snapshot streamed in bounded pieces.

What the train step and the tasks' fitting hooks read instead of whole splits
(docs/distributed.md, "The input pipeline"):

- **Pieces.** A *piece* is a run of at most ``piece_rows`` rows of one Parquet row group of
  one shard (:func:`piece_table`), so even a split stored as one shard is read in many bounded
  pieces. Only the shards' footers are read to plan them.
- **Epoch order.** Each epoch reads the split's pieces in an order drawn from ``(seed,
  epoch)`` (:func:`epoch_order`), the same on every rank. Data parallel: the samples in that
  order are cut into one contiguous run per rank
  (:class:`components.ml.training.distributed.EpochShare`), pieces at a cut are split, so
  the ranks read disjoint samples and the same number of steps.
- **The loader.** :class:`PieceStream` (a ``paddle.io.IterableDataset``) reads pieces (Parquet
  row group, slice, ``DataFormat.to_samples``, ``Task.preprocess``) in ``workers`` processes of
  a ``paddle.io.DataLoader`` (0: in this process). Item ``g`` of the run's sequence (every
  epoch's pieces, then its validation pieces) is read by worker ``g % workers``, and
  :class:`Reader` hands the items on by ``g``: what the model sees does not depend on the
  number of workers nor on which finishes first. In flight: ``prefetch`` items per worker.
- **Shuffle buffer.** :class:`ShuffleBuffer` holds at most ``shuffle_buffer`` preprocessed
  samples (plus the piece being added); once full it hands out blocks of samples drawn
  uniformly from it, with a generator seeded from ``(seed, epoch, rank)``. ``Task.batches``
  cuts each block into batches (a text task groups similar lengths there). Kill-and-resume is
  bit-identical: every order, draw and augmentation of an epoch follows from its seed.
- **Piece cache.** :class:`PieceCache` keeps a piece's preprocessed arrays on disk (the train
  step: ``<checkpoint_dir>/pieces``, up to ``train.cache_mb``), keyed by its shard's sha256,
  its rows and :func:`preprocessing_fingerprint`: ``Task.preprocess`` (deterministic; the
  per-batch ``Task.augment`` is not cached) runs once per piece, not every epoch, and a hit
  gives the very arrays a read would.

Memory: the buffer, one block, one piece per worker being read and ``prefetch`` items per
worker; it does not grow with the split (the piece cache is on disk, bounded by its own
setting).

:class:`TrainingData` is what ``Task.fit_preprocessing``, ``Task.pretrain`` and
``Task.soft_targets`` receive: the whole training split as streams (stored samples in
manifest order, or preprocessed shuffled batches through the same loader).

Library layer: imported by the train step and the tasks, imports no step.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import inspect
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import paddle
import paddle.io

from components.core.artifacts import StepError
from components.faults import failpoints
from components.ml.data import snapshot
from components.tasks.data import DataFormat

log = logging.getLogger(__name__)

KEY_BYTES = snapshot.KEY_BYTES
# streams of one seed's generators: the piece order, the shuffle buffer's draws, the batches
# and augmentations (numpy SeedSequence entropy: [*seed, epoch, rank, stream])
ORDER, BUFFER = 1, 2


class Task(Protocol):
    """What the streams ask of a task (:class:`components.tasks.base.Task` has it)."""

    data: DataFormat

    def preprocess(self, raw: np.ndarray) -> list[np.ndarray]: ...

    def batches(
        self, inputs: list[np.ndarray], batch_size: int, rng: np.random.Generator
    ) -> list[np.ndarray]: ...


class SampleBatch(NamedTuple):
    """Stored samples (images ``uint8 [N, H, W, C]``, texts ``object [N]``), their targets
    (int64 labels, or the format's richer targets: ``DataFormat.to_targets``) and their keys
    (``|S32``)."""

    samples: np.ndarray
    labels: np.ndarray
    keys: np.ndarray


class InputBatch(NamedTuple):
    """Preprocessed model inputs (one array per input spec), targets (int64 labels, or the
    format's richer targets) and keys (``uint8 [N, 32]``; :func:`key_strings` gives the
    ``|S32`` form)."""

    inputs: list[np.ndarray]
    labels: np.ndarray
    keys: np.ndarray


@dataclass(frozen=True)
class StreamSettings:
    """How a split is streamed (``train.shuffle_buffer``, ``piece_rows``, ``loader_workers``)."""

    shuffle_buffer: int = 2048  # samples
    piece_rows: int = 256
    workers: int = 1  # loader processes; 0: read in this process
    prefetch: int = 2  # items in flight per worker
    cache_mb: int = 0  # preprocessed pieces kept on disk (PieceCache); 0: none


def key_strings(keys: np.ndarray) -> np.ndarray:
    """``uint8 [N, 32]`` keys as a ``|S32`` array (the form of ``snapshot.split_keys``)."""
    keys = np.ascontiguousarray(keys, dtype=np.uint8).reshape(-1, KEY_BYTES)
    return keys.view(f"S{KEY_BYTES}").reshape(-1)


# --------------------------------------------------------------------------- pieces


def piece_table(snap: snapshot.Snapshot, split: str, piece_rows: int) -> np.ndarray:
    """The pieces of ``split``: ``int64 [P, 4]`` rows of (shard index in
    ``snap.split_shards(split)``, row group, first row, end row), in manifest order. Reads
    only each shard's footer; a missing, truncated or unreadable shard is one line naming it
    and its sha256."""
    if piece_rows < 1:
        raise ValueError(f"piece_rows must be >= 1, got {piece_rows}")
    rows: list[tuple[int, int, int, int]] = []
    for i, shard in enumerate(snap.split_shards(split)):
        meta = snapshot.open_shard(snap, shard).metadata
        if meta.num_rows != shard.rows:
            raise StepError(
                f"{snap.path(shard)}: {meta.num_rows} rows, snapshot.json pins {shard.rows} "
                f"rows with sha256 {shard.sha256}: it is corrupt; run `dvc pull` or ingest again"
            )
        for group in range(meta.num_row_groups):
            n = meta.row_group(group).num_rows
            rows += [(i, group, a, min(n, a + piece_rows)) for a in range(0, n, piece_rows)]
    return np.asarray(rows, dtype=np.int64).reshape(-1, 4)


def epoch_order(pieces: np.ndarray, seed: Sequence[int]) -> np.ndarray:
    """``pieces`` in the order drawn from ``seed`` (e.g. ``(train.seed, epoch)``)."""
    return pieces[np.random.default_rng([*seed, ORDER]).permutation(len(pieces))]


def cut(pieces: np.ndarray, start: int, count: int) -> np.ndarray:
    """The (sub-)pieces covering rows ``[start, start + count)`` of ``pieces`` read one after
    the other: whole pieces, and the first and last trimmed to the range."""
    sizes = pieces[:, 3] - pieces[:, 2]
    ends = np.cumsum(sizes)
    begins = ends - sizes
    keep = (ends > start) & (begins < start + count)
    out = pieces[keep].copy()
    out[:, 2] += np.maximum(0, start - begins[keep])
    out[:, 3] -= np.maximum(0, ends[keep] - (start + count))
    return out


def rows_of(pieces: np.ndarray) -> int:
    return int((pieces[:, 3] - pieces[:, 2]).sum()) if len(pieces) else 0


@dataclass(frozen=True)
class Plan:
    """What one reader reads over a run: for each epoch its training pieces (``train(epoch)``)
    then its validation pieces (the same every epoch)."""

    epochs: tuple[int, ...]
    train: Callable[[int], np.ndarray]  # epoch -> pieces of the training split
    val: np.ndarray  # pieces of the validation split ([0, 4] for none)

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        """(split, piece) in reading order."""
        for epoch in self.epochs:
            for piece in self.train(epoch):
                yield "train", piece
            for piece in self.val:
                yield "val", piece


# --------------------------------------------------------------------------- the piece cache

CACHE_FORMAT = 1  # bump when what a cached piece holds changes: older entries are never read


def _plain(value: Any, depth: int = 4) -> Any:
    """``value`` as JSON-able data for a fingerprint: data as it is, arrays by their bytes'
    sha256, other objects by their type and public attributes (``depth`` levels down; below
    that, and for models, by their type's name)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    kind = f"<{type(value).__module__}.{type(value).__qualname__}>"
    if depth <= 0:
        return kind
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value), depth - 1)
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        return {str(k): _plain(v, depth - 1) for k, v in items}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [_plain(v, depth - 1) for v in items]
    if isinstance(value, np.ndarray):
        blob = np.ascontiguousarray(value)
        data = blob.tobytes() if not blob.dtype.hasobject else repr(blob.tolist()).encode()
        digest = hashlib.sha256(data).hexdigest()
        return {"array": digest, "dtype": str(blob.dtype), "shape": list(blob.shape)}
    if isinstance(value, paddle.nn.Layer) or not hasattr(value, "__dict__"):
        return kind  # a model's fitted weights reach the fingerprint through its assets
    public = {k: v for k, v in vars(value).items() if not k.startswith("_")}
    return {"type": kind, "state": _plain(public, depth - 1)}


def _code_sha256(classes: Iterable[type]) -> str:
    """The sha256 of the code ``classes`` (and their bases) run on: every ``.py`` file of each
    top-level package that defines one (by its path in the package: the same code in another
    checkout is the same), since preprocessing calls helpers anywhere in it and a stale piece
    is worse than a cache refilled after a code change. A package installed as a library
    (site-packages) counts by its defining modules' files; its version is in
    :func:`_versions` when it is a preprocessing library."""
    files: dict[str, Path] = {}
    for cls in classes:
        for base in inspect.getmro(cls):
            top = base.__module__.split(".")[0]
            if top in ("builtins", "abc", "typing"):
                continue
            package = getattr(sys.modules.get(top), "__file__", None)
            module = getattr(sys.modules.get(base.__module__), "__file__", None)
            if package is None or module is None:
                continue
            installed = {"site-packages", "dist-packages"} & set(Path(package).parts)
            if Path(package).name == "__init__.py" and not installed:
                root = Path(package).parent
                for path in root.rglob("*.py"):
                    files[f"{top}/{path.relative_to(root).as_posix()}"] = path
            else:
                files[base.__module__] = Path(module)
    digest = hashlib.sha256()
    for name, path in sorted(files.items()):
        digest.update(name.encode() + b"\0")
        with contextlib.suppress(OSError):
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _assets_sha256(task: Task) -> str:
    """The sha256 of what the task's fitted preprocessing saves (``Task.save_assets``)."""
    save = getattr(task, "save_assets", None)
    if not callable(save):
        return ""
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix="piece-cache-assets-") as tmp:
        save(Path(tmp))
        for path in sorted(Path(tmp).rglob("*")):
            if path.is_file():
                digest.update(str(path.relative_to(tmp)).encode() + b"\0")
                digest.update(path.read_bytes())
    return digest.hexdigest()


# the libraries preprocessing runs on (image resizing, tokenizers, decoding)
PREPROCESSING_LIBRARIES = (
    "numpy",
    "paddlepaddle",
    "paddlepaddle-gpu",
    "opencv-python",
    "opencv-python-headless",
    "pillow",
    "paddlenlp",
    "pyarrow",
)


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in PREPROCESSING_LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def preprocessing_fingerprint(task: Task) -> str:
    """What ``task.preprocess`` computes from, as one sha256: the task's class and the source
    of the modules defining it and its data format, its public attributes (its options), its
    ``preprocessing_doc``, the assets its fitted preprocessing saves (a vocabulary, say) and
    the versions of the libraries preprocessing runs on (:data:`PREPROCESSING_LIBRARIES`). A
    cached piece is served only under the same fingerprint (:class:`PieceCache`)."""
    doc_fn = getattr(task, "preprocessing_doc", None)
    state = {k: v for k, v in vars(task).items() if not k.startswith("_")}
    doc = {
        "format": CACHE_FORMAT,
        "task": f"{type(task).__module__}.{type(task).__qualname__}",
        "code": _code_sha256([type(task), type(task.data)]),
        "state": _plain(state),
        "preprocessing": _plain(doc_fn()) if callable(doc_fn) else None,
        "assets": _assets_sha256(task),
        "versions": _versions(),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


class PieceCache:
    """Preprocessed pieces on disk, so preprocessing is paid once per piece, not every epoch.

    A cached piece is one uncompressed ``.npz`` (its inputs, targets and keys, exactly as
    :class:`PieceStream` made them) at ``root/<fingerprint>/<shard sha256>-<row group>-<first
    row>-<end row>.npz``: the shard's content (``snapshot.json`` pins its sha256), the rows and
    the preprocessing (:func:`preprocessing_fingerprint`) name it, so a changed shard or a
    changed preprocessing is a miss, never a stale hit. Entries are written once, atomically
    (a temporary file renamed), and never changed.

    Bounded: at most ``limit_bytes`` of entries under ``root`` (checked under a lock, so loader
    workers and ranks sharing ``root`` stay within it together). Once full, further pieces are
    read and preprocessed every epoch as without a cache; nothing is evicted (every piece is
    read once an epoch, so the first pieces kept are as good as any). :meth:`open` removes the
    entries of other fingerprints. Only deterministic preprocessing is cached:
    ``Task.augment`` runs on every batch, every epoch, after the cache."""

    LOCK, USED = ".lock", ".used-bytes"

    def __init__(self, root: Path, fingerprint: str, limit_bytes: int):
        self.root, self.fingerprint, self.limit_bytes = Path(root), fingerprint, limit_bytes
        self._full = False

    @classmethod
    def open(cls, root: Path, task: Task, limit_mb: int) -> PieceCache | None:
        """The cache of ``task``'s current preprocessing under ``root`` (None when
        ``limit_mb`` is 0); entries of any other fingerprint are removed."""
        if limit_mb <= 0:
            return None
        try:
            fingerprint = preprocessing_fingerprint(task)
        except Exception as exc:  # a task whose state cannot be fingerprinted: no cache
            log.warning("piece cache off: the preprocessing has no fingerprint (%s)", exc)
            return None
        cache = cls(Path(root), fingerprint, limit_mb * 2**20)
        cache.root.mkdir(parents=True, exist_ok=True)
        with cache._locked():
            for entry in cache.root.iterdir():
                if entry.is_dir() and entry.name != cache.fingerprint:
                    shutil.rmtree(entry, ignore_errors=True)
            (cache.root / cache.fingerprint).mkdir(exist_ok=True)
            used = cache.size()
            cache._write_used(used)
        log.info(
            "piece cache %s (fingerprint %s): %.0f of %d MB used",
            cache.root,
            cache.fingerprint[:12],
            used / 2**20,
            limit_mb,
        )
        return cache

    def path(self, shard: snapshot.Shard, piece: np.ndarray) -> Path:
        _, group, start, stop = (int(v) for v in piece)
        return self.root / self.fingerprint / f"{shard.sha256}-{group}-{start}-{stop}.npz"

    def size(self) -> int:
        """Bytes of entries under the root (every fingerprint's), counted on disk."""
        return sum(f.stat().st_size for f in self.root.glob("*/*.npz") if f.is_file())

    # the bytes in use, kept in a file beside the entries (counted by open, then added to
    # under the lock by every store: no directory walk per piece)
    def _read_used(self) -> int:
        try:
            return int((self.root / self.USED).read_text())
        except (OSError, ValueError):
            return self.size()

    def _write_used(self, used: int) -> None:
        (self.root / self.USED).write_text(str(used))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        with open(self.root / self.LOCK, "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def load(self, path: Path) -> list[np.ndarray] | None:
        """The arrays cached at ``path``, or None (not cached, or unreadable: then removed)."""
        if not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as npz:
                return [npz[f"arr_{i}"] for i in range(len(npz.files))]
        except (OSError, ValueError, KeyError) as exc:
            log.warning("piece cache: %s unreadable (%s); reading the piece again", path, exc)
            with contextlib.suppress(OSError):
                path.unlink()
            return None

    def store(self, path: Path, arrays: Sequence[np.ndarray]) -> bool:
        """Keep ``arrays`` at ``path`` if the bound allows (and they hold no objects). A cache
        that cannot be written (a full disk, its directory removed) is no error: the piece
        is read again next time."""
        if self._full or any(a.dtype.hasobject for a in arrays):
            return False
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=path.parent)
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, *arrays)
            with self._locked():
                if path.exists():
                    return True
                used, size = self._read_used(), os.path.getsize(tmp)
                if used + size > self.limit_bytes:
                    self._full = True
                    log.info(
                        "piece cache full (%d MB, train.cache_mb): further pieces are "
                        "preprocessed every epoch",
                        self.limit_bytes // 2**20,
                    )
                    return False
                os.replace(tmp, path)
                self._write_used(used + size)
                return True
        except OSError as exc:
            self._full = True
            log.warning("piece cache: cannot write %s (%s); caching stops here", path, exc)
            return False
        finally:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)


# --------------------------------------------------------------------------- reading


class _ShardFiles:
    """The last opened shard of a reader (pieces of one row group follow each other often)."""

    def __init__(self, snap: snapshot.Snapshot, shards: dict[str, list[snapshot.Shard]]):
        self.snap, self.shards = snap, shards
        self._open: tuple[str, int, Any] | None = None

    def read(self, split: str, piece: np.ndarray, columns: Sequence[str] | None) -> Any:
        """The piece's rows as one ``pyarrow.RecordBatch``."""
        import pyarrow as pa

        index, group, start, stop = (int(v) for v in piece)
        shard = self.shards[split][index]
        if self._open is None or self._open[:2] != (split, index):
            self._open = (split, index, snapshot.open_shard(self.snap, shard))
        try:
            table = self._open[2].read_row_group(group, columns=columns, use_threads=False)
        except (pa.ArrowException, OSError) as exc:
            raise StepError(
                f"{self.snap.path(shard)}: cannot read row group {group} of the Parquet shard "
                f"({exc}); snapshot.json pins sha256 {shard.sha256}"
            ) from exc
        return table.slice(start, stop - start).combine_chunks().to_batches()[0]


def _labels_keys(batch: Any, fmt: DataFormat) -> tuple[np.ndarray, np.ndarray]:
    """The batch's targets (``DataFormat.to_targets``: int64 labels unless the format has
    richer ones) and its sample keys."""
    labels = fmt.to_targets(batch)
    keys = np.frombuffer(b"".join(batch.column("key").to_pylist()), dtype=np.uint8)
    return labels, keys.reshape(-1, KEY_BYTES).copy()


class PieceStream(paddle.io.IterableDataset):
    """The items of a :class:`Plan`: ``[g, *inputs, labels, keys]`` for the ``g``-th piece
    (preprocessed by ``preprocess``), or ``[g, "error", message]`` where a piece cannot be
    read. In a loader worker only the items ``g % workers == id`` are read."""

    def __init__(
        self,
        snap: snapshot.Snapshot,
        fmt: DataFormat,
        preprocess: Callable[[np.ndarray], list[np.ndarray]],
        plan: Plan,
        cache: PieceCache | None = None,
    ):
        super().__init__()
        self.snap, self.fmt, self.preprocess, self.plan = snap, fmt, preprocess, plan
        self.cache = cache

    def _piece(
        self, files: _ShardFiles, split: str, piece: np.ndarray, columns: Sequence[str]
    ) -> list[np.ndarray]:
        """The piece's preprocessed inputs, targets and keys: from the cache, or read,
        preprocessed (and cached)."""
        path = None
        if self.cache is not None:
            path = self.cache.path(files.shards[split][int(piece[0])], piece)
            cached = self.cache.load(path)
            if cached is not None:
                return cached
        batch = files.read(split, piece, columns)
        inputs = self.preprocess(self.fmt.to_samples(batch))
        labels, keys = _labels_keys(batch, self.fmt)
        arrays = [*(np.asarray(x) for x in inputs), labels, keys]
        if self.cache is not None and path is not None:
            self.cache.store(path, arrays)
        return arrays

    def __iter__(self) -> Iterator[list[Any]]:
        info = paddle.io.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        files = _ShardFiles(self.snap, {s: self.snap.split_shards(s) for s in ("train", "val")})
        columns = ["key", "label", *(f.name for f in self.fmt.payload_fields())]
        for g, (split, piece) in enumerate(self.plan.items()):
            if g % workers != worker:
                continue
            failpoints.hit("stream.piece", f"{split} piece {g} (loader worker {worker})")
            try:
                arrays = self._piece(files, split, piece, columns)
            except StepError as exc:
                yield [g, "error", str(exc)]
                return
            yield [g, *arrays]


def _worker_init(worker_id: int) -> None:
    """A loader worker dies with the process that started it (Linux ``PR_SET_PDEATHSIG``):
    a killed rank or step leaves no worker behind (Paddle's own watchdog can miss a parent
    killed mid-message, and then waits on its pipe for ever)."""
    import os

    from components.core import children

    children.die_with_parent()
    if os.getppid() == 1:  # the parent died before we asked
        os._exit(1)


def _sigchld_handler() -> Any:
    """The process's SIGCHLD disposition before a loader replaces it (None off the main
    thread, where it cannot be restored)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.getsignal(signal.SIGCHLD)


def _restore_sigchld(previous: Any) -> None:
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL if previous is None else previous)


class Reader:
    """The items of a :class:`PieceStream` in plan order, read by ``workers`` processes of a
    ``paddle.io.DataLoader`` (0: in this process). Items that arrive early wait in a map
    until their turn (in steady state none do: the loader takes the workers in turn)."""

    def __init__(self, stream: PieceStream, workers: int, prefetch: int = 2):
        self.workers = workers
        self._sigchld: Any = None
        if workers > 0:
            self._sigchld = _sigchld_handler()
            loader = paddle.io.DataLoader(
                stream,
                batch_size=None,
                num_workers=workers,
                prefetch_factor=prefetch,
                use_shared_memory=True,
                worker_init_fn=_worker_init,
            )
            self._it: Iterator[Any] | None = iter(loader)
        else:
            self._it = iter(stream)
        self._next = 0
        self._held: dict[int, list[Any]] = {}

    def take(self, count: int) -> Iterator[InputBatch]:
        """The next ``count`` items, as batches of preprocessed inputs."""
        for _ in range(count):
            g = self._next
            while g not in self._held:
                if self._it is None:
                    raise RuntimeError("the reader is closed")
                try:
                    item = next(self._it)
                except StopIteration:
                    raise StepError(
                        f"the input pipeline ended after {g} pieces; the plan has more"
                    ) from None
                self._held[int(item[0])] = item
            item = self._held.pop(g)
            self._next += 1
            if isinstance(item[1], str):
                raise StepError(str(item[2]))
            arrays = [np.asarray(x.numpy() if hasattr(x, "numpy") else x) for x in item[1:]]
            yield InputBatch(arrays[:-2], arrays[-2], arrays[-1])

    def close(self) -> None:
        """Stop the workers (a run that stopped early leaves items unread) and give SIGCHLD
        back to whoever had it: Paddle's loader installs a handler that watches its workers,
        and left in place after they are gone it crashed the next ``subprocess.run`` of the
        process (a step that trains in-process, then runs git or a server)."""
        it, self._it = self._it, None
        self._held.clear()
        shutdown = getattr(it, "_try_shutdown_all", None)
        if callable(shutdown):
            shutdown()
        if self._sigchld is not None:
            _restore_sigchld(self._sigchld)
            self._sigchld = None


# --------------------------------------------------------------------------- shuffling


class ShuffleBuffer:
    """At most ``capacity`` samples (plus the piece being added) from which blocks are drawn
    uniformly without replacement by ``rng``. Samples are rows of a list of arrays (the
    inputs, labels and keys), kept in storage allocated once for ``capacity`` and the
    largest piece (``piece_rows``): no copy of the buffer per piece, and none when a piece
    is larger than the first (a piece larger than ``piece_rows`` moves the storage once)."""

    def __init__(self, capacity: int, rng: np.random.Generator, piece_rows: int = 1):
        if capacity < 1:
            raise ValueError(f"shuffle_buffer must be >= 1, got {capacity}")
        self.capacity, self.rng = capacity, rng
        self.piece_rows = max(1, piece_rows)
        self._store: list[np.ndarray] = []
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, arrays: Sequence[np.ndarray]) -> None:
        k = len(arrays[0])
        if not self._store:
            size = self.capacity + max(k, self.piece_rows)
            self._store = [np.empty((size, *a.shape[1:]), dtype=a.dtype) for a in arrays]
        if self._n + k > len(self._store[0]):  # a piece larger than piece_rows: move once
            size = max(self._n, self.capacity) + k
            self._store = [_moved(s, size, self._n) for s in self._store]
        for store, a in zip(self._store, arrays, strict=True):
            if a.shape[1:] != store.shape[1:]:
                raise StepError(
                    f"the task's preprocessing gave samples of shape {list(a.shape[1:])} and "
                    f"{list(store.shape[1:])}: training batches need one shape per input"
                )
            store[self._n : self._n + k] = a
        self._n += k

    def take(self, k: int) -> list[np.ndarray]:
        """``k`` samples drawn uniformly (removed from the buffer)."""
        n = self._n
        k = min(k, n)
        idx = self.rng.choice(n, size=k, replace=False)
        out = [s[idx] for s in self._store]
        holes = np.sort(idx[idx < n - k])
        tail = np.setdiff1d(np.arange(n - k, n), idx, assume_unique=True)
        for s in self._store:  # the samples left at the end fill the holes
            s[holes] = s[tail]
        self._n = n - k
        return out


def _moved(store: np.ndarray, rows: int, used: int) -> np.ndarray:
    """``store``'s first ``used`` rows in new storage of ``rows`` rows."""
    out = np.empty((rows, *store.shape[1:]), dtype=store.dtype)
    out[:used] = store[:used]
    return out


def block_size(capacity: int, batch_size: int) -> int:
    """Samples handed from the buffer to ``Task.batches`` at once: whole batches, about a
    quarter of the buffer."""
    return batch_size * max(1, capacity // (4 * batch_size))


def shuffled_batches(
    items: Iterable[InputBatch],
    task: Task,
    batch_size: int,
    capacity: int,
    buffer_rng: np.random.Generator,
    rng: np.random.Generator,
    piece_rows: int = 1,
) -> Iterator[InputBatch]:
    """Samples of ``items`` (each at most ``piece_rows`` samples) through a shuffle buffer
    of ``capacity``, cut by ``task.batches`` into batches of ``batch_size``. Every block is
    whole batches but the last; its smaller batch is moved to the end, so only the stream's
    last batch is short."""
    buffer = ShuffleBuffer(capacity, buffer_rng, piece_rows)
    block = block_size(capacity, batch_size)

    def cut_block(arrays: list[np.ndarray]) -> Iterator[InputBatch]:
        *inputs, labels, keys = arrays
        batches = task.batches(inputs, batch_size, rng)
        order = sorted(range(len(batches)), key=lambda i: len(batches[i]) != batch_size)
        for i in order:
            idx = batches[i]
            yield InputBatch([x[idx] for x in inputs], labels[idx], keys[idx])

    for item in items:
        buffer.add([*item.inputs, item.labels, item.keys])
        while len(buffer) >= max(capacity, block):
            yield from cut_block(buffer.take(block))
    while len(buffer):
        yield from cut_block(buffer.take(block))


# --------------------------------------------------------------------------- the split for a task


class TrainingData(abc.ABC):
    """The training split for a task's fitting hooks (``Task.fit_preprocessing``,
    ``Task.pretrain``, ``Task.soft_targets``):

    - :meth:`samples`: stored samples, labels and keys in manifest order;
    - :meth:`epochs`: passes of preprocessed, shuffled batches, each seeded from
      ``(*seed, epoch)``; :meth:`batches`: one such pass.
    """

    rows: int  # samples in the split

    @property
    @abc.abstractmethod
    def label_counts(self) -> dict[int, int]:
        """Samples per label id."""

    @abc.abstractmethod
    def samples(self, batch_rows: int = 1024) -> Iterator[SampleBatch]:
        """Stored samples in bounded batches, in manifest order."""

    @abc.abstractmethod
    def epochs(
        self, batch_size: int, seed: Sequence[int], count: int
    ) -> Iterator[Iterator[InputBatch]]:
        """``count`` passes over the split (consume each before asking for the next)."""

    def batches(self, batch_size: int, seed: Sequence[int]) -> Iterator[InputBatch]:
        """One pass of :meth:`epochs`."""
        for epoch in self.epochs(batch_size, seed, 1):
            yield from epoch


class SnapshotData(TrainingData):
    """The training split of a snapshot, streamed: never in memory whole. :meth:`epochs`
    reads pieces in an order drawn from ``(*seed, epoch)`` through the loader and the
    shuffle buffer (``settings``), cut by ``Task.batches``."""

    def __init__(self, snap: snapshot.Snapshot, task: Task, settings: StreamSettings):
        self.snap, self.task, self.settings = snap, task, settings
        self.rows = snap.rows("train")
        self._pieces: np.ndarray | None = None

    @property
    def label_counts(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for shard in self.snap.split_shards("train"):
            for label, n in shard.counts.items():
                out[int(label)] = out.get(int(label), 0) + int(n)
        return dict(sorted(out.items()))

    def samples(self, batch_rows: int = 1024) -> Iterator[SampleBatch]:
        fmt = self.task.data
        for batch in snapshot.iter_batches(self.snap, "train", batch_rows=batch_rows):
            labels, keys = _labels_keys(batch, fmt)
            yield SampleBatch(fmt.to_samples(batch), labels, key_strings(keys))

    def pieces(self) -> np.ndarray:
        if self._pieces is None:
            self._pieces = piece_table(self.snap, "train", self.settings.piece_rows)
        return self._pieces

    def epochs(
        self, batch_size: int, seed: Sequence[int], count: int
    ) -> Iterator[Iterator[InputBatch]]:
        pieces = self.pieces()
        plan = Plan(
            tuple(range(count)),
            lambda epoch: epoch_order(pieces, (*seed, epoch)),
            np.zeros((0, 4), dtype=np.int64),
        )
        reader = Reader(
            PieceStream(self.snap, self.task.data, self.task.preprocess, plan),
            self.settings.workers,
            self.settings.prefetch,
        )
        try:
            for epoch in range(count):
                yield shuffled_batches(
                    reader.take(len(pieces)),
                    self.task,
                    batch_size,
                    self.settings.shuffle_buffer,
                    np.random.default_rng([*seed, epoch, 0, BUFFER]),
                    np.random.default_rng([*seed, epoch, 0]),
                    self.settings.piece_rows,
                )
        finally:
            reader.close()


class ArrayData(TrainingData):
    """:class:`TrainingData` over arrays already in memory (a caller holding a small split,
    e.g. a test): the same interface, nothing streamed. Keys stand in for positions."""

    def __init__(self, task: Task, samples: np.ndarray, labels: np.ndarray | None):
        self.task = task
        self._samples = samples
        self._labels = (
            np.zeros(len(samples), dtype=np.int64) if labels is None else np.asarray(labels)
        )
        self.rows = len(samples)
        keys = np.zeros((self.rows, KEY_BYTES), dtype=np.uint8)
        keys[:, -8:] = np.arange(self.rows, dtype=">u8").view(np.uint8).reshape(-1, 8)
        self._keys = keys

    @property
    def label_counts(self) -> dict[int, int]:
        ids, counts = np.unique(self._labels, return_counts=True)
        return {int(i): int(c) for i, c in zip(ids, counts, strict=True)}

    def samples(self, batch_rows: int = 1024) -> Iterator[SampleBatch]:
        for s in range(0, self.rows, batch_rows):
            yield SampleBatch(
                self._samples[s : s + batch_rows],
                self._labels[s : s + batch_rows],
                key_strings(self._keys[s : s + batch_rows]),
            )

    def epochs(
        self, batch_size: int, seed: Sequence[int], count: int
    ) -> Iterator[Iterator[InputBatch]]:
        item = InputBatch(self.task.preprocess(self._samples), self._labels, self._keys)
        for epoch in range(count):
            yield shuffled_batches(
                [item],
                self.task,
                batch_size,
                max(1, self.rows),
                np.random.default_rng([*seed, epoch, 0, BUFFER]),
                np.random.default_rng([*seed, epoch, 0]),
                self.rows,
            )


def as_training_data(
    task: Task, data: TrainingData | np.ndarray, labels: np.ndarray | None = None
) -> TrainingData:
    """``data`` as :class:`TrainingData` (arrays of stored samples are wrapped as they are)."""
    if isinstance(data, TrainingData):
        return data
    return ArrayData(task, np.asarray(data), labels)
