"""ingest's reduce: the units' results (``components.tasks.ingest_units``) checked and added
up into what the snapshot's manifests say.

Checks, each one line naming where: every input's sha256 against ``ingest.sha256``
(:func:`verify_sha256`), the source unchanged since the orchestrator fingerprinted it
(:func:`checked_inputs`), and no identical samples under different labels
(:func:`check_conflicts`). Then :func:`tally` adds up the shards, rows per split and class and
the dropped rows, and :func:`snapshot_doc` / :func:`manifest_extra` say it in
``snapshot.json`` and ``manifest.json``.

Library layer: imported by the ingest step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from components.core.artifacts import StepError, combined_sha256
from components.core.config import DEFAULT_PARAMS
from components.ml.data import snapshot
from components.ml.data.sources import join_uri
from components.tasks.data import DataFormat, Skipped
from components.tasks.ingest_units import UNREADABLE_SHOWN, UnitResult
from components.tasks.splitting import split_deviation

SPLITS = snapshot.SPLITS
DEFAULT_PARAMS_FILE = str(DEFAULT_PARAMS)  # named in messages when no --params is given


def verify_sha256(
    declared: dict[str, str],
    actual: dict[str, str],
    source: str,
    params_file: str = DEFAULT_PARAMS_FILE,
) -> None:
    for name, want in declared.items():
        got = actual.get(name)
        if got is None:
            raise StepError(
                f"{params_file}: ingest.sha256 names '{name}', not an input of {source} "
                f"(inputs: {', '.join(sorted(actual)[:5])}{', ...' if len(actual) > 5 else ''})"
            )
        if got != want.lower():
            raise StepError(
                f"{join_uri(source, name)}: sha256 {got} does not match declared {want}"
            )


def checked_inputs(
    params: Any, results: list[UnitResult], expected_source_sha256: str, params_file: str
) -> dict[str, str]:
    """Every input's sha256, checked against ``ingest.sha256`` and, when given, against the
    orchestrator's fingerprint of the source."""
    inputs = {k: v for r in results for k, v in r.inputs.items()}
    verify_sha256(params.sha256, inputs, params.source, params_file)
    if expected_source_sha256 and combined_sha256(inputs) != expected_source_sha256:
        raise StepError(
            f"{params.source} changed while the pipeline ran (its fingerprint was "
            f"{expected_source_sha256[:12]}…, now {combined_sha256(inputs)[:12]}…); "
            "run the pipeline again"
        )
    return inputs


def label_files(fmt: DataFormat, params: Any, results: list[UnitResult]) -> list[tuple[str, Any]]:
    """(where the labels were read, the labels) of every unit (for ``label_names``)."""
    return [
        (fmt.label_source(params, r.unit), r.key_labels[1])
        for r in results
        if r.key_labels is not None
    ]


def merged_facts(fmt: DataFormat, source: str, results: list[UnitResult]) -> dict[str, Any]:
    """The format's facts of the whole data set (a disagreement names the source)."""
    try:
        return fmt.merge_facts([r.facts for r in results])
    except StepError as exc:
        raise StepError(f"{source}: {exc}") from exc


@dataclass
class Tally:
    """The snapshot's shards (each with its unit's key), rows per split and class, and the
    rows dropped by reason."""

    shards: list[dict[str, Any]]
    counts: dict[str, dict[str, int]]
    totals: dict[str, int]
    dropped: Counter[str]
    reused: int  # units whose shards were reused


def tally(results: list[UnitResult], names: list[str]) -> Tally:
    """Add up the units' results; ``names`` are the class names by label id."""
    dropped: Counter = Counter()
    for r in results:
        dropped.update(r.dropped)
    shards = []
    for r in results:
        for shard in r.shards:
            shards.append({**shard, "unit_key": r.key})
    counts = {split: {name: 0 for name in names} for split in SPLITS}
    for shard in shards:
        for label, n in shard["counts"].items():
            counts[shard["split"]][names[int(label)]] += n
    totals = {s: sum(c.values()) for s, c in counts.items()}
    reused = sum(1 for r in results if r.reused)
    return Tally(shards, counts, totals, dropped, reused)


