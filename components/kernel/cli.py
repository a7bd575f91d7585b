"""CLI adapter: ``paddle-mlops <step|command>``, logging setup and readable failures.

Every step's command line comes from its declaration (:func:`step_main`); the other
commands (``registry``, ``dvc-yaml``, ...) are modules imported by name, so no step's import
closure (and with it its ``dvc.yaml`` deps) includes them.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from components.core import overrides
from components.core.artifacts import StepError, sweep_dead_temporaries
from components.core.config import load_params
from components.core.failures import readable_failure
from components.core.uris import redact_uri
from components.faults import failpoints
from components.kernel.step import AFTER_DEPLOY, STEPS, In, Step, flag, load

log = logging.getLogger(__name__)

# Paddle warns at import, on every command, that ccache (which only speeds up compiling C++
# extensions, something no step does) is not installed. Every command imports this module
# before any module that imports paddle, so this one filter, for that one message, is enough.
warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)


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


# the tracking URI the running command uses (components.commands.connection): every error
# line of run_cli names it, so "not in the registry" says which registry
_tracking_uri: list[str] = []


def name_tracking_uri(uri: str) -> None:
    """Record the tracking URI this command uses: :func:`run_cli` names it in its errors."""
    _tracking_uri[:] = [redact_uri(uri)]


def _with_tracking_uri(message: str) -> str:
    if not _tracking_uri or _tracking_uri[0] in message:
        return message
    return f"{message} [tracking URI {_tracking_uri[0]}]"


def run_cli(body: Callable[[], int | None]) -> int:
    """Run a step body; a StepError (or a :func:`readable_failure`) becomes a one-paragraph
    message and exit code 1; SIGTERM and Ctrl-C end it cleanly with 143 and 130. The error
    names the tracking URI the body recorded (:func:`name_tracking_uri`), if any. Else the
    body's own exit code (None: 0)."""
    setup_logging()
    signal.signal(signal.SIGTERM, _on_sigterm)
    _tracking_uri.clear()
    try:
        code = body()
    except StepError as exc:
        sys.stderr.write(f"error: {_with_tracking_uri(str(exc))}\n")
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
        sys.stderr.write(f"error: {_with_tracking_uri(message)}\n")
        return 1
    return int(code or 0)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser that names the closest choice of an invalid one, as Python 3.12's
    does: ``invalid choice 'stauts' (did you mean 'status'?)``; its sub-parsers too."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is not None and value not in choices:
            names = [str(c) for c in choices]
            close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.6)
            if close:
                raise argparse.ArgumentError(
                    action, f"invalid choice '{value}' (did you mean '{close[0]}'?)"
                )
        super()._check_value(action, value)


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
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a params key (dotted, e.g. train.learning_rate=0.003; the value is YAML); "
        "repeatable, wins over the params file and a search's overlay",
    )
    parser.add_argument(
        "--set-if",
        dest="set_ifs",
        action="append",
        default=[],
        metavar="COND=VALUE:KEY=VALUE",
        help="set KEY only when params key COND has VALUE after every --set (a conditional "
        "search key on Katib); repeatable",
    )
    return parser


def step_main(
    step: Step,
    argv: Sequence[str] | None = None,
    exit_code: Callable[[Any], int] | None = None,
) -> int:
    """The CLI of a step: parse flags, check the output paths, load params, :meth:`Step.call`.
    ``exit_code``: the exit code of the step's result (default 0), for a step whose outcome
    a scheduler must tell apart (the monitor's "not enough data")."""
    args = step_parser(step).parse_args(argv)

    def _go() -> int:
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
        sets = dict(overrides.parse_set(a) for a in args.sets)
        set_ifs = [overrides.parse_set_if(a) for a in args.set_ifs]
        result = step.call(load_params(args.params), paths, values, sets, set_ifs)
        return exit_code(result) if exit_code is not None else 0

    return run_cli(_go)


# commands besides the steps: name -> (module whose main() runs it, what it does); imported by
# name, so a step's import closure, and with it its dvc.yaml deps, does not include them
COMMANDS = {
    "registry": ("components.commands.registry", "the champion: status, promote, rollback"),
    "dvc-yaml": ("components.kernel.dvc", "write dvc.yaml from the step declarations"),
    "params": ("components.kernel.params_schema", "params schema: the params files' JSON Schema"),
    "plots": ("components.kernel.plots", "this pipeline's plots as one offline HTML page"),
    "fetch-model": ("components.commands.fetch_model", "a version's verified bundle into a dir"),
    "mlflow-users": ("components.commands.mlflow_users", "users of the basic-auth tracking server"),
    "doctor": ("components.doctor", "check this machine: paddle, dvc, tools, ports"),
    "verify": ("components.commands.verify", "what a registered version's signatures prove"),
    "keys": ("components.commands.keys", "make a signing key pair"),
    "summary": ("components.summary", "what the last run made: metrics, gates, where served"),
    "traffic": ("components.traffic", "send held-out samples to the served model"),
}
PROG = "paddle-mlops"


def version() -> str:
    """``paddle-mlops X.Y.Z`` (the installed distribution, else pyproject.toml's), where."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    here = Path(__file__).resolve().parent.parent
    try:
        number = dist_version("paddle-mlops")
    except PackageNotFoundError:  # run from a source tree (an image: PYTHONPATH)
        import tomllib

        pyproject = here.parent / "pyproject.toml"
        try:
            number = tomllib.loads(pyproject.read_text())["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            number = "unknown"
    python = ".".join(map(str, sys.version_info[:3]))
    return f"{PROG} {number} ({here}, Python {python})"


def usage() -> str:
    steps, after = ", ".join(STEPS), ", ".join(AFTER_DEPLOY)
    width = max(map(len, COMMANDS))
    commands = "".join(f"  {name:<{width}}  {what}\n" for name, (_, what) in COMMANDS.items())
    return (
        f"usage: {PROG} COMMAND [options]   ({PROG} COMMAND --help: its options)\n\n"
        f"pipeline steps, in order (dvc.yaml runs them):\n  {steps}\n"
        f"after deploy:\n  {after}\n"
        f"commands:\n{commands}\n"
        f"  --version  print the version and exit\n"
    )


def invalid_choice(word: str) -> str:
    """The error line for an unknown command: the closest name, if one is close."""
    names = (*STEPS, *AFTER_DEPLOY, *COMMANDS)
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'?" if close else f"choose from: {', '.join(names)}"
    return f"{PROG}: error: invalid choice '{word}' ({hint}); {PROG} --help lists them"


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops STEP [args]``: the entry points ``dvc.yaml`` calls (one per step
    declaration), plus the :data:`COMMANDS` (``registry``, ``verify``, ``fetch-model``...)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        return int(importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:]))
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        sys.stdout.write(version() + "\n")
        return 0
    if argv[0] not in (*STEPS, *AFTER_DEPLOY):
        sys.stderr.write(invalid_choice(argv[0]) + "\n")
        return 2
    step = load(argv[0])
    module = importlib.import_module(f"components.steps.{argv[0]}")
    custom = getattr(module, "main", None)  # a step with commands of its own (ingest)
    return int(custom(argv[1:]) if custom else step_main(step, argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
