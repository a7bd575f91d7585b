"""Free loopback ports for the servers the steps and tests start.

``bind(("127.0.0.1", 0))`` hands out a port from the kernel's ephemeral range, the same range
every outgoing connection takes its local port from: between the probe closing it and the
server binding it, another process's connection (or probe) can take it, and the server fails
with "address in use". That happens when several pipelines or test workers share a host. The
ports here come from below the ephemeral range (never handed to a connection), at random,
each checked by a bind.

Library layer: imports nothing of the project.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOW = 20000  # above the usual fixed service ports (5000, 8080, 9090, ...)
_FALLBACK_EPHEMERAL_START = 32768


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_START


def free_port(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A port nothing listens on at ``host`` now, outside the ephemeral range when that range
    leaves room below it (else one the kernel picks)."""
    high = _ephemeral_start() - 1
    if high - LOW >= 1000:
        for port in random.sample(range(LOW, high + 1), min(attempts, high - LOW + 1)):
            with socket.socket() as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
