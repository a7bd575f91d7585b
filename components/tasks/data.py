"""What a task's data looks like: how raw data is read, stored, split and validated.

A :class:`DataFormat` (a modality: images, texts) is owned by the tasks that read it
(``Task.data``). The ``ingest`` and ``validate`` steps ask the task for it and never look at
samples themselves, so a task with a new kind of data brings its format along and no step
changes. An ingested data set names its format in ``labels.json`` (see
``components.ml.data.dataset``) so every later step can check it holds the data its task reads.

Library layer: imported by tasks and steps, imports no step.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from components.core.artifacts import StepError
from components.core.config import params_model
from components.ml.data import dataset, snapshot
from components.ml.data.harvest import Harvested

Fraction = Annotated[float, Field(gt=0, lt=1)]  # in (0, 1)
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]  # 64 hex digits


@params_model
class SplitParams:
    """``ingest.split``: the split rule (``components.ml.data.snapshot.SplitRule``)."""

    # hash (stable under growth) | permutation (the old, unstable one)
    method: Literal["hash", "permutation"] = "hash"
    val_fraction: Fraction = 0.15
    test_fraction: Fraction = 0.15
    seed: int = 42  # permutation only
    # files (glob patterns relative to the source) whose samples all go to one split, e.g.
    # {"holdout/*": test}: a per-file split the user declares, which the rule respects
    # (the splits: components.ml.data.dataset.SPLITS)
    files: dict[str, Literal["train", "val", "test"]] = field(default_factory=dict)

    @model_validator(mode="after")
    def _leaves_train(self) -> SplitParams:
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError("val_fraction + test_fraction must leave >= 10% for train")
        return self

    def rule(self) -> snapshot.SplitRule:
        return snapshot.SplitRule(self.method, self.val_fraction, self.test_fraction, self.seed)


@params_model
class ShardParams:
    """``ingest.shards``: how big a Parquet shard and a row group get (docs/data-format.md)."""

    max_mb: float = 64.0
    row_group_mb: Annotated[float, Field(gt=0)] = 4.0
    compression: Literal["none", "snappy", "zstd", "gzip"] = "zstd"

    @model_validator(mode="after")
    def _row_group_fits(self) -> ShardParams:
        if self.row_group_mb > self.max_mb:
            raise ValueError(f"need row_group_mb <= max_mb, got {self.row_group_mb}, {self.max_mb}")
        return self

    def limits(self) -> snapshot.ShardLimits:
        return snapshot.ShardLimits(self.max_mb, self.row_group_mb, self.compression)


@dataclass(frozen=True)
class Unit:
    """A piece of the source ingest reads, hashes and shards on its own: an IDX pair, a table
    file, a run of image files. Its shards are reused while its files and the decoding
    parameters stay the same."""

    id: str  # for people: the file(s) it covers
    files: tuple[str, ...]  # input names (relative to the source) it reads
    context: tuple[tuple[str, Any], ...] = ()  # more of what decides its rows (a class id)
    rows_are_files: bool = False  # row i is the sample of files[i] (else: rows of one file)

    def where(self, row: int) -> str:
        """A sample of the unit, for messages: its file, or the unit and row."""
        if self.rows_are_files and 0 <= row < len(self.files):
            return self.files[row]
        return f"{self.id} row {row}"


@dataclass
class Skipped:
    """Input files a listing passed over, counted by reason, with one example path a reason
    (what the ingest manifest and its one log line say)."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, reason: str, path: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self.examples.setdefault(reason, path)

    def summary(self) -> str:
        """``2 extension .txt (e.g. cat/notes.txt), 1 no extension (e.g. cat/.DS_Store)``."""
        order = sorted(self.counts, key=lambda r: (-self.counts[r], r))
        return ", ".join(f"{self.counts[r]} {r} (e.g. {self.examples[r]})" for r in order)


class Units(list[Unit]):
    """A listing's units (a list), with the files it skipped (:class:`Skipped`)."""

    def __init__(self, units: Iterable[Unit] = (), skipped: Skipped | None = None) -> None:
        super().__init__(units)
        self.skipped = skipped if skipped is not None else Skipped()


def skipped_of(units: list[Unit]) -> Skipped:
    """What the listing that made ``units`` skipped (nothing, for a plain list)."""
    return units.skipped if isinstance(units, Units) else Skipped()


@dataclass
class UnitBatch:
    """Rows read from one unit: keys (a sample's identity, 32 bytes), int64 labels, the input
    file and the row within it of each sample, and the format's own columns. ``unreadable``:
    input files that could not be decoded, ``(path, reason)`` (ingest fails naming them all)."""

    keys: list[bytes]
    labels: np.ndarray
    sources: list[str]
    rows: np.ndarray
    columns: dict[str, Any]
    dropped: dict[str, int] = field(default_factory=dict)
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    # sha256 (hex) of the input files this batch read, by name, when the format hashes the
    # bytes it decodes: a unit whose batches name every one of its files is read once
    inputs: dict[str, str] | None = None

    def __len__(self) -> int:
        return len(self.keys)


