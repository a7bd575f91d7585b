"""Tasks: the only code that knows a model family.

A task owns the model and its data: the data format (how raw data is read, stored, split and
validated: ``Task.data``), the preprocessing and the assets it fits, the optimizer and
schedule, and the input spec. Steps ask
``get_task(name, options)`` for it and never branch on the task name, so adding a task means
adding a module here and a line in ``_REGISTRY`` — no step changes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from components.artifacts import StepError

if TYPE_CHECKING:
    from components.tasks.base import Task

# name -> "module:Class"; imported lazily so one task's heavy deps never load for another.
_REGISTRY: dict[str, str] = {
    "digits": "components.tasks.digits:DigitsTask",
    "digits_gan": "components.tasks.gan:DigitsGanTask",
    "image_folder": "components.tasks.image_folder:ImageFolderTask",
    "sentiment": "components.tasks.sentiment:SentimentTask",
}


def available_tasks() -> list[str]:
    return sorted(_REGISTRY)


def get_task(
    name: str, options: dict[str, Any] | None = None, *, source: str = "params.yaml"
) -> Task:
    """The task ``name`` built from ``options``; errors name ``source`` (the params file)."""
    try:
        target = _REGISTRY[name]
    except KeyError as exc:
        raise StepError(
            f"{source}: task.name '{name}' is not a known task; choose one of {available_tasks()}"
        ) from exc
    module_name, cls_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls.from_options({} if options is None else options, where=f"{source}: task.options")


def __getattr__(name: str) -> Any:
    """``Task`` on first use: a data format's worker process (ingest's, validate's pool)
    imports this package without paying for paddle, which ``tasks.base`` imports."""
    if name == "Task":
        from components.tasks.base import Task

        return Task
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Task", "available_tasks", "get_task"]