def snapshot_doc(
    fmt_name: str, params: Any, t: Tally, results: list[UnitResult], facts: dict[str, Any]
) -> dict[str, Any]:
    """What ``snapshot.json`` says besides its format version (docs/data-format.md): the
    content only (shards, splits, counts, rules, units), so its sha256, the snapshot's identity
    in lineage, is the same however the snapshot came about. Which units were reused from the
    last snapshot is said in the step's ``manifest.json`` (:func:`manifest_extra`)."""
    return {
        "data_format": fmt_name,
        "source": params.source,
        "split_rule": params.split.rule().doc(),
        "split_files": dict(params.split.files),
        "shards": t.shards,
        "counts": t.counts,
        "totals": t.totals,
        "split_deviation": split_deviation(t.counts, params.split),
        "units": [
            {
                "id": r.unit.id,
                "key": r.key,
                "files": len(r.unit.files),
                "inputs_sha256": combined_sha256(r.inputs),
                "rows": r.rows,
                "dropped": r.dropped,
                "facts": r.facts,
            }
            for r in results
        ],
        **facts,
    }


def manifest_extra(
    params: Any,
    fmt_name: str,
    inputs: dict[str, str],
    t: Tally,
    results: list[UnitResult],
    facts: dict[str, Any],
    skipped: Skipped | None = None,
) -> dict[str, Any]:
    """What the step's ``manifest.json`` says besides its inputs, outputs and params."""
    skipped = skipped or Skipped()
    total = sum(r.rows for r in results)
    return {
        "source": params.source,
        "kind": params.kind,
        "format": fmt_name,
        "input_sha256": inputs,
        "read": int(total + sum(t.dropped.values())),
        "dropped": {k: int(v) for k, v in t.dropped.items()},
        # input files the listing passed over, by reason (image folders: their extension)
        "skipped": dict(sorted(skipped.counts.items())),
        "skipped_examples": dict(sorted(skipped.examples.items())),
        "counts": t.counts,
        "totals": t.totals,
        "units": len(results),
        "units_reused": t.reused,
        # input files read this run (hashed and, in units not reused, decoded); the others'
        # sha256 came from the stat cache (inputs-stat.npz: their stat had not changed)
        "inputs_read": sum(r.files_read for r in results),
        # how the snapshot came about, kept out of snapshot.json (its identity)
        "reused_units": [r.unit.id for r in results if r.reused],
        **facts,
    }


def check_unreadable(results: list[UnitResult], noun: str) -> None:
    """Input files that did not decode: one error naming each (the first
    ``UNREADABLE_SHOWN``) with its reason, and how many there are."""
    count = sum(r.unreadable_count for r in results)
    if not count:
        return
    shown = [item for r in results for item in r.unreadable][:UNREADABLE_SHOWN]
    listed = "; ".join(f"{path}: {reason}" for path, reason in shown)
    more = f"; and {count - len(shown)} more" if count > len(shown) else ""
    raise StepError(
        f"{count} file(s) named like {noun}s are not readable {noun}s (fix or remove them): "
        f"{listed}{more}"
    )


def check_conflicts(results: list[UnitResult], noun: str) -> None:
    """Identical samples (equal keys) under different labels: one line naming where."""
    parts = [(i, r.key_labels) for i, r in enumerate(results) if r.key_labels is not None]
    if not parts:
        return
    keys = np.concatenate([kl[0] for _, kl in parts])
    labels = np.concatenate([kl[1] for _, kl in parts])
    rows = np.concatenate([kl[2] for _, kl in parts])
    owner = np.concatenate([np.full(len(kl[0]), i) for i, kl in parts])
    order = np.lexsort((rows, owner, keys))
    k, lb = keys[order], labels[order]
    bad_pairs = (k[1:] == k[:-1]) & (lb[1:] != lb[:-1])
    if not bad_pairs.any():
        return
    first = int(np.flatnonzero(bad_pairs)[0])
    same = order[np.flatnonzero(keys[order] == k[first])]
    where: dict[str, list[int]] = {}
    for i in same.tolist():
        unit = results[int(owner[i])].unit
        if unit.rows_are_files:
            where.setdefault(unit.where(int(rows[i])), [])
        else:
            where.setdefault(unit.id, []).append(int(rows[i]))
    shown = "; ".join(
        f"{name} rows {sorted(r)[:5]}" if r else name for name, r in list(where.items())[:4]
    )
    groups = int(np.unique(k[1:][bad_pairs]).size)
    raise StepError(
        f"{groups} identical {noun}(s) carry different labels, e.g. {shown} (labels "
        f"{sorted(set(labels[same].tolist()))}); fix the labels in the source"
    )
