"""Every Great Expectations suite of validate, in one module that the data formats extend.

validate checks tables of aggregated statistics (:class:`Table`: one row per shard, per split,
per class, per pair of splits), each against one suite:

- ``shards``: the rules every format has (:func:`shard_rules`: the shard's columns, no nulls,
  int64 labels within the label set), extended by the task's data format with rules on its
  own columns (``DataFormat.shard_expectations``: Great Expectations with the same ``meta``);
- ``splits``, ``class_counts``, ``split_overlap`` and ``duplicates`` (:func:`suites`).

An expectation's ``meta`` carries what a failure line says (``components.tasks.
expectation_failures``): ``rule`` (the rule in words), ``found`` (the column holding the
readable "found ...") and ``column`` (the data's column the rule is about).

:func:`run_suites` validates the tables in an in-memory context (nothing is sent anywhere)
and builds the Data Docs site, readable with no network (``components.core.data_docs``).

Library layer: imported by the data formats and the validate step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from components.core.artifacts import StepError
from components.core.data_docs import make_offline
from components.tasks.data import CommonValidateParams, DataFormat, show

if TYPE_CHECKING:
    import pandas as pd

# Before Great Expectations is first imported (lazily, below): no usage statistics sent anywhere.
os.environ["GX_ANALYTICS_ENABLED"] = "false"

log = logging.getLogger(__name__)

SITE_NAME = "validate"
PARTIAL_COUNT = 20  # unexpected rows Great Expectations keeps per expectation (lines shown)
LABEL_DTYPE = "int64"  # the documented stored label dtype (docs/data-format.md)


@dataclass(frozen=True)
class Table:
    """A table of statistics and the suite that checks it."""

    name: str  # also the Data Docs asset name
    frame: pd.DataFrame
    suite: str
    index_columns: list[str]  # identify an unexpected row in messages


# --------------------------------------------------------------------------- rule texts


def set_text(values: Iterable[Any]) -> str:
    """``{0..9}`` for three or more contiguous integers, else ``{a, b}``."""
    vals = list(values)
    ints = [v for v in vals if isinstance(v, int | np.integer) and not isinstance(v, bool)]
    if len(ints) == len(vals) >= 3 and sorted(ints) == list(range(min(ints), max(ints) + 1)):
        return f"{{{min(ints)}..{max(ints)}}}"
    return "{" + ", ".join(show(v) for v in vals) + "}"


def range_text(kwargs: dict[str, Any]) -> str:
    """``<= hi``, ``>= lo`` or ``within [lo, hi]`` of an expectation's ``min/max_value``."""
    lo, hi = kwargs.get("min_value"), kwargs.get("max_value")
    if lo is None:
        return f"<= {show(hi)}"
    if hi is None:
        return f">= {show(lo)}"
    return f"within [{show(lo)}, {show(hi)}]"


# --------------------------------------------------------------------------- builders


def in_set(column: str, value_set: list[Any], description: str, meta: dict[str, Any]) -> Any:
    """A column's values must be in ``value_set``."""
    import great_expectations.expectations as gxe

    return gxe.ExpectColumnValuesToBeInSet(
        column=column, value_set=value_set, description=description, meta=meta
    )


def between(column: str, description: str, meta: dict[str, Any], **bounds: Any) -> Any:
    """A column's values must be within ``bounds`` (``min_value`` and/or ``max_value``)."""
    import great_expectations.expectations as gxe

    return gxe.ExpectColumnValuesToBeBetween(
        column=column, **bounds, description=description, meta=meta
    )


def within(column: str, description: str, rule: str, low: Any, high: Any, **meta: Any) -> Any:
    """:func:`between` ``low`` and ``high`` (None: unbounded on that side), ``rule`` (its
    ``{range}`` in :func:`range_text`'s words) and ``meta`` its meta."""
    bounds = {"min_value": low, "max_value": high}
    rule = rule.format(range=range_text(bounds))
    return between(column, description, {"rule": rule, **meta}, **bounds)


