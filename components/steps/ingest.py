"""ingest: read raw data, verify it, split it and write the documented data set format.

What the source is and how it is read belong to the task's data format
(``components.tasks``: ``Task.data``): images from IDX files, image folders or the built-in
digits; texts from CSV/TSV/JSON Lines or the built-in reviews. This step only orchestrates:
read (and clean) through the format, check every input file's sha256 against
``ingest.sha256`` when declared, split stratified by class and deterministically for a seed
with identical samples always in the same split (so no sample leaks between train, val and
test), and write the splits, ``labels.json`` and a manifest atomically. See
``components.ml.data.dataset`` for the layout.

``python -m components.steps.ingest materialize`` writes the built-in digits as IDX files under
``data/raw/digits`` byte-identically on every machine, which is what ``data.dvc`` tracks.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError, atomic_path, combined_sha256, write_manifest
from components.kernel.cli import output_dir, run_cli, step_main
from components.kernel.step import Out, Step, Value
from components.ml.data import dataset, snapshot, stat_cache
from components.tasks import Task
from components.tasks import ingest_reduce as reduce
from components.tasks import ingest_units as units
from components.tasks.data import Skipped, SplitParams, label_names, skipped_of
from components.tasks.image_data import IngestParams, materialize_builtin_digits, write_idx
from components.tasks.ingest_reduce import DEFAULT_PARAMS_FILE

log = logging.getLogger(__name__)

__all__ = ["IngestParams", "IngestResult", "SplitParams", "run", "write_idx"]


@dataclass(frozen=True)
class IngestResult:
    out_dir: Path
    counts: dict[str, dict[str, int]]
    data_sha256: str
    dropped: dict[str, int]


def source_fingerprint(task: Task, params: Any, params_file: str = DEFAULT_PARAMS_FILE) -> str:
    """One sha256 over every raw input of the source: a cache key for orchestrators, so an
    ingest of a moving source (a URL, a bucket prefix) reruns exactly when its bytes change."""
    fmt = task.data
    hashes: dict[str, str] = {}
    for unit in fmt.units(params, params_file):
        hashes.update(fmt.unit_inputs(params, unit))
    return combined_sha256(hashes)


# --------------------------------------------------------------------------- map / reduce
# On one machine ``run`` maps the units on a process pool (``ingest.workers``) and reduces.
# An orchestrator spreads the map over nodes instead: ``plan_groups`` names the groups,
# ``run_map`` ingests one group's units into a part (shards + what the reduce needs), and
# ``run`` with ``parts`` reduces the parts into the snapshot (the KFP DAG: a ParallelFor).


def plan_groups(params: Any, task: Task, *, params_file: str = DEFAULT_PARAMS_FILE) -> list[str]:
    """``"i/n"`` for each of the ``n`` unit groups (``ingest.workers``, at most one per unit)."""
    return snapshot.groups(min(int(params.workers), len(task.data.units(params, params_file))))


def run_map(
    params: Any,
    task: Task,
    group: str,
    out_dir: str | Path,
    *,
    params_file: str = DEFAULT_PARAMS_FILE,
) -> int:
    """Ingest the units of ``group`` (every n-th unit, from the i-th) into ``out_dir``: their
    shards and a part file the reduce reads. Returns how many units it ingested."""
    index, count = snapshot.parse_group(group, "ingest")
    out_dir = Path(out_dir)
    with atomic_path(out_dir) as tmp:
        shard_dir = tmp / snapshot.SHARD_DIR
        shard_dir.mkdir(parents=True)
        listed = task.data.units(params, params_file)
        jobs = units.unit_jobs(params, task, shard_dir, params_file, {}, None, listed)
        mine = [(i, job) for i, job in enumerate(jobs) if i % count == index]
        results = units.map_units([job for _, job in mine], snapshot.WorkerPool(1))
        reduce.check_unreadable(results, task.data.sample_noun)
        units.write_part(tmp, [i for i, _ in mine], results, skipped_of(listed))
    log.info("ingest group %s: %d of %d units", group, len(mine), len(jobs))
    return len(mine)


# --------------------------------------------------------------------------- step


def run(
    params: Any,
    task: Task,
    out_dir: str | Path,
    *,
    params_file: str = DEFAULT_PARAMS_FILE,
    expected_source_sha256: str = "",
    parts: Sequence[str | Path] | None = None,
) -> IngestResult:
    """Read, verify and split the source into a snapshot of Parquet shards.

    ``params`` is the ingest section as the task's data format reads it; ``params_file`` is
    only named in error messages about the params. Units whose inputs did not change since
    the snapshot already in ``out_dir`` keep their shards (linked, not rewritten). With
    ``parts`` (what :func:`run_map` wrote for every group) the units are not read here, only
    reduced. With ``expected_source_sha256`` (the orchestrator's fingerprint, its cache key)
    the source must still hold those bytes, or nothing is written."""
    out_dir = Path(out_dir)
    fmt = task.data
    fixed_names = fmt.fixed_label_names(params, params_file)
    previous, previous_root = units.previous_units(out_dir)
    cache = stat_cache.load(out_dir)
    started_ns = stat_cache.clock()  # before any input is stat-ed (the racy-entry rule)
    pool = snapshot.WorkerPool(params.workers, units.worker_modules(fmt))
    with atomic_path(out_dir) as tmp, pool:
        shard_dir = tmp / snapshot.SHARD_DIR
        shard_dir.mkdir(parents=True)
        if parts is not None:
            results = units.read_parts([Path(p) for p in parts], shard_dir)
            skipped = units.read_skipped([Path(p) for p in parts])
        else:
            listed = fmt.units(params, params_file)
            # units the last snapshot lacks will be read: their workers start (and import)
            # while the old units are stat-ed and matched
            pool.start(units.new_units(listed, previous))
            skipped = skipped_of(listed)
            _log_skipped(params, skipped)
            jobs = units.unit_jobs(
                params, task, shard_dir, params_file, previous, previous_root, listed, cache
            )
            results = units.map_units(jobs, pool)
        reduce.check_unreadable(results, fmt.sample_noun)
        inputs = reduce.checked_inputs(params, results, expected_source_sha256, params_file)
        total = sum(r.rows for r in results)
        if total == 0:
            raise StepError(f"{params.source}: no samples")
        names = label_names(fixed_names, reduce.label_files(fmt, params, results), params_file)
        reduce.check_conflicts(results, fmt.sample_noun)
        facts = reduce.merged_facts(fmt, params.source, results)
        t = reduce.tally(results, names)
        log.info(
            "%d %ss in %d units (%d reused from the last snapshot, %d read): %s",
            total, fmt.sample_noun, len(results), t.reused, len(results) - t.reused, t.totals,
        )  # fmt: skip
        for reason, count in t.dropped.items():
            if count:
                log.info("dropped %d %s(s): %s", count, fmt.sample_noun, reason)
        snapshot.write_manifest(tmp, reduce.snapshot_doc(fmt.name, params, t, results, facts))
        dataset.write_label_names(tmp, names, fmt.name)
        units.write_unit_index(tmp, results)
        units.write_stat_cache(tmp, results, started_ns)
        write_manifest(
            tmp,
            "ingest",
            inputs={},
            outputs={
                snapshot.SNAPSHOT_FILE: tmp / snapshot.SNAPSHOT_FILE,
                "labels.json": tmp / "labels.json",
            },
            params=asdict(params),
            extra=reduce.manifest_extra(params, fmt.name, inputs, t, results, facts, skipped),
        )
        data_sha = combined_sha256({s["path"]: s["sha256"] for s in t.shards})
    return IngestResult(out_dir, t.counts, data_sha, {k: int(v) for k, v in t.dropped.items()})


def _log_skipped(params: Any, skipped: Skipped) -> None:
    """One line for every file the listing passed over (by reason, an example each)."""
    total = sum(skipped.counts.values())
    if total:
        rule = getattr(params, "extensions", None)
        why = f" (not in ingest.extensions {list(rule)})" if rule is not None else ""
        log.warning("%s: skipped %d file(s)%s: %s", params.source, total, why, skipped.summary())


# --------------------------------------------------------------------------- CLI


STEP = Step(
    name="ingest",
    doc=__doc__,
    params=None,
    params_of_task=lambda task: task.data.ingest_params,
    sections=("task", "ingest"),
    run=run,
    outputs=(
        Out(
            "data",
            "outputs/ingest",
            "out_dir",
            kfp="Dataset",
            dvc="snapshot",
            help="the data set (a snapshot; unchanged inputs keep their shards)",
        ),
    ),
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
        return step_main(STEP, argv[1:] if argv[:1] == ["run"] else argv)
    parser = argparse.ArgumentParser(prog="python -m components.steps.ingest materialize")
    parser.add_argument("--out", default="data/raw/digits")
    args = parser.parse_args(argv[1:])

    def _go() -> None:
        for name, digest in materialize_builtin_digits(output_dir(args.out)).items():
            log.info("wrote %s/%s sha256=%s", args.out, name, digest)

    return run_cli(_go)


if __name__ == "__main__":
    sys.exit(main())
