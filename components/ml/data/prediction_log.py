"""Reading the C++ server's prediction log (``serving/src/prediction_log.h``).

The server writes one CloudEvents 1.0 event per answered request (structured mode, type
``org.kubeflow.serving.inference.response``, as KServe's logger names it) into JSON Lines
segments ``predictions-<utc start>-<host>-<pid>-<seq>.jsonl`` of a size-bounded directory. A
line is a record only when it ends in a newline and parses with every field present: a SIGKILL can
leave an unterminated last line, which is counted as ``torn`` and never returned.

Records stream segment by segment, oldest first; nothing holds the whole log in memory.

Library layer: imported by steps, imports no step.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import StepError

log = logging.getLogger(__name__)

EVENT_TYPE = "org.kubeflow.serving.inference.response"
SEGMENT_GLOB = "predictions-*.jsonl"
_REQUIRED = ("specversion", "id", "type", "source", "time", "data")
_REQUIRED_DATA = ("model_name", "model_version", "role", "answered", "latency_us", "code", "batch")

# KServe v2 datatypes → numpy (what the server logs an input tensor as)
_DTYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


@dataclass(frozen=True)
class Prediction:
    """One logged answer of one model version to one request."""

    id: str
    time: str
    model: str
    version: str
    role: str  # "default" (the only version), "champion" or "challenger"
    answered: bool  # False: a shadow answer no client saw
    latency_us: int
    code: int  # HTTP-style status of the answer
    batch: int
    top1: list[int] | None = None
    confidence: list[float] | None = None
    output_mean: list[float] | None = None
    error: str | None = None
    inputs: dict[str, np.ndarray] | None = None  # sampled requests only

    @property
    def ok(self) -> bool:
        return self.code == 200


@dataclass
class LogReader:
    """Iterates the records of a log directory; ``torn`` counts the lines refused."""

    directory: Path
    torn: int = 0
    segments: list[Path] = field(default_factory=list)

    def __iter__(self) -> Iterator[Prediction]:
        self.segments = sorted(Path(self.directory).glob(SEGMENT_GLOB))
        for segment in self.segments:
            yield from self.segment_records(segment)

    def segment_records(self, path: Path) -> Iterator[Prediction]:
        """The whole records of one segment file (torn lines counted in ``torn``)."""
        for raw in whole_lines([path], self._tear):
            record = parse_line(raw)
            if record is None:
                self.torn += 1
                continue
            yield record

    def _tear(self) -> None:
        self.torn += 1  # the unterminated tail a kill can leave


def whole_lines(
    segments: Iterable[Path], torn: Callable[[], None] = lambda: None
) -> Iterator[bytes]:
    """The complete lines of ``segments``, in order, as bytes: a segment rotated away while
    it is read is skipped, an unterminated line (the tail a kill can leave) is reported to
    ``torn`` and skipped."""
    for path in segments:
        try:
            handle = path.open("rb")
        except FileNotFoundError:  # rotated away while we read
            continue
        with handle:
            for raw in handle:
                if not raw.endswith(b"\n"):
                    torn()
                    continue
                yield raw


def parse_line(raw: bytes) -> Prediction | None:
    """The record of one complete line, or None when it is not a whole, valid event."""
    try:
        event = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(event, dict) or any(k not in event for k in _REQUIRED):
        return None
    data = event["data"]
    if event["type"] != EVENT_TYPE or not isinstance(data, dict):
        return None
    if any(k not in data for k in _REQUIRED_DATA):
        return None
    inputs = None
    if "inputs" in data:
        try:
            inputs = {t["name"]: decode_tensor(t) for t in data["inputs"]}
        except (KeyError, ValueError, TypeError):
            return None
    return Prediction(
        id=event["id"],
        time=event["time"],
        model=data["model_name"],
        version=data["model_version"],
        role=data["role"],
        answered=bool(data["answered"]),
        latency_us=int(data["latency_us"]),
        code=int(data["code"]),
        batch=int(data["batch"]),
        top1=data.get("top1"),
        confidence=data.get("confidence"),
        output_mean=data.get("output_mean"),
        error=data.get("error"),
        inputs=inputs,
    )


def decode_tensor(tensor: dict[str, Any]) -> np.ndarray:
    """A logged input tensor as an array (BYTES: an object array of bytes items)."""
    raw = base64.b64decode(tensor["data_base64"], validate=True)
    shape = [int(d) for d in tensor["shape"]]
    if tensor["datatype"] == "BYTES":  # 4-byte little-endian length, then the bytes
        items, offset = [], 0
        while offset < len(raw):
            size = int.from_bytes(raw[offset : offset + 4], "little")
            items.append(raw[offset + 4 : offset + 4 + size])
            offset += 4 + size
        if len(items) != int(np.prod(shape)):
            raise ValueError("BYTES items do not match the shape")
        return np.array(items, dtype=object).reshape(shape)
    dtype = _DTYPES[tensor["datatype"]]
    array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
    return array.reshape(shape)


def read_log(directory: str | Path) -> Iterator[Prediction]:
    """Every whole record of the log directory, oldest segment first."""
    return iter(LogReader(Path(directory)))


# a label file's faults are listed one line each, at most this many (then a count of the rest)
MAX_LABEL_ERRORS = 20
# unknown label ids named in the warning, at most
MAX_UNKNOWN_NAMED = 10


class LabelFeedback(dict[str, list[int]]):
    """The fed-back labels of the wanted requests (request id -> one label per item), and
    what the file held besides: ``lines`` label lines, ``unknown`` ids no logged request has."""

    def __init__(self, labels: dict[str, list[int]], lines: int, unknown: list[str]):
        super().__init__(labels)
        self.lines = lines
        self.unknown = unknown

    def summary(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "unknown_ids": len(self.unknown),
            "unknown_named": self.unknown[:MAX_UNKNOWN_NAMED],
        }


def logged_batches(directory: Path, ids: set[str]) -> dict[str, int]:
    """The item count (``batch``) of each of ``ids`` that some whole record of the log holds:
    one streaming pass over every segment, reading the id and batch alone (no tensor is
    decoded). Torn or invalid lines are skipped as :class:`LogReader` skips them."""
    found: dict[str, int] = {}
    if not ids:
        return found
    for raw in whole_lines(sorted(Path(directory).glob(SEGMENT_GLOB))):
        try:
            event = json.loads(raw)
            rid, batch = event["id"], int(event["data"]["batch"])
        except (ValueError, KeyError, TypeError):
            continue
        if rid in ids and rid not in found:
            found[rid] = batch
    return found


def read_labels(
    path: Path, log_dir: Path, wanted: Iterable[str], num_classes: int | None = None
) -> LabelFeedback:
    """The fed-back labels of the requests in ``wanted``, the whole file validated first
    (the one place labels are read: monitor, judge and harvest).

    A line is ``{"id": ..., "label": k}`` or ``{"id": ..., "labels": [k, ...]}`` (one label
    per item of the request, in its order). Errors, one line each naming the file, the line
    and the rule, all raised together as one :class:`StepError`:

    - a line that is not such JSON;
    - a label outside ``0 .. num_classes - 1`` (when ``num_classes`` is known);
    - a label count other than the item count the log holds for that request;
    - a request id given twice with different labels (the same labels twice is a resend,
      accepted).

    Ids no record of ``log_dir`` holds (a typo, another id scheme, records already rotated
    away) cannot be judged: they are counted and named in one warning, never counted as
    labelled. Memory holds one entry per label line's id."""
    wanted = set(wanted)
    seen, errors, lines = _scan_labels(path, num_classes)
    batches = logged_batches(log_dir, set(seen))
    for rid, (n, labels) in seen.items():
        if rid in batches and len(labels) != batches[rid]:
            rule = (
                f"{len(labels)} label(s) for request {rid!r}, which the log holds "
                f"with {batches[rid]} item(s): one label per item, in the request's order"
            )
            errors.append(_fault(path, n, rule))
    if errors:
        errors.sort(key=lambda e: e[0])
        shown = [message for _, message in errors[:MAX_LABEL_ERRORS]]
        if len(errors) > MAX_LABEL_ERRORS:
            shown.append(f"{path}: {len(errors) - MAX_LABEL_ERRORS} more label faults")
        raise StepError("\nerror: ".join(shown))
    unknown = [rid for rid in seen if rid not in batches]
    if unknown:
        _warn_unknown(path, log_dir, unknown, len(seen))
    return LabelFeedback(
        {
            rid: list(labels)
            for rid, (_, labels) in seen.items()
            if rid in wanted and rid in batches
        },
        lines,
        unknown,
    )


