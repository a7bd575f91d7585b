"""What a task's data looks like: how raw data is read, stored, split and validated.

A :class:`DataFormat` (a modality: images, texts) is owned by the tasks that read it
(``Task.data``). The ``ingest`` and ``validate`` steps ask the task for it and never look at
samples themselves, so a task with a new kind of data brings its format along and no step
changes. An ingested data set names its format in ``labels.json`` (see ``components.dataset``)
so every later step can check it holds the data its task reads.

Library layer: imported by tasks and steps, imports no step.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from components import dataset
from components.artifacts import StepError


@dataclass(frozen=True)
class SplitParams:
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    seed: int = 42

    def check(self) -> None:
        if not (0 < self.val_fraction < 1 and 0 < self.test_fraction < 1):
            raise ValueError("split.val_fraction and split.test_fraction must be in (0, 1)")
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError("split: val_fraction + test_fraction must leave >= 10% for train")


@dataclass(frozen=True)
class RawData:
    """Everything a reader found: samples (one per row), int64 labels, class names, the sha256
    of every raw input, and how many samples cleaning dropped and why (reported by ingest)."""

    samples: np.ndarray
    labels: np.ndarray
    label_names: list[str]
    input_sha256: dict[str, str]
    dropped: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CommonValidateParams:
    """The rules every format's ``validate`` section has (a format's params extend these)."""

    min_rows: int = 10  # per split
    max_rows: int = 10_000_000  # per split
    class_fraction_min: float = 0.02  # of the split, for every class
    class_fraction_max: float = 0.5
    # rows repeating another row of their split (same sample and label), per split
    max_duplicate_fraction: float = 0.05

    def check(self) -> None:
        if not 0 <= self.min_rows <= self.max_rows:
            raise ValueError(
                f"need 0 <= min_rows <= max_rows, got {self.min_rows}, {self.max_rows}"
            )
        if not 0 <= self.max_duplicate_fraction <= 1:
            raise ValueError(
                f"max_duplicate_fraction must be within [0, 1], got {self.max_duplicate_fraction}"
            )
        if not 0 <= self.class_fraction_min <= self.class_fraction_max <= 1:
            raise ValueError(
                "need 0 <= class_fraction_min <= class_fraction_max <= 1, got "
                f"{self.class_fraction_min}, {self.class_fraction_max}"
            )


_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def check_sha256(declared: dict[str, str]) -> None:
    """``ingest.sha256``: every declared digest must be 64 hex digits."""
    for name, digest in declared.items():
        if not _SHA256.fullmatch(digest):
            raise ValueError(f"sha256.{name} must be 64 hex digits, got {digest!r}")


# the columns every format's per-sample table starts with; the shared suites read them
BASE_COLUMNS = ["file", "index", "split", "label"]
HASH_COLUMN = "sample_sha"  # sha256 of the sample as stored: leakage and duplicates


class DataFormat(abc.ABC):
    """One kind of data: its ingest and validate params, readers, storage and suites."""

    name: ClassVar[str]  # recorded in labels.json ("image", "text")
    suffix: ClassVar[str]  # of a stored split file (".npz", ".jsonl")
    ingest_params: ClassVar[type]  # dataclass of params.yaml: ingest
    validate_params: ClassVar[type]  # dataclass of params.yaml: validate (extends the common)
    sample_noun: ClassVar[str] = "sample"  # in messages: "image", "text"
    duplicate_rule: ClassVar[str] = "same sample and label"  # what an exact duplicate is

    # ---------------------------------------------------------------- ingest

    @abc.abstractmethod
    def read_raw(self, params: Any, params_file: str) -> RawData:
        """Read (and clean) the source that ``params`` (the ingest section) names."""

    @abc.abstractmethod
    def sample_keys(self, samples: np.ndarray) -> list[bytes]:
        """One key per sample; samples with equal keys are identical and share a split."""

    def describe(self, samples: np.ndarray) -> dict[str, Any]:
        """Facts about the samples for ingest's manifest (e.g. the image shape)."""
        return {}

    # ---------------------------------------------------------------- storage

    def split_file(self, split: str) -> str:
        return f"{split}{self.suffix}"

    @abc.abstractmethod
    def write_split(self, path: Path, samples: np.ndarray, labels: np.ndarray) -> None:
        """Write one split to ``path`` (the caller makes the write atomic)."""

    @abc.abstractmethod
    def read_split(self, path: Path) -> dataset.Split:
        """Read one split as stored, without changing types (validation must see them)."""

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

    @abc.abstractmethod
    def sample_table(self, split: str, file: str, data: dataset.Split) -> pd.DataFrame:
        """One row per sample: :data:`BASE_COLUMNS`, the format's own columns, and
        :data:`HASH_COLUMN`."""

    @abc.abstractmethod
    def sample_expectations(
        self, params: Any, num_classes: int, splits: dict[str, dataset.Split]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The Great Expectations of the per-sample tables, and facts for ``summary.json``."""


def check_format(data_dir: str | Path, fmt: DataFormat, task_name: str) -> None:
    """Refuse a data set stored in another format than the task reads."""
    stored = dataset.read_format(data_dir)
    if stored != fmt.name:
        raise StepError(
            f"{Path(data_dir) / 'labels.json'}: the data set holds '{stored}' data but task "
            f"'{task_name}' reads '{fmt.name}' data; run ingest with this task's params"
        )


def read_split(fmt: DataFormat, data_dir: str | Path, split: str) -> dataset.Split:
    """One stored split of a data set in format ``fmt``."""
    return fmt.read_split(dataset.split_path(data_dir, split))


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
