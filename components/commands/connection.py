"""How a command line reaches MLflow: ``verify``, ``fetch-model``, ``registry``.

- **Which store.** ``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else
  ``sqlite:///mlflow.db`` (in the working directory). The answer and every error line name
  it (:func:`components.kernel.cli.name_tracking_uri`).
- **Never created.** A local store (a ``sqlite:`` file, a ``file:`` directory) that does not
  exist is refused in one line: these commands read a registry, and MLflow would otherwise
  create an empty database where they run and answer "not in the registry".
- **Bounded retries.** A tracking server that does not answer costs at most
  :func:`give_up_after_s` (under 15 s by default) before one error line: MLflow's HTTP
  retries with exponential backoff, set by ``--tracking-retries``, ``--tracking-backoff-s``
  and ``--tracking-timeout-s``, else by MLflow's own variables (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
  ``..._BACKOFF_FACTOR``, ``..._TIMEOUT``: ``k8s/mlflow/client-env.yaml`` sets them for pods),
  else :data:`CLI_RETRY`. The pipeline's steps keep ``params.yaml``'s ``registry.retry`` and
  ``track.retry``, made to ride out a server restart in an unattended run.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import asdict, dataclass
from typing import Any

from components.core.artifacts import StepError
from components.core.config import from_dict
from components.core.uris import local_store_path, redact_uri
from components.kernel.cli import name_tracking_uri
from components.tracking.registry import DEFAULT_TRACKING_URI, TrackingRetry, client, tracking_uri

# a command run by hand: 3 retries, waits 2 + 4 s (+ up to 1 s jitter each) -> about 8 s
CLI_RETRY = TrackingRetry(retries=3, backoff_s=1, timeout_s=10)
RETRY_ENV = {
    "retries": "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "backoff_s": "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
    "timeout_s": "MLFLOW_HTTP_REQUEST_TIMEOUT",
}
JITTER_ENV = "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER"  # MLflow adds random() * this to each wait
BACKOFF_MAX_S = 120  # urllib3's cap on one wait


@dataclass(frozen=True)
class Tracking:
    """The store a command talks to: its URI (as given), an ``MlflowClient`` on it, and the
    retry policy applied."""

    uri: str
    client: Any
    retry: TrackingRetry

    def __str__(self) -> str:
        return redact_uri(self.uri)


def add_tracking_flags(parser: argparse.ArgumentParser) -> None:
    """``--tracking-uri`` and the retry flags (module docstring)."""
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help=f"MLflow tracking URI (default: MLFLOW_TRACKING_URI, else {DEFAULT_TRACKING_URI} "
        "in the working directory, which must exist)",
    )
    parser.add_argument(
        "--tracking-retries",
        type=int,
        default=None,
        help=f"retries of a request the server does not answer (default: {RETRY_ENV['retries']}"
        f", else {CLI_RETRY.retries})",
    )
    parser.add_argument(
        "--tracking-backoff-s",
        type=int,
        default=None,
        help="backoff factor: the k-th retry waits backoff * 2^(k-1) s, the first none "
        f"(default: {RETRY_ENV['backoff_s']}, else {CLI_RETRY.backoff_s})",
    )
    parser.add_argument(
        "--tracking-timeout-s",
        type=int,
        default=None,
        help=f"per request (default: {RETRY_ENV['timeout_s']}, else {CLI_RETRY.timeout_s})",
    )


def retry_from(args: argparse.Namespace) -> TrackingRetry:
    """The retry policy: each setting from its flag, else MLflow's variable, else
    :data:`CLI_RETRY`; one error line for a bad value."""
    values: dict[str, Any] = {}
    for name, env in RETRY_ENV.items():
        given = getattr(args, f"tracking_{name}", None)
        source = f"--tracking-{name.replace('_', '-')}"
        if given is None and os.environ.get(env):
            given, source = os.environ[env], env
        if given is None:
            continue
        try:
            values[name] = int(given)  # MLflow reads all three as integers
        except ValueError:
            raise StepError(f"{source}={given!r}: not a whole number") from None
    return from_dict(TrackingRetry, {**asdict(CLI_RETRY), **values}, where="tracking retry")


def give_up_after_s(retry: TrackingRetry) -> float:
    """The longest the retries wait in all, when every attempt fails at once (connection
    refused): urllib3 waits nothing before the first retry, ``backoff * 2^(k-1)`` s before
    the k-th, each plus up to MLflow's jitter (1 s, unless :data:`JITTER_ENV` says)."""
    jitter = float(os.environ.get(JITTER_ENV) or 1.0)
    kth = range(2, retry.retries + 1)
    waits = [min(retry.backoff_s * 2 ** (k - 1), BACKOFF_MAX_S) for k in kth]
    return float(sum(waits)) + jitter * len(waits)


def open_tracking(args: argparse.Namespace) -> Tracking:
    """The client of the store ``args`` names (:func:`add_tracking_flags`), with bounded
    retries applied; refuses a local store that does not exist (it is never created)."""
    uri = getattr(args, "tracking_uri", None) or tracking_uri()
    name_tracking_uri(uri)
    retry = retry_from(args)
    path = local_store_path(uri)
    if path is not None and not path.exists():
        default = ""
        if uri == DEFAULT_TRACKING_URI:
            default = " (the default: MLFLOW_TRACKING_URI is unset)"
        raise StepError(
            f"tracking URI {redact_uri(uri)}{default}: {path.absolute()} does not exist; run "
            "from the directory that holds the pipeline's store, or pass --tracking-uri / set "
            "MLFLOW_TRACKING_URI (nothing was created)"
        )
    retry.apply()
    # urllib3 logs each retry; the command's one error line (run_cli) says how many were made
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    return Tracking(uri, client(uri), retry)
