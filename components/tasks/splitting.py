"""How ingest splits: every sample's split, and how far the result is from the fractions.

The rule (``ingest.split``, ``components.ml.data.snapshot.SplitRule``) is ``hash`` (a sample's
split is a function of its identity alone, stable as the data grows) or ``permutation`` (the
old seeded permutation per class over all samples, :func:`stratified_split`, kept so a
pipeline can reproduce a split made before snapshots). Files the user names in
``ingest.split.files`` send all their samples to one split (:func:`file_split`). Identical
samples (equal keys) always land in the same split, so no sample leaks between splits.

Library layer: imported by the ingest step and its unit map.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

import numpy as np

from components.core.artifacts import StepError
from components.ml.data import dataset, snapshot
from components.tasks.data import SplitParams, Unit

SPLITS = snapshot.SPLITS


def stratified_split(
    keys: Sequence[bytes], labels: np.ndarray, params: SplitParams, noun: str = "sample"
) -> dict[str, np.ndarray]:
    """Indices per split: stratified by label, seeded, identical samples (equal ``keys``)
    kept together."""
    groups: dict[bytes, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    conflicting = [g for g in groups.values() if len(set(labels[g].tolist())) > 1]
    if conflicting:
        raise StepError(
            f"{len(conflicting)} identical {noun}(s) carry different labels, e.g. sample indices "
            f"{conflicting[0][:5]}; fix the labels in the source"
        )
    rng = np.random.default_rng(params.seed)
    out: dict[str, list[int]] = {s: [] for s in dataset.SPLITS}
    by_class: dict[int, list[list[int]]] = {}
    for members in sorted(groups.values(), key=lambda g: g[0]):
        by_class.setdefault(int(labels[members[0]]), []).append(members)
    for label in sorted(by_class):
        class_groups = by_class[label]
        order = rng.permutation(len(class_groups))
        n = len(class_groups)
        n_test = int(round(n * params.test_fraction))
        n_val = int(round(n * params.val_fraction))
        for rank, gi in enumerate(order):
            split = "test" if rank < n_test else "val" if rank < n_test + n_val else "train"
            out[split].extend(class_groups[gi])
    return {s: np.asarray(sorted(v), dtype=np.int64) for s, v in out.items()}


def file_split(src: str, patterns: dict[str, str], source: str) -> str | None:
    """The split ``ingest.split.files`` forces on a sample of input ``src``: patterns are
    globs under the source (a format that records whole URIs is matched without it)."""
    prefix = source.rstrip("/") + "/"
    rel = src[len(prefix) :] if src.startswith(prefix) else src
    for pattern, split in patterns.items():
        if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(src, pattern):
            return split
    return None


def permutation(fmt: Any, params: Any, units: list[Unit], params_file: str) -> dict[bytes, int]:
    """The old split (a seeded permutation per class over all samples): a key -> split map.
    Unstable under growth; kept so a pipeline can reproduce a split made before snapshots."""
    keys: list[bytes] = []
    labels: list[np.ndarray] = []
    for unit in units:
        for batch in fmt.read_unit(params, unit, params_file):
            keys += batch.keys
            labels.append(batch.labels)
    lbl = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    indices = stratified_split(keys, lbl, params.split, fmt.sample_noun)
    out: dict[bytes, int] = {}
    for index, split in enumerate(SPLITS):
        for i in indices[split].tolist():
            out[keys[i]] = index
    return out


def split_deviation(counts: dict[str, dict[str, int]], split: SplitParams) -> dict[str, Any]:
    """Per class: each split's share minus the configured fraction (points), and the worst."""
    want = {
        "train": 1 - split.val_fraction - split.test_fraction,
        "val": split.val_fraction,
        "test": split.test_fraction,
    }
    per_class: dict[str, dict[str, float]] = {}
    worst = 0.0
    for name in counts["train"]:
        n = sum(counts[s][name] for s in SPLITS)
        if not n:
            continue
        per_class[name] = {s: round(100 * (counts[s][name] / n - want[s]), 3) for s in SPLITS}
        worst = max(worst, *(abs(v) for v in per_class[name].values()))
    return {"points": per_class, "max_abs_points": round(worst, 3)}
