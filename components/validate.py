"""validate: check an ingested data set with a Great Expectations suite before training.

Reads the split files and ``labels.json`` (see ``components.dataset``) without changing
types, turns them into four kinds of tables and validates them with Great Expectations (an
in-memory context; nothing is sent anywhere). The task's data format
(``components.tasks``: ``Task.data``) says what a sample row holds and what it must satisfy;
the rest is the same for every format:

- one ``samples`` table per split file, one row per sample, with the format's columns and
  rules. Images (``components.tasks.image_data``): label, image shape, image and label dtype,
  pixel range, NaNs and a sha256 of the sample's bytes; rules on columns, dtypes, image shape
  (``validate.image_shape`` or the train split's), pixel range. Texts
  (``components.tasks.text_data``): type, valid UTF-8, length in characters within
  ``validate.min_chars``..``validate.max_chars``, not blank. Both: label set, no nulls, every
  class present, row count within ``validate.min_rows``..``validate.max_rows``.
- ``class_counts``: the fraction of each class per split, which must lie within
  ``validate.class_fraction_min``..``validate.class_fraction_max``.
- ``split_hashes``: the distinct samples of each split; a sample may appear in only one split.
- ``duplicates``: per split, the rows that repeat an earlier row of the same split exactly (same
  sample and label); their share must be at most ``validate.max_duplicate_fraction``.

Outputs (written atomically, also when the data fails): ``result.json`` (the Great Expectations
validation results), ``data_docs/index.html`` (the Data Docs site), ``summary.json`` and
``manifest.json``. A failed expectation makes the step exit non-zero with one readable line per
broken rule, naming the file, column, rule, what was expected and what was found.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from components import dataset
from components.artifacts import StepError, atomic_path, write_json, write_manifest
from components.step import DATA, Out, Step
from components.tasks import Task
from components.tasks.data import CommonValidateParams, check_format, read_split

# Before Great Expectations is first imported (lazily, below): no usage statistics sent anywhere.
os.environ["GX_ANALYTICS_ENABLED"] = "false"

log = logging.getLogger(__name__)

SITE_NAME = "validate"
EXAMPLES = 3  # unexpected values quoted per failure line
PARTIAL_COUNT = 20  # unexpected values Great Expectations keeps per expectation

CLASS_COUNT_COLUMNS = ["file", "split", "label", "count", "fraction"]
SPLIT_HASH_COLUMNS = ["file", "split", "index", "sample_sha"]
DUPLICATE_COLUMNS = ["file", "split", "rows", "duplicate_rows", "duplicate_fraction"]


@dataclass(frozen=True)
class ValidateResult:
    """A validation that returns passed (a failed one raises, listing every failure)."""

    evaluated: int


# --------------------------------------------------------------------------- tables


def class_count_table(
    samples: dict[str, pd.DataFrame], num_classes: int, files: dict[str, str]
) -> pd.DataFrame:
    """Fraction of each valid, present class per split (absent classes and invalid labels are
    reported by the samples suite, so they are not repeated here)."""
    rows = []
    for split, frame in samples.items():
        total = len(frame)
        counts = frame["label"].value_counts(dropna=True)
        for label, count in counts.items():
            if float(label).is_integer() and 0 <= int(label) < num_classes:
                rows.append((files[split], split, int(label), int(count), int(count) / total))
    table = pd.DataFrame(rows, columns=CLASS_COUNT_COLUMNS)
    return table.sort_values(["file", "label"], ignore_index=True)


def split_hash_table(samples: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Distinct samples per split, sorted by hash so that shared samples sit side by side."""
    parts = [f[SPLIT_HASH_COLUMNS].dropna(subset=["sample_sha"]) for f in samples.values()]
    table = pd.concat(parts, ignore_index=True).drop_duplicates(["split", "sample_sha"])
    return table.sort_values(["sample_sha", "file"], ignore_index=True)


