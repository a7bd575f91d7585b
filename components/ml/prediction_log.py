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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import StepError

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
        try:
            handle = path.open("rb")
        except FileNotFoundError:  # rotated away while we read
            return
        with handle:
            for raw in handle:
                if not raw.endswith(b"\n"):
                    self.torn += 1  # the unterminated tail a kill can leave
                    continue
                record = parse_line(raw)
                if record is None:
                    self.torn += 1
                    continue
                yield record


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


def read_labels(path: Path, wanted: set[str]) -> dict[str, list[int]]:
    """The fed-back labels of the requests in ``wanted`` (streamed: only those are kept).
    A bad line is one error naming the file, the line and the rule."""
    out: dict[str, list[int]] = {}
    with path.open(encoding="utf-8") as handle:
        for n, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                rid = doc["id"]
                labels = doc["labels"] if "labels" in doc else [doc["label"]]
                labels = [int(x) for x in labels]
            except (ValueError, KeyError, TypeError) as exc:
                raise StepError(
                    f"{path}:{n}: a label line must be JSON with 'id' and an integer 'label' "
                    f"(or a list 'labels'): {exc}"
                ) from None
            if rid in wanted:
                out[rid] = labels
    return out
