"""Failures that are not bugs, in one line: an MLflow server that stayed unreachable through its
retries, a full or read-only disk. The command line (:func:`components.kernel.cli.run_cli`)
prints that line instead of a traceback; a library tells such a failure from an answer (a
tracking server that did not answer said nothing about the registry)."""

from __future__ import annotations

import errno
import os
from urllib.parse import urlsplit

from components.core.uris import redact_uri

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
            "MLFLOW_TRACKING_URI and run it again: it is safe to rerun"
        )
    return None