# --------------------------------------------------------------------------- suites


def shard_rules(fmt: DataFormat, num_classes: int) -> list[Any]:
    """The rules every format's shards have (the format adds its own)."""
    classes = set_text(range(num_classes))
    names = ", ".join(fmt.arrow_schema().names)
    return [
        in_set(
            "schema",
            ["ok"],
            "shard columns",
            {
                "column": "schema",
                "rule": f"a shard's columns must be {names} (docs/data-format.md)",
                "found": "schema_found",
            },
        ),
        between(
            "nulls",
            "no nulls",
            {"rule": "values must not be null", "found": "nulls_found"},
            max_value=0,
        ),
        in_set(
            "label_dtype",
            [LABEL_DTYPE],
            "label dtype",
            {
                "column": "label",
                "rule": f"labels must be stored as {LABEL_DTYPE}",
                "found": "label_dtype_found",
            },
        ),
        *[
            between(
                column,
                "label set",
                {"column": "label", "rule": f"values must be in {classes}", "found": found},
                min_value=0,
                max_value=num_classes - 1,
            )
            for column, found in (("label_min", "label_found"), ("label_max", "label_found"))
        ],
    ]


def split_rules(params: CommonValidateParams) -> list[Any]:
    """Rows per split, and every class in every split."""
    return [
        within(
            "rows",
            "row count per split",
            "row count per split must be {range}",
            params.min_rows,
            params.max_rows,
            found="rows_found",
        ),
        between(
            "classes_missing",
            "every class present",
            {"column": "label", "rule": "every class must appear", "found": "classes_found"},
            max_value=0,
        ),
    ]


def class_count_rules(params: CommonValidateParams) -> list[Any]:
    """Each class's fraction of a split."""
    return [
        within(
            "fraction",
            "class balance",
            "each class must make up a fraction {range} of the split",
            params.class_fraction_min,
            params.class_fraction_max,
        )
    ]


def overlap_rules() -> list[Any]:
    """No sample in two splits."""
    return [
        between(
            "shared",
            "no leakage",
            {
                "column": "key",
                "rule": "a sample may appear in only one split",
                "found": "shared_found",
            },
            max_value=0,
        )
    ]


def duplicate_rules(params: CommonValidateParams, fmt: DataFormat) -> list[Any]:
    """Few exact duplicates per split, and one label per sample."""
    return [
        between(
            "duplicate_fraction",
            "duplicate rows",
            {
                "rule": f"at most {show(params.max_duplicate_fraction)} of a split's rows may "
                f"be exact duplicates ({fmt.duplicate_rule}) of another row",
                "found": "duplicates_found",
            },
            min_value=0,
            max_value=params.max_duplicate_fraction,
        ),
        between(
            "conflicting",
            "one label per sample",
            {
                "column": "label",
                "rule": f"identical {fmt.sample_noun}s (same key) must have one label",
                "found": "conflicts_found",
            },
            max_value=0,
        ),
    ]


def suites(
    params: CommonValidateParams, fmt: DataFormat, num_classes: int, format_rules: list[Any]
) -> dict[str, list[Any]]:
    """Every suite by name: the shard suite with the format's ``format_rules`` added."""
    return {
        "shards": shard_rules(fmt, num_classes) + format_rules,
        "splits": split_rules(params),
        "class_counts": class_count_rules(params),
        "split_overlap": overlap_rules(),
        "duplicates": duplicate_rules(params, fmt),
    }


# --------------------------------------------------------------------------- running


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
    tables: list[Table], suites: dict[str, list[Any]], docs_dir: Path
) -> list[tuple[Table, Any]]:
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
    make_offline(docs_dir)  # no CDN: the pages and the index's tables read with no network
    return results


def run_suites(
    tables: list[Table], suites: dict[str, list[Any]], docs_dir: Path
) -> list[tuple[Table, Any]]:
    """Validate every table against its suite; build the Data Docs site into ``docs_dir``.
    Any Great Expectations error is one readable line (a ``StepError``)."""
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
