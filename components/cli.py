"""Command-line edge shared by all steps: logging setup and readable failures."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from components.artifacts import StepError

if TYPE_CHECKING:
    from components.tasks import Task

T = TypeVar("T")

STEPS = (
    "ingest",
    "validate",
    "train",
    "qat",
    "export",
    "serving_image",
    "evaluate",
    "track",
    "register",
)


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


def step_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The argument parser every step CLI starts from (``--params`` included)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--params", default="params.yaml", help="params file (default: %(default)s)"
    )
    return parser


def step_params(path: str, name: str, cls: type[T]) -> tuple[T, dict[str, Any]]:
    """``params.yaml`` section ``name`` as ``cls``, plus the whole params mapping."""
    from components.config import load_params, section

    all_params = load_params(path)
    return section(all_params, name, cls, source=path), all_params


def task_from_params(all_params: dict[str, Any]) -> Task:
    """The task named by ``task.name`` with ``task.options`` (errors name the params file)."""
    from components.config import params_source
    from components.tasks import get_task

    source = params_source(all_params)
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


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops STEP [args]``: the same entry points ``dvc.yaml`` calls."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in STEPS:
        sys.stderr.write(f"usage: paddle-mlops {{{','.join(STEPS)}}} [options]\n")
        return 2
    module = importlib.import_module(f"components.{argv[0]}")
    return int(module.main(argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
