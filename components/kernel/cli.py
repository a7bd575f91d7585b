"""CLI adapter: ``paddle-mlops <step|command>``, logging setup and readable failures.

Every step's command line comes from its declaration (:func:`step_main`); the other
commands (``registry``, ``dvc-yaml``, ...) are modules imported by name, so no step's import
closure (and with it its ``dvc.yaml`` deps) includes them.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from components.core.artifacts import StepError, sweep_dead_temporaries
from components.core.config import load_params
from components.core.uris import redact_uri
from components.faults import failpoints
from components.kernel.step import AFTER_DEPLOY, STEPS, In, Step, flag, load

log = logging.getLogger(__name__)


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


class Terminated(KeyboardInterrupt):
    """SIGTERM (Kubernetes deleting a pod, a cancelled run): unwinds like Ctrl-C, so atomic
    writes remove their temporaries and an open MLflow run is ended KILLED."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated("SIGTERM")


_DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def readable_failure(exc: BaseException) -> str | None:
    """One line for the failures an unattended run meets that are not bugs: a tracking
    server that stayed unreachable through its retries, a full or read-only disk. None
    for anything else (a bug keeps its traceback)."""
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRORS:
        where = exc.filename or "a step output"
        return (
            f"{where}: {os.strerror(exc.errno)}. Outputs are written atomically, so nothing "
            "half-written was left; fix the disk and run the step again"
        )
    text = str(exc)
    if type(exc).__module__.startswith(("mlflow", "requests", "urllib3")) and (
        "API request to" in text or "Max retries exceeded" in text
    ):
        _, caused, cause = text.rpartition("Caused by ")
        cause = cause.strip(" ()'\"")[:200] if caused else ""
        _, request, url = text.partition("API request to ")
        parts = urlsplit(url.split(" ", 1)[0]) if request else None
        url = f"{parts.scheme}://{parts.netloc}" if parts else ""
        retries = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "the default")
        return (
            f"MLflow tracking server {redact_uri(url)} did not answer after {retries} retries "
            f"with backoff ({cause or text.splitlines()[0][:200]}); start it or check "
            "MLFLOW_TRACKING_URI and run the step again: it is safe to rerun"
        )
    return None


def run_cli(body: Callable[[], None]) -> int:
    """Run a step body; a StepError (or a :func:`readable_failure`) becomes a one-paragraph
    message and exit code 1; SIGTERM and Ctrl-C end it cleanly with 143 and 130."""
    setup_logging()
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        body()
    except StepError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except Terminated:
        sys.stderr.write("terminated (SIGTERM)\n")
        return 143
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except Exception as exc:
        message = readable_failure(exc)
        if message is None:
            raise
        sys.stderr.write(f"error: {message}\n")
        return 1
    return 0


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


def step_parser(step: Step) -> argparse.ArgumentParser:
    """The flags of ``step``: ``--params``, one per port (default: its path), one per value."""
    parser = argparse.ArgumentParser(
        prog=f"paddle-mlops {step.name}",
        description=step.doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--params", default="params.yaml", help="params file (default: %(default)s)"
    )
    for port in (*step.cli_inputs(), *step.cli_outputs()):
        kind = "input" if isinstance(port, In) else "output"
        parser.add_argument(
            f"--{flag(port.name)}",
            dest=port.name,
            default=port.path,
            help=f"{port.help or port.name} ({kind}; default: %(default)s)",
        )
    for value in step.values:
        parser.add_argument(
            f"--{flag(value.name)}", dest=value.name, default=value.default, help=value.help
        )
    return parser


def step_main(step: Step, argv: Sequence[str] | None = None) -> int:
    """The CLI of a step: parse flags, check the output paths, load params, :meth:`Step.call`."""
    args = step_parser(step).parse_args(argv)

    def _go() -> None:
        failpoints.set_step(step.name)
        parents = set()
        for port in step.cli_outputs():
            target = Path(getattr(args, port.name))
            output_dir(target.parent if port.is_file else target, f"--{flag(port.name)}")
            parents.add(target.parent)
        for gone in (g for parent in parents for g in sweep_dead_temporaries(parent)):
            log.warning("removed %s, left by a writer that was killed", gone)
        paths = {p.name: getattr(args, p.name) for p in (*step.cli_inputs(), *step.cli_outputs())}
        values = {v.name: getattr(args, v.name) for v in step.values}
        step.call(load_params(args.params), paths, values)

    return run_cli(_go)


# commands besides the steps: name -> module whose main() runs it (imported by name, so a
# step's import closure, and with it its dvc.yaml deps, does not include them)
COMMANDS = {
    "registry": "components.tracking.registry",
    "dvc-yaml": "components.kernel.dvc",
    "plots": "components.kernel.plots",
    "fetch-model": "components.tracking.fetch_model",
    "mlflow-users": "components.tracking.auth",
    "doctor": "components.doctor",
    "verify": "components.kube.verify",
    "keys": "components.tracking.signing",
}


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops STEP [args]``: the entry points ``dvc.yaml`` calls (one per step
    declaration), plus ``registry`` (champion by hand) and ``dvc-yaml`` (write the stages)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        return int(importlib.import_module(COMMANDS[argv[0]]).main(argv[1:]))
    if not argv or argv[0] not in (*STEPS, *AFTER_DEPLOY):
        names = ",".join((*STEPS, *AFTER_DEPLOY, *COMMANDS))
        sys.stderr.write(f"usage: paddle-mlops {{{names}}} [options]\n")
        return 2
    step = load(argv[0])
    module = importlib.import_module(f"components.steps.{argv[0]}")
    custom = getattr(module, "main", None)  # a step with commands of its own (ingest)
    return int(custom(argv[1:]) if custom else step_main(step, argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
