"""URIs as they may appear in logs and files."""

from __future__ import annotations

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
