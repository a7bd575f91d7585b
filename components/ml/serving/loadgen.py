"""A closed-loop HTTP load on the C++ server: ``wrk`` posting one prebuilt KServe v2
binary-tensor request on every connection, one request in flight per connection.

``wrk`` (a C load generator, the Debian package) rather than a Python client: on a 2-core
machine a Python client at 16 connections would take the cores the server is measured on.
Used by the serving-config search (``package``'s tuning) and the serving benchmark.

Library layer: imported by steps, imports no step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from components.core.artifacts import StepError

# POST the prebuilt request (JSON header + raw tensor bytes) on every connection and print one
# machine-readable line at the end. No response() hook: it would make wrk run Lua on every
# response and cost generator CPU; non-2xx answers are counted in errors.status anyway.
WRK_SCRIPT = r"""
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = os.getenv("BENCH_HEADER_LENGTH")

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d " ..
    "connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
"""
ERROR_COUNTERS = ("connect", "read", "write", "status", "timeout")


def run_generator(
    cmd: list[str], seconds: float, env: dict[str, str] | None = None
) -> tuple[int, str, float, float]:
    """Run a load generator for about ``seconds`` (killed 60 s past it): its exit code, its
    output, its own CPU seconds (``wait4`` rusage) and the wall seconds."""
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        watchdog = threading.Timer(seconds + 60.0, proc.kill)
        watchdog.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)  # reaps it, with its rusage
        finally:
            watchdog.cancel()
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read().decode(errors="replace")
    return os.waitstatus_to_exitcode(status), text, usage.ru_utime + usage.ru_stime, wall


@dataclass(frozen=True)
class LoadResult:
    """One closed-loop run at one concurrency."""

    concurrency: int
    requests: int
    seconds: float
    throughput: float  # answered requests per second
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int  # connect, read, write, timeout and non-2xx answers


class Wrk:
    """``wrk`` with the request script in ``work``; ``binary`` default: ``wrk`` on PATH."""

    def __init__(self, work: Path, binary: str | None = None):
        found = binary or shutil.which("wrk")
        if not found:
            raise StepError(
                "wrk: not on PATH (Debian package wrk); the serving-config search and the "
                "serving benchmark drive the server with it"
            )
        self.binary = found
        self.script = Path(work) / "infer.lua"
        self.script.write_text(WRK_SCRIPT)

    def run(
        self, url: str, body: Path, header_len: int, concurrency: int, seconds: float
    ) -> tuple[dict[str, float], float, float]:
        """One run posting the request in ``body`` (its JSON header ``header_len`` bytes):
        wrk's counters (the script's names), its CPU seconds, the wall seconds."""
        seconds = max(1, round(seconds))  # wrk takes whole seconds
        cmd = [
            self.binary,
            "-t1",
            f"-c{concurrency}",
            f"-d{seconds}s",
            "--timeout",
            "30s",
            "-s",
            str(self.script),
            url,
        ]
        env = dict(os.environ, BENCH_BODY=str(body), BENCH_HEADER_LENGTH=str(header_len))
        code, text, cpu, wall = run_generator(cmd, seconds, env)
        line = next((ln for ln in text.splitlines() if ln.startswith("BENCH ")), None)
        if code != 0 or line is None:
            raise StepError(f"wrk failed (exit {code}): {text.strip()[-500:]}")
        stats = {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
        return stats, cpu, wall

    def closed_loop(
        self, url: str, body: Path, header_len: int, concurrency: int, seconds: float
    ) -> LoadResult:
        stats, _, _ = self.run(url, body, header_len, concurrency, seconds)
        duration = stats["duration_us"] / 1e6
        return LoadResult(
            concurrency=concurrency,
            requests=int(stats["requests"]),
            seconds=duration,
            throughput=stats["requests"] / duration if duration > 0 else 0.0,
            p50_ms=stats["p50_us"] / 1000,
            p90_ms=stats["p90_us"] / 1000,
            p99_ms=stats["p99_us"] / 1000,
            errors=int(sum(stats[k] for k in ERROR_COUNTERS)),
        )
