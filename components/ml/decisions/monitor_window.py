"""The window ``monitor`` judges: the newest answered items of one model version in the
server's prediction log (``components.ml.data.prediction_log``), as columns (library layer)."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from components.core.artifacts import StepError
from components.ml.data.prediction_log import SEGMENT_GLOB, LogReader, Prediction

log = logging.getLogger(__name__)


class Features(Protocol):
    """What summarises the logged inputs (a task: ``Task.monitor_features``)."""

    def monitor_features(self, inputs: list[np.ndarray]) -> dict[str, Any]: ...


@dataclass
class Window:
    """The newest answered items of one model version in the log."""

    version: str | None
    ids: list[tuple[str, int]]  # (request id, item index) per item
    top1: np.ndarray
    confidence: np.ndarray
    features: dict[str, np.ndarray]
    records: int
    first_time: str | None
    last_time: str | None


def _served(record: Prediction) -> bool:
    return record.answered and record.ok and record.top1 is not None


def _segment_tails(
    reader: LogReader, segment: Path, need: int, version: str | None
) -> tuple[dict[str, deque[Prediction]], str | None]:
    """One streaming pass over ``segment``: per version (only ``version`` when given), the
    newest served records that can still be chosen for ``need`` items; and the version of
    the segment's newest served record."""
    tails: dict[str, deque[Prediction]] = {}
    held: dict[str, int] = {}
    newest = None
    for r in reader.segment_records(segment):
        if not _served(r):
            continue
        newest = r.version
        if version is not None and r.version != version:
            continue
        tail = tails.setdefault(r.version, deque())
        tail.append(r)
        held[r.version] = held.get(r.version, 0) + r.batch
        while held[r.version] - tail[0].batch >= need:
            held[r.version] -= tail.popleft().batch
    return tails, newest


def _newest_records(
    log_dir: Path, size: int, version: str | None
) -> tuple[list[Prediction], str | None, int]:
    """The newest served records of ``version`` (default: the newest record's) holding
    ``size`` items, oldest first, segment by segment from the newest; the version; torn
    lines."""
    chosen: list[Prediction] = []
    items = 0
    torn = 0
    for segment in reversed(sorted(log_dir.glob(SEGMENT_GLOB))):
        reader = LogReader(log_dir)
        tails, newest = _segment_tails(reader, segment, size - items, version)
        torn += reader.torn
        version = newest if version is None else version
        for r in reversed(tails.get(version or "", ())):
            chosen.append(r)
            items += r.batch
            if items >= size:
                break
        if items >= size:
            break
    chosen.reverse()
    return chosen, version, torn


def read_window(
    log_dir: Path, task: Features, size: int, input_names: list[str], version: str | None = None
) -> Window:
    """The newest ``size`` items answered by ``version`` (default: the newest record's),
    segment by segment from the newest, each in one streaming pass: memory holds the window
    (per version seen in a segment), never a segment."""
    if not log_dir.is_dir():
        raise StepError(f"{log_dir}: no prediction log directory (--log)")
    chosen, version, torn = _newest_records(log_dir, size, version)
    ids: deque[tuple[str, int]] = deque(maxlen=size)
    top1: deque[int] = deque(maxlen=size)
    conf: deque[float] = deque(maxlen=size)
    feats: dict[str, list[np.ndarray]] = {}
    for r in chosen:
        for i, (t, c) in enumerate(zip(r.top1 or [], r.confidence or [], strict=True)):
            ids.append((r.id, i))
            top1.append(int(t))
            conf.append(float(c))
        if r.inputs is not None:
            # the model's inputs, or what the client sent instead (a text model's raw text)
            names = input_names if all(n in r.inputs for n in input_names) else list(r.inputs)
            arrays = [np.asarray(r.inputs[n]) for n in names]
            for name, values in task.monitor_features(arrays).items():
                feats.setdefault(name, []).append(np.asarray(values, dtype=np.float64))
    if torn:
        log.warning("%s: %d torn or invalid line(s) skipped", log_dir, torn)
    return Window(
        version=version,
        ids=list(ids),
        top1=np.asarray(top1, dtype=np.int64),
        confidence=np.asarray(conf, dtype=np.float64),
        features={k: np.concatenate(v) for k, v in feats.items()},
        records=len(chosen),
        first_time=chosen[0].time if chosen else None,
        last_time=chosen[-1].time if chosen else None,
    )
