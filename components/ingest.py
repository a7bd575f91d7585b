"""ingest: read raw data, verify it, split it and write the documented data set format.

What the source is and how it is read belong to the task's data format
(``components.tasks``: ``Task.data``): images from IDX files, image folders or the built-in
digits; texts from CSV/TSV/JSON Lines or the built-in reviews. This step only orchestrates:
read (and clean) through the format, check every input file's sha256 against
``ingest.sha256`` when declared, split stratified by class and deterministically for a seed
with identical samples always in the same split (so no sample leaks between train, val and
test), and write the splits, ``labels.json`` and a manifest atomically. See
``components.dataset`` for the layout.

``python -m components.ingest materialize`` writes the built-in digits as IDX files under
``data/raw/digits`` byte-identically on every machine, which is what ``data.dvc`` tracks.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from components import dataset
from components.artifacts import (
    StepError,
    atomic_path,
    combined_sha256,
    sha256_bytes,
    write_manifest,
)
from components.cli import output_dir, run_cli
from components.config import DEFAULT_PARAMS
from components.sources import join_uri
from components.step import Out, Step, Value
from components.tasks import Task
from components.tasks.data import RawData, SplitParams
from components.tasks.image_data import IngestParams, materialize_builtin_digits, write_idx

log = logging.getLogger(__name__)

DEFAULT_PARAMS_FILE = str(DEFAULT_PARAMS)  # named in messages when no --params is given

__all__ = ["IngestParams", "IngestResult", "SplitParams", "run", "write_idx"]


@dataclass(frozen=True)
class IngestResult:
    out_dir: Path
    counts: dict[str, dict[str, int]]
    data_sha256: str
    dropped: dict[str, int]


# --------------------------------------------------------------------------- split


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


# --------------------------------------------------------------------------- step


def _read(task: Task, params: Any, params_file: str) -> RawData:
    return task.data.read_raw(params, params_file)


def source_fingerprint(task: Task, params: Any, params_file: str = DEFAULT_PARAMS_FILE) -> str:
    """One sha256 over every raw input of the source: a cache key for orchestrators, so an
    ingest of a moving source (a URL, a bucket prefix) reruns exactly when its bytes change."""
    return combined_sha256(_read(task, params, params_file).input_sha256)


def run(
    params: Any,
    task: Task,
    out_dir: str | Path,
    *,
    params_file: str = DEFAULT_PARAMS_FILE,
    expected_source_sha256: str = "",
) -> IngestResult:
    """Read, verify and split the source; write the split files, labels.json and manifest.

    ``params`` is the ingest section as the task's data format reads it; ``params_file`` is
    only named in error messages about the params. With ``expected_source_sha256`` (the
    orchestrator's fingerprint, its cache key) the source must still hold those bytes, or
    nothing is written."""
    out_dir = Path(out_dir)
    fmt = task.data
    raw = _read(task, params, params_file)
    verify_sha256(params.sha256, raw.input_sha256, params.source, params_file)
    if expected_source_sha256 and combined_sha256(raw.input_sha256) != expected_source_sha256:
        raise StepError(
            f"{params.source} changed while the pipeline ran (its fingerprint was "
            f"{expected_source_sha256[:12]}…, now {combined_sha256(raw.input_sha256)[:12]}…); "
            "run the pipeline again"
        )
    if raw.samples.shape[0] == 0:
        raise StepError(f"{params.source}: no samples")
    facts = fmt.describe(raw.samples)
    log.info("read %d %ss %s from %s", raw.samples.shape[0], fmt.sample_noun, facts, params.source)
    for reason, count in raw.dropped.items():
        log.info("dropped %d %s(s): %s", count, fmt.sample_noun, reason)
    keys = fmt.sample_keys(raw.samples)
    indices = stratified_split(keys, raw.labels, params.split, fmt.sample_noun)

    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        counts: dict[str, dict[str, int]] = {}
        files = {s: fmt.split_file(s) for s in dataset.SPLITS}
        for split, idx in indices.items():
            fmt.write_split(tmp / files[split], raw.samples[idx], raw.labels[idx])
            per_class = Counter(raw.labels[idx].tolist())
            counts[split] = {
                raw.label_names[k]: int(per_class.get(k, 0)) for k in range(len(raw.label_names))
            }
            log.info("%s: %d samples", split, len(idx))
        dataset.write_label_names(tmp, raw.label_names, fmt.name, files)
        outputs = {f: tmp / f for f in files.values()}
        outputs["labels.json"] = tmp / "labels.json"
        manifest = write_manifest(
            tmp,
            "ingest",
            inputs={},
            outputs=outputs,
            params=asdict(params),
            extra={
                "source": params.source,
                "kind": params.kind,
                "format": fmt.name,
                "input_sha256": raw.input_sha256,
                "read": int(raw.samples.shape[0] + sum(raw.dropped.values())),
                "dropped": dict(raw.dropped),
                "counts": counts,
                "totals": {s: int(len(i)) for s, i in indices.items()},
                **facts,
            },
        )
        data_sha = _data_sha(manifest)
    return IngestResult(
        out_dir=out_dir, counts=counts, data_sha256=data_sha, dropped=dict(raw.dropped)
    )


def _data_sha(manifest_path: Path) -> str:
    outputs = json.loads(manifest_path.read_text())["outputs"]
    joined = "".join(f"{k}:{v['sha256']}" for k, v in sorted(outputs.items()))
    return sha256_bytes(joined.encode())


# --------------------------------------------------------------------------- CLI


STEP = Step(
    name="ingest",
    doc=__doc__,
    params=None,
    params_of_task=lambda task: task.data.ingest_params,
    sections=("task", "ingest"),
    run=run,
    outputs=(Out("data", "outputs/ingest", "out_dir", kfp="Dataset", help="the data set"),),
    values=(
        Value(
            "source_sha256",
            "expected_source_sha256",
            help="refuse to write unless the source still has this fingerprint",
        ),
    ),
    extra_deps=("data/raw",),
)


def main(argv: Sequence[str] | None = None) -> int:
    """The step CLI, plus ``materialize`` (write builtin:digits as IDX files)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["materialize"]:
        return STEP.main(argv[1:] if argv[:1] == ["run"] else argv)
    parser = argparse.ArgumentParser(prog="python -m components.ingest materialize")
    parser.add_argument("--out", default="data/raw/digits")
    args = parser.parse_args(argv[1:])

    def _go() -> None:
        for name, digest in materialize_builtin_digits(output_dir(args.out)).items():
            log.info("wrote %s/%s sha256=%s", args.out, name, digest)

    return run_cli(_go)


if __name__ == "__main__":
    sys.exit(main())
