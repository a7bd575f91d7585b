"""The slow-clients part: a thousand trickling clients beside good ones."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.serving.common import SLOW_CLIENTS, Cell, Report, log, noise_of
from bench.serving.loads import Wrk, measure
from bench.serving.servers import established, listening_record, rss_bytes
from components.ml.serving.server import RunningServer


class SlowClientsProcess:
    """``bench/slow_clients.py`` in its own process; a thread collects its JSON lines."""

    def __init__(
        self,
        port: int,
        path: str,
        connections: int,
        idle_fraction: float,
        interval_ms: float,
        log_file: Path,
    ):
        self._stderr = open(log_file, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(SLOW_CLIENTS),
                "--host=127.0.0.1",
                f"--port={port}",
                f"--path={path}",
                f"--connections={connections}",
                f"--idle-fraction={idle_fraction}",
                f"--interval-ms={interval_ms}",
                "--report-interval-s=0.5",
                "--stop-on-stdin-eof",  # stops with this process, whatever happens
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                self.records.append(record)
            if record.get("event") == "ready":
                self._ready.set()
        self._ready.set()  # EOF: wake a waiter

    def wait_ready(self, timeout_s: float) -> bool:
        """True once every connection was opened once (or failed to)."""
        self._ready.wait(timeout_s)
        with self._lock:
            return any(r.get("event") == "ready" for r in self.records)

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        """What happened between the wall times ``t0`` and ``t1``."""
        with self._lock:
            records = list(self.records)
        if not records:
            return {}
        before = [r for r in records if r["t"] <= t0]
        base = before[-1] if before else records[0]
        inside = [r for r in records if base["t"] < r["t"] <= t1]
        end = inside[-1] if inside else base
        statuses = {
            k: v - base["statuses"].get(k, 0)
            for k, v in end["statuses"].items()
            if v - base["statuses"].get(k, 0)
        }
        return {
            "held_min": min((min(r["min_open"], r["open"]) for r in inside), default=None),
            "held_end": end["open"],
            "reconnects": end["reconnects"] - base["reconnects"],
            "closed_by_server": end["closed_by_server"] - base["closed_by_server"],
            "connect_errors": end["connect_errors"] - base["connect_errors"],
            "statuses": statuses,
        }

    def stop(self) -> dict[str, Any]:
        """Stop it; its last record (totals)."""
        if self.proc.poll() is None:
            with_stdin = self.proc.stdin
            if with_stdin is not None:
                with_stdin.close()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=10)
        self._stderr.close()
        with self._lock:
            return dict(self.records[-1]) if self.records else {}


def run_slow_clients(
    args: argparse.Namespace,
    report: Report,
    server: RunningServer,
    name: str,
    shape: list[int],
    wrk: Wrk,
    layout: str,
    log_file: Path,
    work: Path,
) -> None:
    """Good clients (wrk) while ``--slow-clients`` connections are held, and the server's
    memory per held connection."""
    n = args.slow_clients
    pid, port = server.proc.pid, server.port
    config = listening_record(log_file).get("config", {})
    conns0, rss0 = established(pid, port), rss_bytes(pid)
    log.info(
        "slow clients: %d connections (%.0f%% idle, the rest trickling 1 byte / %.0f ms); "
        "server RSS %.1f MiB with %d connections",
        n,
        100 * args.slow_idle_fraction,
        args.slow_interval_ms,
        rss0 / 2**20,
        conns0,
    )
    helper = SlowClientsProcess(
        port,
        f"/v2/models/{name}/infer",
        n,
        args.slow_idle_fraction,
        args.slow_interval_ms,
        work / "slow-clients.log",
    )
    try:
        if not helper.wait_ready(60.0):
            raise RuntimeError(
                f"slow clients did not open their connections (log: {work / 'slow-clients.log'})"
            )
        # the server has accepted them when they show up as its ESTABLISHED sockets
        deadline = time.monotonic() + 15.0
        conns1 = established(pid, port)
        while conns1 < conns0 + 0.99 * n and time.monotonic() < deadline:
            time.sleep(0.2)
            conns1 = established(pid, port)
        time.sleep(0.3)
        conns1, rss1 = established(pid, port), rss_bytes(pid)
        gained = conns1 - conns0
        per_conn = (rss1 - rss0) / 1024 / gained if gained > 0 else None
        log.info(
            "  all open: server RSS %.1f MiB with %d connections: %s KiB per connection",
            rss1 / 2**20,
            conns1,
            "-" if per_conn is None else f"{per_conn:.1f}",
        )
        t0 = time.time()
        template = Cell(
            "overhead",
            "cpp",
            name,
            layout,
            "off",
            args.slow_concurrency,
            background=f"slow{n}",
        )
        cell = measure(
            wrk.load(server, name, shape, args.slow_concurrency),
            server,
            name,
            template,
            args.slow_duration,
            args.warmup,
            noise_of(args),
            side_pids=[helper.proc.pid],
        )
        t1 = time.time()
        report.cells.append(cell)
        conns2, rss2 = established(pid, port), rss_bytes(pid)
        held = helper.window(t0, t1)
    finally:
        final = helper.stop()
    report.slow_clients = {
        "connections": n,
        "idle": round(n * args.slow_idle_fraction),
        "trickling": n - round(n * args.slow_idle_fraction),
        "interval_ms": args.slow_interval_ms,
        "header_timeout_ms": config.get("header_timeout_ms"),
        "max_connections": config.get("max_connections"),
        "http_threads": config.get("http_threads"),
        "concurrency": args.slow_concurrency,
        "window_s": t1 - t0,
        "server_connections_before": conns0,
        "server_connections_open": conns1,
        "server_connections_after_load": conns2,
        "rss_before_kib": rss0 / 1024,
        "rss_open_kib": rss1 / 1024,
        "rss_after_load_kib": rss2 / 1024,
        "rss_per_idle_conn_kib": per_conn,
        "helper_cpu_pct": cell.side_cpu_pct,
        **held,
        "total_reconnects": final.get("reconnects"),
        "total_connect_errors": final.get("connect_errors"),
    }
    log.info(
        "  held at least %s of %d during the cell, %d reconnects, %d connect errors",
        held.get("held_min"),
        n,
        held.get("reconnects", 0),
        held.get("connect_errors", 0),
    )
