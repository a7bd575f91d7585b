"""Failed Great Expectations as readable lines: one per shard (or split) a rule failed on,
naming it, the column, the rule, what was expected and what was found.

The words come from each expectation's ``meta`` (``components.tasks.expectations``): ``rule``
(else the rule is said from the expectation's type and bounds), ``found`` (the table's column
holding the readable "found ..."), ``column``.

Library layer: imported by the validate step.
"""

from __future__ import annotations

from typing import Any

from components.tasks.data import EXAMPLES, show
from components.tasks.expectations import Table, range_text, set_text


def _rule(kind: str, kwargs: dict[str, Any], description: str | None) -> str:
    if kind == "expect_column_values_to_be_in_set":
        return f"values must be in {set_text(kwargs['value_set'])}"
    if kind == "expect_column_values_to_be_between":
        return f"values must be {range_text(kwargs)}"
    return f"{description or kind} failed"


def _int_like(value: Any) -> Any:
    """Great Expectations returns index values as strings when index columns mix types."""
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def describe_failure(table: Table, result: Any) -> list[str]:
    """Readable line(s) for one failed expectation: one per shard (or split) it failed on,
    naming it, the column, the rule, what was expected and what was found."""
    config = result.expectation_config
    kwargs, meta = dict(config.kwargs), dict(config.meta or {})
    res = result.result or {}
    column = meta.get("column") or kwargs.get("column")
    where = f"column '{column}'" if column else "table"
    info = result.exception_info or {}
    if info.get("raised_exception"):
        first = str(info.get("exception_message") or "unknown error").strip().splitlines()
        return [
            f"{table.name}: {where}: {config.description}: could not be evaluated "
            f"({first[0] if first else 'unknown error'})"
        ]
    rule = meta.get("rule") or _rule(config.type, kwargs, config.description)
    rows = list(res.get("partial_unexpected_index_list") or [])
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_name.setdefault(str(row.get("name")), []).append(row)
    lines = []
    for name, name_rows in by_name.items():
        if meta.get("found"):
            lines.append(f"{name}: {where}: {rule}; {_found(table, name, meta['found'], column)}")
        else:  # several rows per name (class_counts): "label 3: 0.61"
            shown = [
                f"label {show(_int_like(r.get('label')))}: {show(_value(table, r, column))}"
                for r in name_rows[:EXAMPLES]
            ]
            more = ", ..." if len(name_rows) > EXAMPLES else ""
            lines.append(
                f"{name}: {where}: {rule}; found {len(name_rows)} class(es) outside "
                f"(e.g. {'; '.join(shown)}{more})"
            )
    total = int(res.get("unexpected_count") or 0)
    if total > len(rows):
        lines.append(f"{table.name}: {where}: {rule}; and {total - len(rows)} more")
    return lines or [f"{table.name}: {where}: {rule}; found {total} unexpected"]


def _found(table: Table, name: str, column: str, checked: Any) -> str:
    match = table.frame[table.frame["name"] == name]
    if match.empty:
        return "found ?"
    text = match.iloc[0][column]
    return str(text) if isinstance(text, str) and text else f"found {match.iloc[0][checked]}"


def _value(table: Table, row: dict[str, Any], column: Any) -> Any:
    match = table.frame[
        (table.frame["name"] == row.get("name"))
        & (table.frame["label"] == _int_like(row.get("label")))
    ]
    return match.iloc[0][column] if not match.empty else "?"


def count(results: list[tuple[Table, Any]]) -> tuple[int, int, list[str]]:
    """Expectations evaluated, how many failed, and the readable lines (each once)."""
    evaluated, failed, lines = 0, 0, []
    for table, result in results:
        for expectation in result.results:
            evaluated += 1
            if not expectation.success:
                failed += 1
                lines += [x for x in describe_failure(table, expectation) if x not in lines]
    return evaluated, failed, lines
