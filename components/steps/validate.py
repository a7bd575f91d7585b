"""validate: check an ingested data set with a Great Expectations suite before training.

Streams the snapshot (``components.ml.data.snapshot``) shard by shard and never holds a split: each
shard's sha256 is checked against ``snapshot.json`` as it is read (a corrupt or missing shard
is one line naming it and the sha256 the manifest pins), then its Arrow record batches are
added up into one row of statistics. That is a map over the shards (a process pool of
``validate.workers``; on Kubeflow a ``ParallelFor`` over shard groups: :func:`plan_groups`,
:func:`run_map`, ``run(parts=...)``), followed by a reduce. Great Expectations (an
in-memory context; nothing is sent anywhere) then checks the aggregated tables:

- ``<split>_shards``: one row per shard. The rules every format has: the shard's columns
  (``docs/data-format.md``), no nulls, labels stored as int64 and within the label set. The
  task's data format (``Task.data``) adds its own columns and rules: images
  (``components.tasks.image_data``) the pixel dtype (``validate.expected_dtype``), the
  shape (``validate.image_shape`` or the train split's), that an image holds H x W x C
  values, the pixel range (``validate.pixel_min``..``pixel_max``) and NaNs; texts
  (``components.tasks.text_data``) the type, valid UTF-8, blank texts and the length in
  characters (``validate.min_chars``..``max_chars``).
- ``splits``: the rows of each split (``validate.min_rows``..``max_rows``) and that every
  class appears in it.
- ``class_counts``: the fraction of each class per split, within
  ``validate.class_fraction_min``..``class_fraction_max``.
- ``split_overlap``: per pair of splits, the samples (keys) they share; a sample may appear
  in only one split.
- ``duplicates``: per split, the rows that repeat an earlier row exactly (same key and
  label), at most ``validate.max_duplicate_fraction`` of the split, and the samples (keys)
  stored under more than one label (none allowed).

Memory: a batch of :data:`BATCH_ROWS` rows per process, plus the key sets. Duplicates and
overlap are exact: every row contributes its 32-byte key and its 8-byte label (40 bytes),
the reduce sorts one split's pairs at a time and keeps each split's distinct keys (32
bytes a sample) for the overlap: 1.28M samples are 51 MB of pairs and 41 MB of keys; the
reduce's peak is about 120 bytes a sample (measured: 156 MB for 1.28M samples in one split).
Nothing else grows with the data set (a shard table row per shard aside).

Outputs (written atomically, also when the data fails): ``result.json`` (the Great
Expectations validation results), ``data_docs/index.html`` (the Data Docs site, readable with
no network: ``components.core.data_docs``),
``summary.json`` and ``manifest.json``. A failed expectation makes the step exit non-zero
with one readable line per broken rule, naming the shard (or split), the column, the rule,
what was expected and what was found.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from components.core.artifacts import StepError, atomic_path
from components.kernel.step import DATA, Out, Step
from components.ml.data import dataset, snapshot
from components.tasks import Task, expectations
from components.tasks import validation_report as report
from components.tasks.data import CommonValidateParams, check_format
from components.tasks.shard_reduce import reduce
from components.tasks.shard_statistics import (
    ShardResult,
    map_shards,
    read_parts,
    shard_jobs,
    write_part,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValidateResult:
    """A validation that returns passed (a failed one raises, listing every failure)."""

    evaluated: int


# ---------------------------------------------------------------- map / reduce on an orchestrator
# On one machine ``run`` maps the shards on a process pool (``validate.workers``) and
# reduces. An orchestrator spreads the map over nodes instead: ``plan_groups`` names the
# groups, ``run_map`` adds up one group's shards into a part, and ``run`` with ``parts``
# reduces the parts (the KFP DAG: a ParallelFor over the groups, then the reduce).


def plan_groups(params: CommonValidateParams, data_dir: str | Path) -> list[str]:
    """``"i/n"`` for each of the ``n`` shard groups (``validate.workers``, at most one per
    shard)."""
    return snapshot.groups(min(int(params.workers), len(snapshot.load(data_dir).shards)))


def run_map(
    params: CommonValidateParams,
    task: Task,
    data_dir: str | Path,
    group: str,
    out_dir: str | Path,
) -> int:
    """Add up the shards of ``group`` (every n-th shard, from the i-th) of the snapshot in
    ``data_dir`` into a part in ``out_dir``. Returns how many shards it read."""
    index, count = snapshot.parse_group(group, "validate")
    fmt = task.data
    snap = snapshot.load(data_dir)
    check_format(data_dir, fmt, task.name)
    jobs = shard_jobs(params, fmt, snap, len(dataset.read_label_names(data_dir)))
    mine = [(i, job) for i, job in enumerate(jobs) if i % count == index]
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        write_part(tmp, snap, mine)
    log.info("validate group %s: %d of %d shards", group, len(mine), len(jobs))
    return len(mine)


# --------------------------------------------------------------------------- step


def run(
    params: CommonValidateParams,
    task: Task,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    parts: Sequence[str | Path] | None = None,
) -> ValidateResult:
    """Validate the snapshot in ``data_dir`` with the rules of ``task``'s data format
    (``params`` is the validate section as that format reads it); write the results to
    ``out_dir``. With ``parts`` (what :func:`run_map` wrote for every group) the shards are
    not read here, only reduced.

    Raises ``StepError`` listing every broken expectation after the outputs are written.
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    fmt = task.data
    snap = snapshot.load(data_dir)
    names = dataset.read_label_names(data_dir)
    check_format(data_dir, fmt, task.name)
    if parts is not None:
        results: Iterable[ShardResult] = read_parts([Path(p) for p in parts], snap)
    else:
        results = map_shards(shard_jobs(params, fmt, snap, len(names)), params.workers)
    reduced = reduce(results, snap, fmt, len(names))
    format_rules, facts = fmt.shard_expectations(params, reduced.facts)
    report.log_reduced(reduced, snap, fmt.name, facts, len(names))
    suites = expectations.suites(params, fmt, len(names), format_rules)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        checked = expectations.run_suites(reduced.tables, suites, (tmp / "data_docs").resolve())
        outcome = report.write_report(
            tmp,
            checked,
            params=params,
            data_dir=data_dir,
            snap=snap,
            fmt_name=fmt.name,
            facts=facts,
            reduced=reduced,
        )
    evaluated, failed, lines = outcome.evaluated, outcome.failed, outcome.lines
    log.info(
        "validate: %d expectations evaluated, %d failed; Data Docs at %s",
        evaluated,
        failed,
        out_dir / "data_docs" / "index.html",
    )
    if not outcome.success:
        raise StepError(
            f"data validation failed ({failed} of {evaluated} expectations; details in "
            f"{out_dir / 'summary.json'}):\n" + "\n".join(f"  - {f}" for f in lines)
        )
    return ValidateResult(evaluated=evaluated)


STEP = Step(
    name="validate",
    doc=__doc__,
    params=None,
    params_of_task=lambda task: task.data.validate_params,
    sections=("task", "validate"),
    run=run,
    inputs=(DATA,),
    outputs=(
        Out("report", "outputs/validate", "out_dir", help="summary, suites, Data Docs"),
        Out("data_docs", "", "", kfp="HTML", derived_from=("report", "data_docs/index.html")),
    ),
)