@params_model
class CommonValidateParams:
    """The rules every format's ``validate`` section has (a format's params extend these)."""

    min_rows: Annotated[int, Field(ge=0)] = 10  # per split
    max_rows: int = 10_000_000  # per split
    class_fraction_min: Annotated[float, Field(ge=0)] = 0.02  # of the split, for every class
    class_fraction_max: Annotated[float, Field(le=1)] = 0.5
    # rows repeating another row of their split (same sample and label), per split
    max_duplicate_fraction: Annotated[float, Field(ge=0, le=1)] = 0.05
    # processes computing shard statistics at once (1: in this process)
    workers: Annotated[int, Field(ge=1)] = 1

    @model_validator(mode="after")
    def _common_rules(self) -> CommonValidateParams:
        if self.min_rows > self.max_rows:
            raise ValueError(f"need min_rows <= max_rows, got {self.min_rows}, {self.max_rows}")
        if self.class_fraction_min > self.class_fraction_max:
            raise ValueError(
                "need class_fraction_min <= class_fraction_max, got "
                f"{self.class_fraction_min}, {self.class_fraction_max}"
            )
        return self


class DataFormat(abc.ABC):
    """One kind of data: its ingest and validate params, readers, storage and suites."""

    name: ClassVar[str]  # recorded in labels.json ("image", "text")
    suffix: ClassVar[str]  # of a stored split file (".npz", ".jsonl")
    ingest_params: ClassVar[type]  # dataclass of params.yaml: ingest
    validate_params: ClassVar[type]  # dataclass of params.yaml: validate (extends the common)
    sample_noun: ClassVar[str] = "sample"  # in messages: "image", "text"
    duplicate_rule: ClassVar[str] = "same sample and label"  # what an exact duplicate is
    # modules a unit worker reads this format with (imported while ingest lists the source)
    reader_modules: ClassVar[tuple[str, ...]] = ()

    # ---------------------------------------------------------------- ingest

    @abc.abstractmethod
    def units(self, params: Any, params_file: str) -> list[Unit]:
        """The source's units, in a stable order (listing only: nothing is decoded); a
        :class:`Units` when the listing skipped files (counted in the ingest manifest)."""

    @abc.abstractmethod
    def unit_inputs(self, params: Any, unit: Unit) -> dict[str, str]:
        """sha256 of each input of ``unit`` (its raw bytes), keyed by :meth:`input_names`."""

    def input_names(self, params: Any, unit: Unit) -> tuple[str, ...]:
        """The names of the unit's inputs, as :meth:`unit_inputs`, :meth:`input_path` and
        ``UnitBatch.inputs`` key them: the unit's files, unless a format names its inputs
        otherwise (a generated corpus whose units share one file name them by unit)."""
        return tuple(unit.files)

    @abc.abstractmethod
    def read_unit(self, params: Any, unit: Unit, params_file: str) -> Iterator[UnitBatch]:
        """The unit's samples in bounded batches (read, decoded and cleaned); a batch may say
        the hashes of the files it read (``UnitBatch.inputs``), sparing a second read."""

    def input_path(self, params: Any, name: str) -> str | None:
        """The local file an input name is read from, or None (a URL, a built-in corpus):
        ingest keeps the sha256 of local files by their stat (size, times, inode) and reads
        a file again only when its stat changed."""
        return None

    def label_source(self, params: Any, unit: Unit) -> str:
        """Where a unit's labels are read from, for messages about a bad label."""
        return f"{params.source}: {unit.id}"

    def decode_params(self, params: Any) -> dict[str, Any]:
        """The ingest params that decide a unit's stored rows (hashed into its key)."""
        return {}

    def fixed_label_names(self, params: Any, params_file: str) -> list[str] | None:
        """Class names the source itself fixes (class folders, a built-in corpus), else None
        (then ``ingest.label_names`` or the label ids found)."""
        return params.label_names

    @abc.abstractmethod
    def payload_fields(self) -> list[Any]:
        """The format's own ``pyarrow`` fields after the base columns of every shard."""

    def arrow_schema(self) -> Any:
        import pyarrow as pa

        base = [
            pa.field("key", pa.binary(snapshot.KEY_BYTES), nullable=False),
            pa.field("label", pa.int64(), nullable=False),
            pa.field("source", pa.string(), nullable=False),
            pa.field("row", pa.int64(), nullable=False),
        ]
        return pa.schema(base + self.payload_fields(), metadata={"format": self.name})

    @abc.abstractmethod
    def to_samples(self, batch: Any) -> np.ndarray:
        """The samples of an Arrow record batch read from a shard, as the task reads them
        (images ``uint8 [N, H, W, C]``, texts an object array of ``str``)."""

    def to_targets(self, batch: Any) -> np.ndarray:
        """What the model learns and is scored against for each sample of an Arrow record
        batch, first dimension the sample: default the int64 ``label`` (a class); a format
        with richer targets stores them in its payload (a segmentation mask ``[N, H, W]``).
        The ``label`` column stays every format's per-sample class: splits, class balance and
        the paired gates' per-class recall are of it."""
        return batch.column("label").to_numpy().astype(np.int64)

    def batch_facts(self, batch: UnitBatch) -> dict[str, Any]:
        """Partial facts about a batch (JSON: counts as dicts, character sets as strings)
        that :func:`sum_facts` adds up per unit (e.g. image shapes)."""
        return {}

    def merge_facts(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """Facts about the whole source from the units' partial facts, for ingest's
        manifest; ``StepError`` where the units disagree in a way the data set cannot hold
        (images of several sizes)."""
        return {}

    # ---------------------------------------------------------------- harvest

    def write_harvest(
        self, params: Any, name: str, rows: Iterable[tuple[str, Any, int]], params_file: str
    ) -> Harvested:
        """Write ``rows`` (request id, stored sample, label) as a new unit ``name`` of the
        source, atomically, and say how ``ingest`` params must change to read it into the
        train split (``components.ml.data.harvest``). Default: the format cannot (an error)."""
        raise StepError(f"{self.name} data: harvested traffic cannot be written as a source unit")

    # ---------------------------------------------------------------- serving (MLflow pyfunc)

    @abc.abstractmethod
    def input_examples(
        self, samples: np.ndarray, count: int, max_bytes: int
    ) -> tuple[Any, list[int]]:
        """Up to ``count`` stored samples (at most ``max_bytes`` of them) as a model's input
        example, and the per-sample shape the served model checks; ``ValueError`` when the
        stored samples are not of this format."""

    @abc.abstractmethod
    def model_input(self, value: Any, shape: list[int]) -> np.ndarray:
        """A request's input (array, list or one-column DataFrame) as stored samples;
        ``ValueError`` (a bad request) with what was expected and found."""

    # ---------------------------------------------------------------- validate
    # validate maps every shard through ``shard_stats`` (a process pool when
    # ``validate.workers`` > 1) and checks the per-shard rows with ``shard_expectations``;
    # the shared columns (key, label, row counts) are validate's own.

    shard_columns: ClassVar[tuple[str, ...]]  # the format's columns of validate's shard tables

    @abc.abstractmethod
    def shard_stats(self, params: Any) -> ShardStats:
        """A fresh accumulator of one shard's statistics of the format's own columns."""

    @abc.abstractmethod
    def shard_expectations(
        self, params: Any, facts: dict[str, dict[str, Any]]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The Great Expectations on the format's columns of the shard tables (one row per
        shard), given the facts of every split (:meth:`ShardStats.result`, summed with
        :func:`sum_facts`), and facts for ``summary.json``."""


# --------------------------------------------------------------------------- validate: per shard


class ShardStats(abc.ABC):
    """A data format's statistics of one shard (validate's map), added up batch by batch:
    memory is bounded by one record batch, whatever the shard's size."""

    @abc.abstractmethod
    def add(self, batch: Any, first: int) -> None:
        """Add an Arrow record batch whose first row is row ``first`` of the shard."""

    @abc.abstractmethod
    def result(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The shard's values of :attr:`DataFormat.shard_columns` (a column ``<x>_found``
        holds the readable "found ..." of the rule on ``<x>``), and facts (counts as dicts)
        that validate sums per split."""


EXAMPLES = 3  # rows quoted per broken rule


def show(value: Any) -> str:
    """A value in a failure message: integers plainly, floats briefly, strings quoted."""
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        v = float(value)
        if np.isnan(v):
            return "NaN"
        return str(int(v)) if v.is_integer() else f"{v:.4g}"
    return repr(value)


def sample_where(batch: Any, index: int, first: int) -> str:
    """Row ``first + index`` of a shard, and the input file and row it came from."""
    where = f"row {first + index}"
    names = batch.schema.names
    if "source" in names and "row" in names:
        where += f" ({batch.column('source')[index].as_py()}:{batch.column('row')[index].as_py()})"
    return where


@dataclass
class Examples:
    """How many rows of a shard break a rule, and the first few of them (value and where)."""

    count: int = 0
    shown: list[str] = field(default_factory=list)

    def add(
        self, batch: Any, first: int, hits: np.ndarray, values: Any = None, *, raw: bool = False
    ) -> None:
        """Rows ``hits`` (indices into ``batch``) break the rule; ``values`` are theirs
        (shown as values, or as they are with ``raw``: already readable text)."""
        hits = np.asarray(hits)
        for j, index in enumerate(hits[: max(0, EXAMPLES - len(self.shown))].tolist()):
            value = ""
            if values is not None:
                value = f"{values[j] if raw else show(values[j])} at "
            self.shown.append(value + sample_where(batch, index, first))
        self.count += int(hits.size)

    def found(self, rows: int, what: str = "") -> str:
        """``found 2 of 1206 rows <what> (e.g. 42 at row 3 (file:7), ...)``, or "" if none."""
        if not self.count:
            return ""
        more = ", ..." if self.count > len(self.shown) else ""
        what = f" {what}" if what else ""
        return f"found {self.count} of {rows} rows{what} (e.g. {', '.join(self.shown)}{more})"


def sum_facts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Partial facts summed: counts (dicts of numbers) add up, strings of characters unite."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict):
                into = out.setdefault(key, {})
                for k, v in value.items():
                    into[k] = into.get(k, 0) + v
            elif isinstance(value, str):
                out[key] = "".join(sorted(set(out.get(key, "")) | set(value)))
            else:
                raise TypeError(f"fact {key}: counts (dict) or characters (str), got {value!r}")
    return out


def check_format(data_dir: str | Path, fmt: DataFormat, task_name: str) -> None:
    """Refuse a data set stored in another format than the task reads."""
    stored = dataset.read_format(data_dir)
    if stored != fmt.name:
        raise StepError(
            f"{Path(data_dir) / 'labels.json'}: the data set holds '{stored}' data but task "
            f"'{task_name}' reads '{fmt.name}' data; run ingest with this task's params"
        )


def read_split(fmt: DataFormat, data_dir: str | Path, split: str) -> dataset.Split:
    """One stored split of a data set in format ``fmt``, whole (for what still needs it in
    memory; streaming readers use :func:`iter_split`)."""
    samples, labels = [], []
    for samp, lbl in iter_split(fmt, data_dir, split):
        samples.append(samp)
        labels.append(lbl)
    if not samples:
        return dataset.Split(fmt.to_samples(None), np.zeros(0, dtype=np.int64))
    return dataset.Split(np.concatenate(samples), np.concatenate(labels))


def iter_split(
    fmt: DataFormat, data_dir: str | Path, split: str, batch_rows: int = 1024
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(samples, targets) of ``split`` in bounded batches, shard by shard; targets are
    :meth:`DataFormat.to_targets` (the int64 labels, unless the format has richer ones)."""
    for batch in snapshot.iter_batches(data_dir, split, batch_rows=batch_rows):
        yield fmt.to_samples(batch), fmt.to_targets(batch)


