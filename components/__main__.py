"""``python -m components STEP [options]``: the same as ``paddle-mlops STEP``.

The stage commands of ``dvc.yaml`` call ``python3 -m components``: whatever ``python3`` is
first on PATH. Under an interpreter without the project's dependencies (``.venv/bin/dvc
repro`` with the venv not activated runs the system's), this re-executes itself, same
arguments, with the repository's ``.venv/bin/python`` when there is one; else it says in one
line to run ``make install`` and exits :data:`NO_DEPENDENCIES`. Containers and KFP run an
interpreter that has them, so nothing changes there. Only ``importlib.util.find_spec`` runs
before the check (no dependency is imported).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

# top-level modules of the project's dependencies (pyproject.toml) a step cannot run without
REQUIRED = ("paddle", "numpy", "yaml", "mlflow")
NO_DEPENDENCIES = 3  # exit code: this interpreter lacks the dependencies and there is no venv
REEXEC_ENV = "PADDLE_MLOPS_REEXEC"  # set on the re-executed process: never loops
REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv"


def missing_dependencies() -> list[str]:
    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def _in_venv(venv: Path) -> bool:
    try:
        return Path(sys.prefix).resolve() == venv.resolve()
    except OSError:
        return False


def ensure_interpreter(argv: list[str]) -> None:
    """Return when this interpreter can run the project; else re-exec with the repository's
    venv (does not return), or write one line and exit :data:`NO_DEPENDENCIES`."""
    handed_over = os.environ.pop(REEXEC_ENV, None)  # not inherited by what this one starts
    missing = missing_dependencies()
    if not missing:
        return
    python = VENV / "bin" / "python"
    if python.is_file() and not _in_venv(VENV) and not handed_over:
        os.environ[REEXEC_ENV] = "1"
        os.execv(python, [str(python), "-m", "components", *argv])
    where = f"{VENV} lacks them too" if python.is_file() else f"there is no {VENV}"
    sys.stderr.write(
        f"error: {sys.executable} cannot import {', '.join(missing)} (the project's "
        f"dependencies) and {where}: run `make install` in {REPO}, then run this again\n"
    )
    sys.exit(NO_DEPENDENCIES)


if __name__ == "__main__":
    ensure_interpreter(sys.argv[1:])

    from components.kernel.cli import main  # after the interpreter check

    sys.exit(main())
