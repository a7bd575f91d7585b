"""URIs as they may appear in logs and files."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


def redact_uri(uri: str | None) -> str:
    """``uri`` without credentials (``user:password@`` or a password in the query), for logs
    and files: ``http://u:p@host/x`` -> ``http://***@host/x``."""
    if not uri:
        return ""
    parts = urlsplit(uri)
    if "@" not in parts.netloc and not parts.query:
        return uri
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    secret = ("password", "passwd", "pwd", "token", "secret", "key")
    query = urlencode(
        [
            (k, "***" if any(w in k.lower() for w in secret) else v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ],
        safe="*",
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def local_store_path(uri: str) -> Path | None:
    """Where a local MLflow store lives: the file of ``sqlite:///mlflow.db`` (relative) or
    ``sqlite:////abs/mlflow.db``, the directory of ``file:///abs/mlruns`` or a bare path;
    None for a server (``http(s)://``, ``databricks``, ...) or an in-memory ``sqlite://``."""
    parts = urlsplit(uri)
    if parts.scheme == "sqlite":
        rest = uri.split("://", 1)[1] if "://" in uri else ""
        rest = rest[1:] if rest.startswith("/") else rest  # sqlite:///rel, sqlite:////abs
        rest = rest.split("?", 1)[0]
        return Path(rest) if rest and rest != ":memory:" else None
    if parts.scheme == "file":
        return Path(parts.path) if parts.path else None
    if parts.scheme == "" and uri and not uri.startswith("databricks"):
        return Path(uri)
    return None
