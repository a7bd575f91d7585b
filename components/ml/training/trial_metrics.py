"""A trial's per-epoch metrics as text lines that Katib's metrics collector parses, and the
same parse for the local engine (one format, both engines).

A line is ``<RFC 3339 UTC time> epoch=<n> <name>=<value> ...``: Katib's StdOut/File collector
takes a first token that parses as RFC3339Nano as the line's timestamp, and every
``name=value`` match of its default filter (:data:`KATIB_DEFAULT_FILTER`, copied from
kubeflow/katib ``pkg/metricscollector/v1beta1/common/const.go``) whose name is a metric of the
experiment. Only finite values are written: ``nan``/``inf`` would not parse.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

# Katib v0.19.0 DefaultFilter, exactly (Go's \w is ASCII, hence re.ASCII)
KATIB_DEFAULT_FILTER = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"
FILTER = re.compile(KATIB_DEFAULT_FILTER, re.ASCII)
NAME = re.compile(r"[\w-]+", re.ASCII)  # a metric name the filter reads back whole
EPOCH = "epoch"
# set to "1" in a search trial's environment: the train step prints one metric line per epoch
TRIAL_ENV = "PADDLE_MLOPS_TRIAL"


def timestamp(now: datetime) -> str:
    """``now`` as RFC 3339 UTC with microseconds (``2026-12-06T09:10:00.123456Z``)."""
    if now.tzinfo is not None:
        now = now.astimezone(UTC).replace(tzinfo=None)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def metric_line(epoch: int, metrics: Mapping[str, float], now: datetime) -> str:
    """One epoch's line: ``<time> epoch=3 val_accuracy=0.912345 val_loss=0.3`` (finite values
    only, ``%.6g``)."""
    fields = [f"{EPOCH}={int(epoch)}"]
    for name, value in metrics.items():
        if not NAME.fullmatch(name) or name == EPOCH:
            raise ValueError(f"{name!r}: a metric name is letters, digits, _ and - (not epoch)")
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            fields.append(f"{name}=%.6g" % value)
    return f"{timestamp(now)} {' '.join(fields)}"


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:  # the filter also matches an empty value ("name=")
        return None
    return value if math.isfinite(value) else None


def parse_line(line: str, names: Sequence[str]) -> tuple[int, dict[str, float]] | None:
    """(epoch, {name: value}) of one line, for the ``names`` it holds; None: no epoch or none
    of ``names`` on it."""
    found: dict[str, float] = {}
    epoch: float | None = None
    for match in FILTER.finditer(line):
        name, value = match.group(1), _number(match.group(2))
        if value is None:
            continue
        if name == EPOCH:
            epoch = value
        elif name in names:
            found[name] = value
    if epoch is None or not found or not epoch.is_integer():
        return None
    return int(epoch), found


def parse(lines: Iterable[str], names: Sequence[str]) -> list[tuple[int, dict[str, float]]]:
    """Every metric line among ``lines``: (epoch, {name: value}) for the ``names`` it holds."""
    out = []
    for line in lines:
        parsed = parse_line(line, names)
        if parsed is not None:
            out.append(parsed)
    return out
