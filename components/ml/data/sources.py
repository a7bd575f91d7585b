"""Reading raw inputs from a local path or a URL (``http(s)://``, ``s3://``, anything fsspec
opens), with errors that say what really went wrong: the file is missing, the host cannot be
resolved, the server refused, the credentials are missing.

Library layer: imported by steps and tasks, imports no step.
"""

from __future__ import annotations

import socket

from components.core.artifacts import StepError


def read_bytes(uri: str) -> bytes:
    """The bytes of ``uri``; every failure is a ``StepError`` naming ``uri`` and the cause."""
    import fsspec

    no_credentials, no_endpoint = _s3_errors(uri)
    try:
        with fsspec.open(uri, "rb") as fh:
            return fh.read()
    except no_credentials as exc:
        raise StepError(
            f"{uri}: no usable AWS credentials ({exc}); set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE with ~/.aws/credentials), and "
            "AWS_ENDPOINT_URL_S3 for an S3-compatible server"
        ) from exc
    except no_endpoint as exc:
        raise StepError(
            f"{uri}: cannot connect to the S3 endpoint {exc.kwargs.get('endpoint_url', '')} "
            "(check AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and that the server is up)"
        ) from exc
    except FileNotFoundError as exc:
        cause = _network_cause(exc, uri)
        raise StepError(f"{uri}: {cause or 'input file not found'}") from exc
    except IsADirectoryError as exc:
        raise StepError(f"{uri}: is a directory, not an input file") from exc
    except ImportError as exc:  # e.g. s3:// without s3fs
        raise StepError(f"{uri}: cannot open ({exc}); install the extra it names") from exc
    except OSError as exc:
        cause = _network_cause(exc, uri)
        raise StepError(f"{uri}: {cause or f'cannot read ({exc})'}") from exc


def _s3_errors(uri: str) -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """botocore's missing-credentials and unreachable-endpoint errors (none off s3://)."""
    if not uri.startswith(("s3://", "s3a://")):
        return (), ()
    try:
        from botocore import exceptions as boto
    except ImportError:  # s3fs missing: fsspec raises ImportError, handled above
        return (), ()
    return (boto.NoCredentialsError, boto.PartialCredentialsError), (boto.EndpointConnectionError,)


def _network_cause(exc: BaseException, uri: str) -> str | None:
    """What really happened when fsspec reports a URL as missing: the host could not be
    resolved, the connection was refused, or the server answered with an HTTP error."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return None
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return f"invalid port in URL {uri!r}"
    try:
        from aiohttp import ClientResponseError
    except ImportError:  # fsspec's HTTP filesystem needs aiohttp: without it, no HTTP error
        ClientResponseError = ()  # type: ignore[assignment,misc]  # noqa: N806
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, socket.gaierror):
            return f"host '{host}' could not be resolved ({current.strerror or current})"
        if isinstance(current, ConnectionRefusedError):
            return f"connection refused by {host}:{port} (is the server running?)"
        if isinstance(current, TimeoutError):
            return f"connection to {host}:{port} timed out"
        if isinstance(current, ClientResponseError):
            if current.status == 404:
                return "input file not found (HTTP 404)"
            return f"server {host}:{port} answered HTTP {current.status} {current.message}".rstrip()
        current = current.__cause__ or current.__context__
    return None


def join_uri(base: str, name: str) -> str:
    """``name`` under the directory or URL prefix ``base``."""
    return f"{base.rstrip('/')}/{name}"
