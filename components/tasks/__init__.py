"""Tasks: the only code that knows a model family.

A task owns the model and its data: the data format (how raw data is read, stored, split and
validated: ``Task.data``), the preprocessing and the assets it fits, the optimizer and
schedule, and the input spec. Steps ask ``get_task(name, options)`` for it and never branch on
the task name. A task is found in ``_REGISTRY`` (the built-in ones) or through a Python entry
point of group ``paddle_mlops.tasks`` (``name = "module:Class"``) that any installed package
declares: adding a task changes no step (docs/tasks.md).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from components.core.artifacts import StepError
from components.core.config import params_source

if TYPE_CHECKING:
    from components.tasks.base import Task

# name -> "module:Class"; imported lazily so one task's heavy deps never load for another.
_REGISTRY: dict[str, str] = {
    "digits": "components.tasks.digits:DigitsTask",
    "digits_gan": "components.tasks.gan:DigitsGanTask",
    "image_folder": "components.tasks.image_folder:ImageFolderTask",
    "sentiment": "components.tasks.sentiment:SentimentTask",
}


ENTRY_POINT_GROUP = "paddle_mlops.tasks"


def _targets() -> dict[str, str]:
    """Every known task: the built-in ones, then those of installed packages' entry points
    (a name taken twice is refused: which one a pipeline ran must never depend on install
    order)."""
    targets = dict(_REGISTRY)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in targets and targets[ep.name] != ep.value:
            dist = ep.dist.name if ep.dist else "an installed package"
            raise StepError(
                f"task '{ep.name}': entry point {ep.value!r} of {dist} (group "
                f"{ENTRY_POINT_GROUP}) clashes with {targets[ep.name]!r}; rename one of them"
            )
        targets[ep.name] = ep.value
    return targets


def available_tasks() -> list[str]:
    return sorted(_targets())


def task_module(name: str) -> str | None:
    """The module that defines task ``name`` (None: no such task)."""
    target = _targets().get(name)
    return target.split(":")[0] if target else None


def task_class(name: str, *, source: str = "params.yaml") -> type[Task]:
    """The class of task ``name`` (its module imported); errors name ``source``."""
    try:
        target = _targets()[name]
    except KeyError as exc:
        raise StepError(
            f"{source}: task.name '{name}' is not a known task; choose one of {available_tasks()}"
        ) from exc
    module_name, cls_name = target.split(":")
    return getattr(importlib.import_module(module_name), cls_name)


def is_builtin(name: str) -> bool:
    """Whether task ``name`` ships with this repository (not a plugin's)."""
    return name in _REGISTRY


def get_task(
    name: str, options: dict[str, Any] | None = None, *, source: str = "params.yaml"
) -> Task:
    """The task ``name`` built from ``options``; errors name ``source`` (the params file)."""
    cls = task_class(name, source=source)
    return cls.from_options({} if options is None else options, where=f"{source}: task.options")


def task_from_params(all_params: dict[str, Any]) -> Task:
    """The task named by ``task.name`` with ``task.options`` (errors name the params file)."""
    source = params_source(all_params)
    if "task" not in all_params:
        raise StepError(f"{source}: missing section 'task' (task.name: one of {available_tasks()})")
    task_params = all_params.get("task") or {}
    if not isinstance(task_params, dict):
        raise StepError(f"{source}: task: expected a mapping, got {type(task_params).__name__}")
    return get_task(str(task_params.get("name", "")), task_params.get("options"), source=source)


def __getattr__(name: str) -> Any:
    """``Task`` on first use: a data format's worker process (ingest's, validate's pool)
    imports this package without paying for paddle, which ``tasks.base`` imports."""
    if name == "Task":
        from components.tasks.base import Task

        return Task
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ENTRY_POINT_GROUP",
    "Task",
    "available_tasks",
    "get_task",
    "is_builtin",
    "task_class",
    "task_from_params",
    "task_module",
]