def _fault(path: Path, n: int, rule: str) -> tuple[int, str]:
    """A label file's fault at line ``n``: (line, the message naming file:line and rule)."""
    return (n, f"{path}:{n}: {rule}")


def _label_line(line: str) -> tuple[str, tuple[int, ...]]:
    """(request id, labels) of one label line; ValueError/KeyError/TypeError if malformed."""
    doc = json.loads(line)
    rid = doc["id"]
    raw = doc["labels"] if "labels" in doc else [doc["label"]]
    if not isinstance(rid, str) or isinstance(raw, (str, bytes)):
        raise TypeError("'id' must be a string and 'labels' a list")
    if any(isinstance(x, bool) or int(x) != x for x in raw):
        raise TypeError(f"labels must be integers, got {raw}")
    return rid, tuple(int(x) for x in raw)


def _scan_labels(
    path: Path, num_classes: int | None
) -> tuple[dict[str, tuple[int, tuple[int, ...]]], list[tuple[int, str]], int]:
    """One pass over the label file: id -> (first line, labels), the faults of single lines
    (malformed, out of range, relabelled differently) and the count of label lines."""
    seen: dict[str, tuple[int, tuple[int, ...]]] = {}  # id -> (first line, labels)
    errors: list[tuple[int, str]] = []  # (line, message)
    lines = 0
    with path.open(encoding="utf-8") as handle:
        for n, line in enumerate(handle, 1):
            if not line.strip():
                continue
            lines += 1
            try:
                rid, labels = _label_line(line)
            except (ValueError, KeyError, TypeError) as exc:
                rule = (
                    f"a label line must be JSON with a string 'id' and an integer "
                    f"'label' (or a list 'labels'): {exc}"
                )
                errors.append(_fault(path, n, rule))
                continue
            bad = [x for x in labels if num_classes is not None and not 0 <= x < num_classes]
            if bad:
                rule = (
                    f"label {bad[0]} of request {rid!r} is out of range: a label "
                    f"is a class index 0..{num_classes - 1} ({num_classes} classes)"
                )
                errors.append(_fault(path, n, rule))
                continue
            if rid in seen and seen[rid][1] != labels:
                first, before = seen[rid]
                rule = (
                    f"request {rid!r} labelled {list(labels)} here but "
                    f"{list(before)} at line {first}: one answer per request id (a resend "
                    "must repeat the same labels)"
                )
                errors.append(_fault(path, n, rule))
                continue
            seen.setdefault(rid, (n, labels))
    return seen, errors, lines


def _warn_unknown(path: Path, log_dir: Path, unknown: list[str], labelled: int) -> None:
    """One warning naming the labelled ids no record of the log holds."""
    named = ", ".join(repr(r) for r in unknown[:MAX_UNKNOWN_NAMED])
    rest = (
        f" and {len(unknown) - MAX_UNKNOWN_NAMED} more" if len(unknown) > MAX_UNKNOWN_NAMED else ""
    )
    log.warning(
        "%s: %d of %d labelled request id(s) match no request in the log %s, so none of "
        "their labels counts (a typo, another id scheme, or records rotated away): %s%s",
        path, len(unknown), labelled, log_dir, named, rest,
    )  # fmt: skip
