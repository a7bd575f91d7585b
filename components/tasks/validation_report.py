"""What validate reports: the log lines of the reduce, and the files of its output directory.

:func:`write_report` writes ``result.json`` (the Great Expectations validation results),
``summary.json`` (what passed, the readable failure lines, the reduce's counts) and the
step's ``manifest.json`` next to the Data Docs site that ``components.tasks.expectations``
built, and returns the :class:`Outcome`.

Library layer: imported by the validate step.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from components.core.artifacts import write_json, write_manifest
from components.ml.data import snapshot
from components.tasks import expectation_failures as failures
from components.tasks.expectations import Table
from components.tasks.shard_reduce import Reduced

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """Expectations evaluated, how many failed, and one readable line per broken rule."""

    evaluated: int
    failed: int
    lines: list[str]

    @property
    def success(self) -> bool:
        return not self.failed


def log_reduced(
    reduced: Reduced, snap: snapshot.Snapshot, fmt_name: str, facts: dict[str, Any], classes: int
) -> None:
    """What is about to be validated, and each split's duplicates."""
    log.info(
        "validating %d shards %s (%s data %s), %d classes; key sets %.1f MB",
        len(snap.shards),
        reduced.splits,
        fmt_name,
        facts,
        classes,
        reduced.key_bytes / 2**20,
    )
    for split, dup in reduced.duplicates.items():
        log.info(
            "%s: %d of %d rows are exact duplicates (%.4f), %d sample(s) under several labels",
            split,
            dup["duplicate_rows"],
            dup["rows"],
            dup["duplicate_fraction"],
            dup["conflicting"],
        )


def write_report(
    dest: Path,
    checked: list[tuple[Table, Any]],
    *,
    params: Any,
    data_dir: Path,
    snap: snapshot.Snapshot,
    fmt_name: str,
    facts: dict[str, Any],
    reduced: Reduced,
) -> Outcome:
    """``result.json``, ``summary.json`` and ``manifest.json`` of the tables ``checked`` (each
    table with its validation result) into ``dest`` (the Data Docs are in ``data_docs/``)."""
    outcome = Outcome(*failures.count(checked))
    success = outcome.success
    write_json(
        dest / "result.json",
        {"success": success, "validation_results": [r.to_json_dict() for _, r in checked]},
    )
    write_json(
        dest / "summary.json",
        {
            "success": success,
            "evaluated": outcome.evaluated,
            "failed": outcome.failed,
            "failures": outcome.lines,
            "format": fmt_name,
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
        dest,
        "validate",
        inputs={
            snapshot.SNAPSHOT_FILE: data_dir / snapshot.SNAPSHOT_FILE,
            "labels.json": data_dir / "labels.json",
        },
        outputs={
            "result.json": dest / "result.json",
            "summary.json": dest / "summary.json",
            "data_docs": dest / "data_docs",
        },
        params=asdict(params),
        extra={
            "success": success,
            "evaluated": outcome.evaluated,
            "failed": outcome.failed,
            "snapshot_sha256": snap.sha256,
            "shards_verified": len(snap.shards),
        },
    )
    return outcome
