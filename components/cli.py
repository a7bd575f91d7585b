"""Command-line edge shared by all steps: logging setup and readable failures."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.artifacts import StepError

if TYPE_CHECKING:
    from components.tasks import Task


def setup_logging() -> None:
    level = os.environ.get("LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        force=True,  # paddle installs its own root handler at import
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for noisy in (
        "matplotlib", "PIL", "great_expectations", "alembic", "urllib3", "botocore", "aiobotocore",
        "s3fs", "fsspec",
    ):  # fmt: skip
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run_cli(body: Callable[[], None]) -> int:
    """Run a step body; a StepError becomes a one-paragraph message and exit code 1."""
    setup_logging()
    try:
        body()
    except StepError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    return 0


def task_from_params(all_params: dict[str, Any]) -> Task:
    """The task named by ``task.name`` with ``task.options`` (errors name the params file)."""
    from components.config import params_source
    from components.tasks import available_tasks, get_task

    source = params_source(all_params)
    if "task" not in all_params:
        raise StepError(f"{source}: missing section 'task' (task.name: one of {available_tasks()})")
    task_params = all_params.get("task") or {}
    if not isinstance(task_params, dict):
        raise StepError(f"{source}: task: expected a mapping, got {type(task_params).__name__}")
    return get_task(str(task_params.get("name", "")), task_params.get("options"), source=source)


def output_dir(path: str | Path, flag: str = "--out") -> Path:
    """``path`` as a step's output directory: it (and every existing parent) must be a
    directory or not exist yet, so the atomic rename at the end cannot fail."""
    out = Path(path)
    for candidate in (out, *out.parents):
        if candidate.exists() and not candidate.is_dir():
            what = (
                "is an existing file" if candidate == out else f"its parent {candidate} is a file"
            )
            raise StepError(
                f"{flag} {out}: {what}, not a directory; the step writes a directory there"
            )
        if candidate.is_symlink() and not candidate.exists():
            raise StepError(f"{flag} {out}: {candidate} is a broken symbolic link")
    return out


# commands besides the steps: name -> module whose main() runs it (imported by name, so a
# step's import closure, and with it its dvc.yaml deps, does not include them)
COMMANDS = {
    "registry": "components.registry",
    "dvc-yaml": "components.step",
    "fetch-model": "components.fetch_model",
    "mlflow-users": "components.mlflow_auth",
}


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops STEP [args]``: the entry points ``dvc.yaml`` calls (one per step
    declaration), plus ``registry`` (champion by hand) and ``dvc-yaml`` (write the stages)."""
    steps = importlib.import_module("components.step").STEPS
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        return int(importlib.import_module(COMMANDS[argv[0]]).main(argv[1:]))
    if not argv or argv[0] not in steps:
        names = ",".join((*steps, *COMMANDS))
        sys.stderr.write(f"usage: paddle-mlops {{{names}}} [options]\n")
        return 2
    return int(importlib.import_module(f"components.{argv[0]}").main(argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
