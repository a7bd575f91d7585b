"""Slow HTTP clients: hold many connections to a server and send (almost) nothing.

What a slowloris-style attacker does, from one asyncio process: ``--connections`` TCP
connections, a share of them (``--idle-fraction``) connected and silent, the rest trickling the
header of a request one byte every ``--interval-ms`` (a header that never ends: a request
line, then one header value that grows forever). A connection the server closes (its header
timeout, a 503 past its connection limit, a reset) is opened again at once — counted in
``reconnects``; a connection that lived less than a second waits a second before the next
attempt, so a server that refuses everything is not hammered.

Progress goes to stdout as JSON lines, one per ``--report-interval-s``::

    {"event": "stats", "t": <unix time>, "open": N, "min_open": M, "reconnects": R,
     "connect_errors": E, "closed_by_server": C, "bytes_sent": B, "statuses": {"408": n}}

``min_open`` is the fewest connections open at once since the previous line. The first line
with ``"event": "ready"`` comes once every connection has been opened once (or failed to).
SIGTERM, SIGINT or the end of stdin stop it: it closes everything and prints a last line
with ``"event": "final"``. The soft ``RLIMIT_NOFILE`` is raised to the hard limit first.

    .venv/bin/python bench/slow_clients.py --port 8080 --connections 1000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import resource
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("slow_clients")


@dataclass
class Counters:
    target: int
    open: int = 0
    min_open: int = 0
    reconnects: int = 0
    connect_errors: int = 0
    closed_by_server: int = 0
    bytes_sent: int = 0
    opened_once: int = 0  # connections whose first attempt finished (either way)
    statuses: dict[str, int] = field(default_factory=dict)

    def opened(self) -> None:
        self.open += 1

    def closed(self) -> None:
        self.open -= 1
        self.min_open = min(self.min_open, self.open)

    def snapshot(self, event: str) -> dict[str, Any]:
        out = {
            "event": event,
            "t": time.time(),
            "target": self.target,
            "open": self.open,
            "min_open": self.min_open,
            "reconnects": self.reconnects,
            "connect_errors": self.connect_errors,
            "closed_by_server": self.closed_by_server,
            "bytes_sent": self.bytes_sent,
            "statuses": dict(self.statuses),
        }
        self.min_open = self.open
        return out


def raise_nofile_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return int(soft)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return int(hard)


class SlowClients:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.counters = Counters(target=args.connections)
        self.stopping = asyncio.Event()
        self.request_line = (
            f"POST {args.path} HTTP/1.1\r\nHost: {args.host}:{args.port}\r\nX-Slow: "
        ).encode()

    async def run(self) -> None:
        args = self.args
        n_idle = round(args.connections * args.idle_fraction)
        gate = asyncio.Semaphore(args.open_parallel)  # the first wave only
        tasks = [
            asyncio.create_task(self._hold(i >= n_idle, gate)) for i in range(args.connections)
        ]
        reporter = asyncio.create_task(self._report())
        await self.stopping.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
        self._emit(self.counters.snapshot("final"))

    async def _hold(self, trickle: bool, gate: asyncio.Semaphore) -> None:
        first = True
        while not self.stopping.is_set():
            try:
                if first:
                    async with gate:
                        streams = await self._connect()
                else:
                    streams = await self._connect()
            except (TimeoutError, OSError) as e:
                self.counters.connect_errors += 1
                log.debug("connect failed: %s", e)
                if first:
                    first = False
                    self.counters.opened_once += 1
                await asyncio.sleep(1.0)
                continue
            if first:
                first = False
                self.counters.opened_once += 1
            else:
                self.counters.reconnects += 1
            started = time.monotonic()
            reader, writer = streams
            self.counters.opened()
            try:
                await self._until_closed(reader, writer, trickle)
            finally:
                self.counters.closed()
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
            if self.stopping.is_set():
                return
            self.counters.closed_by_server += 1
            if time.monotonic() - started < 1.0:
                await asyncio.sleep(1.0)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(
            asyncio.open_connection(self.args.host, self.args.port), timeout=10.0
        )

    async def _until_closed(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trickle: bool
    ) -> None:
        """Until the server closes the connection (EOF, reset); trickling meanwhile."""
        drip = asyncio.create_task(self._trickle(writer)) if trickle else None
        try:
            first = True
            while True:
                try:
                    data = await reader.read(65536)
                except OSError:
                    return
                if not data:
                    return
                if first and data.startswith(b"HTTP/1."):
                    status = data.split(b" ", 2)[1].decode(errors="replace")
                    self.counters.statuses[status] = self.counters.statuses.get(status, 0) + 1
                first = False
        finally:
            if drip is not None:
                drip.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await drip

    async def _trickle(self, writer: asyncio.StreamWriter) -> None:
        interval = self.args.interval_ms / 1000
        await asyncio.sleep(random.uniform(0, interval))  # spread the wake-ups
        i = 0
        while True:
            byte = self.request_line[i : i + 1] if i < len(self.request_line) else b"a"
            writer.write(byte)
            await writer.drain()
            self.counters.bytes_sent += 1
            i += 1
            await asyncio.sleep(interval)

    async def _report(self) -> None:
        ready = False
        while True:
            await asyncio.sleep(self.args.report_interval_s)
            if not ready and self.counters.opened_once >= self.counters.target:
                ready = True
                self._emit(self.counters.snapshot("ready"))
            else:
                self._emit(self.counters.snapshot("stats"))

    @staticmethod
    def _emit(record: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


async def _main(args: argparse.Namespace) -> None:
    clients = SlowClients(args)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, clients.stopping.set)
    if args.stop_on_stdin_eof:

        def watch_stdin() -> None:  # a daemon thread: never holds up the exit
            sys.stdin.read()
            loop.call_soon_threadsafe(clients.stopping.set)

        threading.Thread(target=watch_stdin, daemon=True).start()
    await clients.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/v2/models/model/infer", help="of the slow requests")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument(
        "--idle-fraction", type=float, default=0.5, help="share that sends nothing at all"
    )
    parser.add_argument("--interval-ms", type=float, default=500.0, help="between trickled bytes")
    parser.add_argument("--open-parallel", type=int, default=100, help="connects in flight")
    parser.add_argument("--report-interval-s", type=float, default=0.5)
    parser.add_argument(
        "--stop-on-stdin-eof", action="store_true", help="also stop when stdin closes"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    limit = raise_nofile_limit()
    if limit < args.connections + 64:
        log.warning(
            "RLIMIT_NOFILE is %d: fewer than %d connections will open", limit, args.connections
        )
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