def duplicate_table(samples: dict[str, pd.DataFrame], files: dict[str, str]) -> pd.DataFrame:
    """Per split: rows, and rows that repeat an earlier row of the same split exactly (same
    sample and label; the first occurrence is not counted), as a count and fraction."""
    rows = []
    for split, frame in samples.items():
        total = len(frame)
        hashed = frame.dropna(subset=["sample_sha"])
        dup = int(hashed.duplicated(subset=["sample_sha", "label"], keep="first").sum())
        rows.append((files[split], split, total, dup, dup / total if total else 0.0))
    return pd.DataFrame(rows, columns=DUPLICATE_COLUMNS)


# --------------------------------------------------------------------------- suites


def _class_count_expectations(params: CommonValidateParams) -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectTableColumnsToMatchSet(
            column_set=CLASS_COUNT_COLUMNS, exact_match=True, description="schema"
        ),
        *[
            gxe.ExpectColumnValuesToNotBeNull(column=c, description="no nulls")
            for c in CLASS_COUNT_COLUMNS
        ],
        gxe.ExpectColumnValuesToBeBetween(
            column="fraction",
            min_value=params.class_fraction_min,
            max_value=params.class_fraction_max,
            description="class balance",
        ),
    ]


def _split_hash_expectations() -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectTableColumnsToMatchSet(
            column_set=SPLIT_HASH_COLUMNS, exact_match=True, description="schema"
        ),
        gxe.ExpectColumnValuesToBeUnique(column="sample_sha", description="no leakage"),
    ]


def _duplicate_expectations(params: CommonValidateParams) -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectTableColumnsToMatchSet(
            column_set=DUPLICATE_COLUMNS, exact_match=True, description="schema"
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="duplicate_fraction",
            min_value=0,
            max_value=params.max_duplicate_fraction,
            description="duplicate rows",
        ),
    ]


@dataclass(frozen=True)
class _Table:
    name: str  # also the Data Docs asset name
    frame: pd.DataFrame
    suite: str
    index_columns: list[str]  # identify an unexpected row in messages
    detail: str = ""  # what "the same" means for this table's rows (duplicates)


def _context(docs_dir: Path) -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
        data_docs_sites={
            SITE_NAME: {
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(docs_dir),
                },
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            }
        },
    )
    return gx.get_context(project_config=config, mode="ephemeral")


def _run_suites(
    tables: list[_Table], suites: dict[str, list[Any]], docs_dir: Path
) -> list[tuple[_Table, Any]]:
    """Validate every table against its suite; build the Data Docs site into ``docs_dir``."""
    import great_expectations as gx

    context = _context(docs_dir)
    source = context.data_sources.add_pandas("ingested")
    gx_suites = {}
    for name, expectations in suites.items():
        suite = context.suites.add(gx.ExpectationSuite(name=name))
        for expectation in expectations:
            suite.add_expectation(expectation)
        gx_suites[name] = suite
    results = []
    for table in tables:
        batch = source.add_dataframe_asset(table.name).add_batch_definition_whole_dataframe("all")
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=table.name, data=batch, suite=gx_suites[table.suite])
        )
        result = definition.run(
            batch_parameters={"dataframe": table.frame},
            result_format={
                "result_format": "SUMMARY",
                "partial_unexpected_count": PARTIAL_COUNT,
                "unexpected_index_column_names": table.index_columns,
            },
        )
        results.append((table, result))
    context.build_data_docs(site_names=[SITE_NAME])
    return results


# --------------------------------------------------------------------------- messages


def _num(value: Any) -> str:
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | float | np.integer | np.floating):
        v = float(value)
        if np.isnan(v):
            return "NaN"
        return str(int(v)) if v.is_integer() else f"{v:.4g}"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _set(values: Iterable[Any]) -> str:
    vals = list(values)
    ints = [v for v in vals if isinstance(v, int | np.integer) and not isinstance(v, bool)]
    if len(ints) == len(vals) >= 3 and sorted(ints) == list(range(min(ints), max(ints) + 1)):
        return f"{{{min(ints)}..{max(ints)}}}"
    return "{" + ", ".join(_num(v) for v in vals) + "}"


