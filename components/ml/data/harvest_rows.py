"""Which logged requests ``harvest`` writes (library layer): answered, successful requests
whose inputs were logged and whose labels came back, each item turned back into the sample
ingest stores (the task's ``raw_samples``), less what cannot be recovered, what the snapshot
holds already and repeats within the unit."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from components.ml.data.harvest import sample_digest
from components.ml.data.prediction_log import LogReader, Prediction

# (request id, stored sample or None, label, recovered, digest of the model input or None)
Item = tuple[str, Any, int, bool, bytes | None]


class Recovers(Protocol):
    """What turns logged model inputs back into stored samples (a task's ``raw_samples``)."""

    def raw_samples(self, inputs: list[np.ndarray], like: Any) -> tuple[list[Any], np.ndarray]: ...


def usable(record: Prediction) -> bool:
    return record.answered and record.ok and record.inputs is not None


def candidates(log_dir: Path, done: set[str]) -> set[str]:
    """Ids of answered, successful requests whose inputs were logged (first pass)."""
    return {r.id for r in LogReader(log_dir) if usable(r) and r.id not in done}


def inputs_digest(arrays: list[np.ndarray], row: int) -> bytes:
    """The digest of sample ``row``'s model inputs (one per input tensor, in order)."""
    return hashlib.sha256(b"".join(sample_digest(a[row]) for a in arrays)).digest()


def recovered(
    log_dir: Path,
    labels: dict[str, list[int]],
    names: list[str],
    task: Recovers,
    like: Any,
) -> Iterator[Item]:
    """(request id, stored sample or None, label, recovered, digest of the model input
    or None) of every labelled item; ``names``: the model's inputs, ``like``: a stored
    sample."""
    seen: set[str] = set()
    for r in LogReader(log_dir):
        if not usable(r) or r.id not in labels or r.id in seen:
            continue
        seen.add(r.id)
        assert r.inputs is not None
        model_inputs = all(n in r.inputs for n in names)
        arrays = [np.asarray(r.inputs[k]) for k in (names if model_inputs else r.inputs)]
        samples, ok = task.raw_samples(arrays, like)
        wanted = labels[r.id]
        if len(wanted) != len(samples):
            yield r.id, None, -1, False, None  # labels that do not match the batch
            continue
        for i, (sample, good, label) in enumerate(zip(samples, ok, wanted, strict=True)):
            digest = inputs_digest(arrays, i) if model_inputs else None
            yield r.id, sample if good else None, int(label), bool(good), digest


def wanted_digests(items: Iterable[Item]) -> tuple[set[bytes], set[bytes]]:
    """The digests of what would be written: stored samples, and model inputs."""
    wanted_raw: set[bytes] = set()
    wanted_inputs: set[bytes] = set()
    for _, sample, _, good, digest in items:
        if good:
            wanted_raw.add(sample_digest(sample))
            if digest is not None:
                wanted_inputs.add(digest)
    return wanted_raw, wanted_inputs


@dataclass
class Selection:
    """What :meth:`rows` took: the counts harvest.json reports and the request ids taken."""

    counts: dict[str, int] = field(
        default_factory=lambda: {
            "requests": 0,
            "samples": 0,
            "not_recovered": 0,
            "in_snapshot": 0,
            "repeated": 0,
        }
    )
    taken: list[str] = field(default_factory=list)

    def rows(
        self, items: Iterable[Item], known_raw: set[bytes], known_inputs: set[bytes]
    ) -> Iterator[tuple[str, Any, int]]:
        """(request id, sample, label) of each item to write: recovered, not in the snapshot
        (as stored, or as the model input it preprocesses to) and not repeated."""
        counts = self.counts
        written: set[bytes] = set()
        last = None
        for rid, sample, label, good, in_digest in items:
            if rid != last:
                counts["requests"] += 1
                self.taken.append(rid)
                last = rid
            if not good:
                counts["not_recovered"] += 1
                continue
            digest = sample_digest(sample)
            if digest in known_raw or in_digest in known_inputs:
                counts["in_snapshot"] += 1
            elif digest in written:
                counts["repeated"] += 1
            else:
                written.add(digest)
                counts["samples"] += 1
                yield rid, sample, label
