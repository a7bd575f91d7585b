"""``paddle-mlops params schema``: the JSON Schema of ``params.yaml`` and its overlays.

Built from the params models the steps declare (``Step.params``, ``Step.shared``, a task's
data-format sections, each built-in task's ``task.options``), so it cannot drift from what
the steps accept: unknown keys, types, enums and ranges. One schema serves ``params.yaml``
and the task overlays (``extends``/``replace``, only what differs), so no field is required
in it; the loader reports a missing one. Editors read it from the first line of each params
file (``# yaml-language-server: $schema=...``); ``tests/test_params.py`` keeps the committed
:data:`SCHEMA_FILE` equal to what this writes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, TypeAdapter
from typing_extensions import TypedDict

from components.core.artifacts import StepError, write_text
from components.core.config import EXTENDS, REPLACE
from components.kernel.cli import run_cli
from components.kernel.step import AFTER_DEPLOY, REPO, all_steps, load
from components.tasks import available_tasks, is_builtin, task_class

SCHEMA_FILE = "params.schema.json"
# sections no step declares: the launcher's (pipelines/paddlejob.py) and Kubeflow's resources
PADDLEJOB = ("pipelines.paddlejob", "PaddleJobParams")
Resources = dict[str, dict[str, Any]]  # resources.<task>: requests, limits, node selector...


def _union(types: Sequence[Any]) -> Any:
    unique = list(dict.fromkeys(types))
    return unique[0] if len(unique) == 1 else typing.Union[tuple(unique)]  # noqa: UP007


def _options_type(task: type) -> Any:
    """The params model of a task's ``task.options`` (its constructor's ``options``)."""
    hint = typing.get_type_hints(task.__init__).get("options")
    return hint if hint is not None else dict[str, Any]


def section_types() -> dict[str, Any]:
    """Every section of a params file -> the type it is validated as (a union where the
    task decides: ``ingest``/``validate`` by its data format, ``task.options`` by the task)."""
    names = sorted(name for name in available_tasks() if is_builtin(name))  # plug-ins: not here
    tasks = [task_class(name) for name in names]
    by_task = {
        "ingest": _union([t.data.ingest_params for t in tasks]),
        "validate": _union([t.data.validate_params for t in tasks]),
    }
    task_section = TypedDict(  # type: ignore[operator]  # noqa: UP013
        "TaskSection",
        {
            "name": Literal[tuple(names)],  # type: ignore[misc]
            "options": _union([_options_type(t) for t in tasks]),
        },
        total=False,
    )
    task_section.__pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[attr-defined]
    types: dict[str, Any] = {"task": task_section}
    for step in (*all_steps(), *(load(name) for name in AFTER_DEPLOY)):
        if step.params is not None:
            types[step.name] = step.params
        elif step.params_of_task is not None:
            types[step.name] = by_task[step.name]
        for name, _, cls in step.shared:
            types.setdefault(name, cls)
    module, name = PADDLEJOB
    types["paddlejob"] = getattr(importlib.import_module(module), name)
    types["resources"] = Resources
    return types


def _no_required(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _no_required(v) for k, v in node.items() if k != "required"}
    if isinstance(node, list):
        return [_no_required(v) for v in node]
    return node


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a params file: ``params.yaml`` or an overlay."""
    fields: dict[str, Any] = {EXTENDS: str, REPLACE: list[str], **section_types()}
    params_file = TypedDict("ParamsFile", fields, total=False)  # type: ignore[operator]  # noqa: UP013
    params_file.__pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[attr-defined]
    doc = _no_required(TypeAdapter(params_file).json_schema())
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "paddle-mlops params file (params.yaml or a task overlay)",
        "description": f"Written by `paddle-mlops params schema` ({__name__}); do not edit.",
        **doc,
    }


def schema_text() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops params schema [--out FILE]``."""
    parser = argparse.ArgumentParser(prog="paddle-mlops params", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("schema", help=f"write the JSON Schema ({SCHEMA_FILE})")
    write.add_argument("--out", default=str(REPO / SCHEMA_FILE), help="default: %(default)s")
    args = parser.parse_args(argv)

    def _go() -> None:
        if args.command != "schema":  # pragma: no cover - argparse allows only schema
            raise StepError(f"unknown params command {args.command!r}")
        write_text(Path(args.out), schema_text())

    return run_cli(_go)