def _range(kwargs: dict[str, Any]) -> str:
    lo, hi = kwargs.get("min_value"), kwargs.get("max_value")
    if lo is None:
        return f"<= {_num(hi)}"
    if hi is None:
        return f">= {_num(lo)}"
    return f"within [{_num(lo)}, {_num(hi)}]"


def _int_like(value: Any) -> Any:
    """Great Expectations returns index values as strings when index columns mix types."""
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def _group_by_file(rows: list[dict[str, Any]], table: _Table) -> dict[str, list[dict[str, Any]]]:
    if "file" not in table.index_columns:
        return {table.name: rows}
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row.get("file")), []).append(row)
    return groups


def _examples(rows: list[dict[str, Any]], column: str, table: _Table, *, nulls: bool) -> str:
    """`` (e.g. 42 at index 3, 'int16' at indices 0, 1, 2)`` from the unexpected rows GE kept."""
    if not rows:
        return ""
    if table.index_columns != ["index"]:  # e.g. class_counts: "label 3: 0.61"
        keys = [c for c in table.index_columns if c != "file"]
        shown = [
            ", ".join(f"{c} {_num(_int_like(r.get(c)))}" for c in keys) + f": {_num(r.get(column))}"
            for r in rows[:EXAMPLES]
        ]
        return f" (e.g. {'; '.join(shown)})"
    by_value: dict[str, list[str]] = {}
    for row in rows:
        key = "" if nulls else _num(row.get(column))
        by_value.setdefault(key, []).append(str(_int_like(row.get("index"))))
    parts = []
    for value, idx in list(by_value.items())[:EXAMPLES]:
        more = ", ..." if len(idx) > EXAMPLES else ""
        where = (
            f"at index {idx[0]}"
            if len(idx) == 1
            else (f"at indices {', '.join(idx[:EXAMPLES])}{more}")
        )
        parts.append(f"{value} {where}".strip())
    return f" (e.g. {', '.join(parts)})"


def describe_failure(table: _Table, result: Any) -> list[str]:
    """Readable line(s) for one failed expectation: file, column, rule, expected vs found."""
    config = result.expectation_config
    kind, kwargs = config.type, dict(config.kwargs)
    res = result.result or {}
    column = kwargs.get("column")
    where = f"column '{column}'" if column else "table"
    info = result.exception_info or {}
    if info.get("raised_exception"):
        first = str(info.get("exception_message") or "unknown error").strip().splitlines()
        return [
            f"{table.name}: {where}: {config.description}: could not be evaluated "
            f"({first[0] if first else 'unknown error'})"
        ]

    if kind == "expect_table_columns_to_match_set":
        mismatch = (res.get("details") or {}).get("mismatched") or {}
        return [
            f"{table.name}: table: columns must be {_set(kwargs['column_set'])}; missing "
            f"{sorted(mismatch.get('missing', []))}, unexpected "
            f"{sorted(mismatch.get('unexpected', []))}"
        ]
    if kind == "expect_table_row_count_to_be_between":
        return [
            f"{table.name}: table: row count must be {_range(kwargs)}; "
            f"found {res.get('observed_value')}"
        ]
    if kind == "expect_column_distinct_values_to_contain_set":
        missing = res.get("partial_missing_list") or []
        more = int(res.get("missing_count") or len(missing)) - len(missing)
        extra = f" and {more} more" if more > 0 else ""
        return [f"{table.name}: {where}: every class must appear; missing {_set(missing)}{extra}"]
    if kind == "expect_column_values_to_be_unique":
        return [_describe_leak(table, column, res)]
    if kind == "expect_column_values_to_be_between" and column == "duplicate_fraction":
        return [
            f"{row.get('file')}: column '{column}': at most {_num(kwargs.get('max_value'))} of "
            f"a split's rows may be exact duplicates ({table.detail}) of another "
            f"row; found {_num(_int_like(row.get('duplicate_rows')))} of "
            f"{_num(_int_like(row.get('rows')))} rows ({float(row.get(column) or 0):.3f})"
            for row in res.get("partial_unexpected_index_list") or [{}]
        ]

    rows = list(res.get("partial_unexpected_index_list") or [])
    nulls = kind == "expect_column_values_to_not_be_null"
    found = "nulls" if nulls else "unexpected"
    if nulls:
        rule = "values must not be null"
    elif kind == "expect_column_values_to_be_in_set":
        rule = f"values must be in {_set(kwargs['value_set'])}"
    elif kind == "expect_column_values_to_be_between" and column == "fraction":
        rule = f"each class must make up a fraction {_range(kwargs)} of the split"
        found = "class(es) outside"
    elif kind == "expect_column_values_to_be_between":
        rule = f"values must be {_range(kwargs)}"
    else:
        rule = f"{config.description or kind} failed"
    total = int(res.get("unexpected_count") or 0)
    groups = _group_by_file(rows, table)
    lines = []
    for name, file_rows in groups.items():
        count = total if len(groups) == 1 else len(file_rows)
        example = _examples(file_rows, str(column), table, nulls=nulls)
        lines.append(f"{name}: {where}: {rule}; found {count} {found}{example}")
    return lines or [f"{table.name}: {where}: {rule}; found {total} {found}"]