# --------------------------------------------------------------------------- label sets


def span(labels: list[int]) -> str:
    """``0..9`` for contiguous ids, else the ids themselves (at most a few)."""
    if not labels:
        return "(none)"
    if labels == list(range(labels[0], labels[-1] + 1)) and len(labels) > 2:
        return f"{labels[0]}..{labels[-1]}"
    shown = ", ".join(str(v) for v in labels[:5])
    return shown + (", ..." if len(labels) > 5 else "")


def label_names(
    names: list[str] | None, label_files: list[tuple[str, np.ndarray]], params_file: str
) -> list[str]:
    """Class names for the labels read from ``label_files`` ([(name, labels)]).

    The label set is ``ingest.label_names`` when declared, else ``0..K-1`` for the largest
    K whose ids all occur: a label beyond it (say 11 when no sample has label 10) is reported
    as outside the label set, never as a class missing from every split later.
    """
    present = sorted(set(np.concatenate([lb for _, lb in label_files]).tolist()))
    if names is not None:
        allowed = len(names)
        declared = f"the declared labels 0..{allowed - 1} ({params_file}: ingest.label_names "
        declared += f"has {allowed} names)"
    else:
        ids, allowed = set(present), 0
        while allowed in ids:
            allowed += 1
        reason = "label ids must run from 0 without gaps"
        if present and present[-1] > allowed:
            reason += f" and no sample has label {allowed}"
        declared = (
            f"the data set's labels {span(list(range(allowed)))} ({reason}; fix the labels "
            f"or list every class in {params_file}: ingest.label_names)"
        )
    outside = [v for v in present if not 0 <= v < allowed]
    if outside:
        for name, lbls in label_files:  # name the first file holding an offending label
            hits = np.flatnonzero(np.isin(lbls, outside))
            if hits.size:
                bad = sorted(set(lbls[hits].tolist()))
                noun = "label" if len(bad) == 1 else "labels"
                verb = "is" if len(bad) == 1 else "are"
                raise StepError(
                    f"{name}: {noun} {span(bad)} {verb} not one of {declared}; "
                    f"{hits.size} sample(s), first at index {int(hits[0])}"
                )
    if names is None:
        return [str(i) for i in range(allowed)]
    return list(names)