def _describe_leak(table: _Table, column: str | None, res: dict[str, Any]) -> str:
    rows = list(res.get("partial_unexpected_index_list") or [])
    by_sha: dict[str, list[str]] = {}
    files: list[str] = []
    for row in rows:
        file = str(row.get("file"))
        by_sha.setdefault(str(row.get(column)), []).append(f"{file}[{_int_like(row.get('index'))}]")
        if file not in files:
            files.append(file)
    pairs = [" == ".join(v) for v in by_sha.values() if len(v) > 1][:EXAMPLES]
    example = f" (e.g. {'; '.join(pairs)})" if pairs else ""
    return (
        f"{', '.join(sorted(files)) or table.name}: column '{column}': a sample may appear in "
        f"only one split; found {res.get('unexpected_count')} rows whose sample is in another "
        f"split{example}"
    )


# --------------------------------------------------------------------------- step


def _checked_run(
    tables: list[_Table], suites: dict[str, list[Any]], docs_dir: Path
) -> list[tuple[_Table, Any]]:
    """:func:`_run_suites`, with any Great Expectations error as one readable line."""
    try:
        return _run_suites(tables, suites, docs_dir)
    except StepError:
        raise
    except Exception as exc:  # no Great Expectations traceback reaches the user
        log.debug("great_expectations failed", exc_info=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise StepError(
            f"validate: Great Expectations failed: {type(exc).__name__}: {first}"
        ) from exc


def _count(results: list[tuple[_Table, Any]]) -> tuple[int, list[tuple[Any, list[str]]]]:
    """Expectations evaluated, and each failed one with its readable description lines."""
    evaluated, failures = 0, []
    for table, result in results:
        for expectation in result.results:
            evaluated += 1
            if not expectation.success:
                failures.append((expectation, describe_failure(table, expectation)))
    return evaluated, failures


def _duplicate_summary(duplicates: pd.DataFrame) -> dict[str, dict[str, Any]]:
    return {
        str(r.file): {
            "rows": int(r.rows),
            "duplicate_rows": int(r.duplicate_rows),
            "duplicate_fraction": float(r.duplicate_fraction),
        }
        for r in duplicates.itertuples()
    }


def _tables(
    samples: dict[str, pd.DataFrame], num_classes: int, files: dict[str, str], same: str
) -> tuple[list[_Table], pd.DataFrame]:
    """Every table a suite runs on (per-split samples, class counts, split hashes,
    duplicates), and the duplicates table itself."""
    tables = [_Table(files[s], f, "samples", ["index"]) for s, f in samples.items()]
    tables.append(
        _Table(
            "class_counts",
            class_count_table(samples, num_classes, files),
            "class_counts",
            ["file", "label"],
        )
    )
    tables.append(
        _Table("split_hashes", split_hash_table(samples), "split_hashes", ["file", "index"])
    )
    duplicates = duplicate_table(samples, files)
    tables.append(
        _Table("duplicates", duplicates, "duplicates", ["file", "rows", "duplicate_rows"], same)
    )
    return tables, duplicates


def run(
    params: CommonValidateParams, task: Task, data_dir: str | Path, out_dir: str | Path
) -> ValidateResult:
    """Validate the ingested data set in ``data_dir`` with the rules of ``task``'s data
    format (``params`` is the validate section as that format reads it); write the results to
    ``out_dir``.

    Raises ``StepError`` listing every broken expectation after the outputs are written.
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    fmt = task.data
    names = dataset.read_label_names(data_dir)
    check_format(data_dir, fmt, task.name)
    paths = {s: dataset.split_path(data_dir, s) for s in dataset.SPLITS}
    files = {s: p.name for s, p in paths.items()}
    splits = {s: read_split(fmt, data_dir, s) for s in dataset.SPLITS}
    samples = {s: fmt.sample_table(s, files[s], d) for s, d in splits.items()}
    sample_rules, facts = fmt.sample_expectations(params, len(names), splits)
    log.info(
        "validating %s (%s data %s), %d classes",
        {s: len(f) for s, f in samples.items()},
        fmt.name,
        facts,
        len(names),
    )

    tables, duplicates = _tables(samples, len(names), files, fmt.duplicate_rule)
    suites = {
        "samples": sample_rules,
        "class_counts": _class_count_expectations(params),
        "split_hashes": _split_hash_expectations(),
        "duplicates": _duplicate_expectations(params),
    }
    for row in duplicates.itertuples():
        log.info(
            "%s: %d of %d rows are exact duplicates (%.4f)",
            row.file,
            row.duplicate_rows,
            row.rows,
            row.duplicate_fraction,
        )

    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        results = _checked_run(tables, suites, (tmp / "data_docs").resolve())
        evaluated, failures = _count(results)
        success = not failures
        write_json(
            tmp / "result.json",
            {"success": success, "validation_results": [r.to_json_dict() for _, r in results]},
        )
        write_json(
            tmp / "summary.json",
            {
                "success": success,
                "evaluated": evaluated,
                "failed": len(failures),
                "failures": [f for _, lines in failures for f in lines],
                "format": fmt.name,
                **facts,
                "rows": {t.name: len(t.frame) for t in tables},
                "duplicates": _duplicate_summary(duplicates),
                "data_docs": "data_docs/index.html",
            },
        )
        inputs: dict[str, str | Path] = {files[s]: p for s, p in paths.items()}
        inputs["labels.json"] = data_dir / "labels.json"
        write_manifest(
            tmp,
            "validate",
            inputs=inputs,
            outputs={
                "result.json": tmp / "result.json",
                "summary.json": tmp / "summary.json",
                "data_docs": tmp / "data_docs",
            },
            params=asdict(params),
            extra={"success": success, "evaluated": evaluated, "failed": len(failures)},
        )
    failed = len(failures)
    lines = [f for _, described in failures for f in described]
    log.info(
        "validate: %d expectations evaluated, %d failed; Data Docs at %s",
        evaluated,
        failed,
        out_dir / "data_docs" / "index.html",
    )
    if not success:
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

main = STEP.main

if __name__ == "__main__":
    sys.exit(main())
