"""Load generators: wrk (REST), h2load (gRPC), the slow-clients process."""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.serving.common import (
    GRPC_METHOD,
    Cell,
    Load,
    Noise,
    _own_cpu_seconds,
    _process_cpu_seconds,
    busy_cpu_seconds,
    log,
    request_input,
)
from bench.serving.servers import model_stats, scrape_batching
from components.ml.serving import loadgen
from components.ml.serving.loadgen import run_generator


def binary_request(shape: list[int]) -> tuple[bytes, int]:
    """The KServe v2 binary-tensor request every REST load posts (the input of
    :func:`request_input`, the logits asked for as binary): (body, JSON header length)."""
    raw = request_input(shape).tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": shape,
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        },
        separators=(",", ":"),
    ).encode()
    return header + raw, len(header)


class Wrk:
    """The library's wrk driver (``components.ml.serving.loadgen``) posting a random input of a
    shape (``binary_request``)."""

    def __init__(self, binary: str, work: Path):
        self.wrk = loadgen.Wrk(work, binary)
        self.bodies: dict[tuple[int, ...], tuple[Path, int]] = {}
        self.work = work

    def body(self, shape: list[int]) -> tuple[Path, int]:
        """A binary-tensor request with a random input: (file, JSON header length)."""
        key = tuple(shape)
        if key not in self.bodies:
            body, header_len = binary_request(shape)
            path = self.work / f"body-{'x'.join(map(str, shape))}.bin"
            path.write_bytes(body)
            self.bodies[key] = (path, header_len)
        return self.bodies[key]

    def run(
        self, url: str, shape: list[int], concurrency: int, seconds: float
    ) -> tuple[dict[str, float], float, float]:
        """One wrk run: its parsed counters, its CPU seconds, the wall seconds."""
        body, header_len = self.body(shape)
        return self.wrk.run(url, body, header_len, concurrency, seconds)

    def load(self, server: Any, name: str, shape: list[int], concurrency: int) -> Load:
        url = f"http://127.0.0.1:{server.port}/v2/models/{name}/infer"
        return lambda seconds: self.run(url, shape, concurrency, seconds)


def grpc_infer_frame(name: str, shape: list[int], input_name: str, output_name: str) -> bytes:
    """A gRPC message frame (flag 0, big-endian length) of an ``inference.ModelInferRequest``
    built with the generated KServe v2 protobuf stubs ``tritonclient`` ships
    (``tritonclient.grpc.service_pb2``: the same ``inference.GRPCInferenceService`` as
    ``serving/proto``), the tensor in ``raw_input_contents``."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=name)
    tensor = request.inputs.add(name=input_name, datatype="FP32")
    tensor.shape.extend(shape)
    request.outputs.add(name=output_name)
    request.raw_input_contents.append(request_input(shape).tobytes())
    message = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(message)) + message


class H2load:
    """``h2load`` (nghttp2-client) posting one prebuilt gRPC ModelInfer call, closed loop:
    one thread, ``concurrency`` HTTP/2 connections, one stream in flight on each."""

    _REQUESTS = re.compile(
        r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
        r"(\d+) errored, (\d+) timeout"
    )
    _STATUS = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")
    _FINISHED = re.compile(r"finished in ([\d.]+)(us|ms|s),")

    def __init__(self, binary: str, work: Path):
        self.binary = binary
        self.work = work
        self.bodies: dict[tuple[str, tuple[int, ...]], Path] = {}

    def body(self, name: str, shape: list[int]) -> Path:
        key = (name, tuple(shape))
        if key not in self.bodies:
            path = self.work / f"grpc-{name}-{'x'.join(map(str, shape))}.bin"
            path.write_bytes(grpc_infer_frame(name, shape, "image", "logits"))
            self.bodies[key] = path
        return self.bodies[key]

    def run(
        self, url: str, body: Path, concurrency: int, seconds: float
    ) -> tuple[dict[str, float], float, float]:
        """One h2load run: counters named like the wrk script's, its CPU seconds, wall s.
        Extra counters: ``started`` (requests sent, some unanswered at the end)."""
        seconds = max(1, round(seconds))
        requests_log = self.work / "h2load-requests.tsv"
        requests_log.unlink(missing_ok=True)  # h2load appends
        cmd = [
            self.binary,
            "-t1",
            f"-c{concurrency}",
            "-m1",
            f"-D{seconds}",
            "-d",
            str(body),
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            f"--log-file={requests_log}",
            url,
        ]
        code, text, cpu, wall = run_generator(cmd, seconds)
        requests = self._REQUESTS.search(text)
        codes = self._STATUS.search(text)
        finished = self._FINISHED.search(text)
        if code != 0 or not (requests and codes and finished):
            raise RuntimeError(f"h2load failed (exit {code}):\n{text[-2000:]}")
        _, started, done, _, failed, errored, timeout = map(int, requests.groups())
        ok = int(codes.group(1))
        scale = {"us": 1.0, "ms": 1e3, "s": 1e6}[finished.group(2)]
        latencies = [
            int(cols[2])
            for cols in (row.split("\t") for row in requests_log.read_text().splitlines())
            if len(cols) >= 3 and cols[1].startswith("2")
        ]
        pct = np.percentile(latencies, [50, 90, 99]) if latencies else [0.0, 0.0, 0.0]
        stats = {
            "requests": float(ok),
            "started": float(started),
            "done": float(done),
            "duration_us": float(finished.group(1)) * scale,
            "p50_us": float(pct[0]),
            "p90_us": float(pct[1]),
            "p99_us": float(pct[2]),
            "max_us": float(max(latencies, default=0)),
            "connect": 0.0,
            "read": float(errored - timeout),
            "write": 0.0,
            "status": float(failed - errored),  # answered, but not 2xx
            "timeout": float(timeout),
        }
        return stats, cpu, wall

    def load(self, server: Any, grpc_port: int, name: str, shape: list[int], c: int) -> Load:
        """Runs that must each be real inferences: the server's success count grows by at
        least the 2xx answers and at most the requests started, its fail count not at all."""
        url = f"http://127.0.0.1:{grpc_port}{GRPC_METHOD}"
        body = self.body(name, shape)

        def run(seconds: float) -> tuple[dict[str, float], float, float]:
            ok0, fail0 = model_stats(server.port, name)
            stats, cpu, wall = self.run(url, body, c, seconds)
            ok1, fail1 = model_stats(server.port, name)
            if fail1 != fail0 or not stats["requests"] <= ok1 - ok0 <= stats["started"]:
                raise RuntimeError(
                    f"gRPC: h2load got {stats['requests']:.0f} 2xx answers of "
                    f"{stats['started']:.0f} requests sent, but the server counted "
                    f"{ok1 - ok0} successful and {fail1 - fail0} failed inferences: the "
                    "answers were not (all) inferences (grpc-status errors travel as HTTP 200)"
                )
            stats["server_success"] = float(ok1 - ok0)
            return stats, cpu, wall

        return run


def measure(
    load: Load,
    server: Any,
    name: str,
    template: Cell,
    seconds: float,
    warmup_s: float,
    noise: Noise,
    side_pids: Sequence[int] = (),
) -> Cell:
    """One cell; measured again (at most ``noise.retries`` times) when the machine was busy
    with other processes meanwhile. The quietest attempt is kept. The CPU of ``side_pids``
    (helpers that are part of the cell) is reported apart, not as ``other``."""
    attempts = []
    for attempt in range(noise.retries + 1):
        if attempt:
            log.warning("  the machine was busy with something else: measuring again")
            noise.wait_for_quiet()
        attempts.append(_measure_once(load, server, name, template, seconds, warmup_s, side_pids))
        if attempts[-1].other_cpu_pct <= noise.threshold_pct:
            break
    return min(attempts, key=lambda c: c.other_cpu_pct)


def _measure_once(
    load: Load,
    server: Any,
    name: str,
    template: Cell,
    seconds: float,
    warmup_s: float,
    side_pids: Sequence[int],
) -> Cell:
    cell = dataclasses.replace(template)
    if warmup_s > 0:
        load(warmup_s)
    metrics0 = scrape_batching(server.port, name) if cell.target == "cpp" else None
    server0, busy0, own0 = (
        _process_cpu_seconds(server.proc.pid),
        busy_cpu_seconds(),
        _own_cpu_seconds(),
    )
    side0 = sum(_process_cpu_seconds(pid) for pid in side_pids)
    stats, gen_cpu, wall = load(seconds)
    server_cpu = _process_cpu_seconds(server.proc.pid) - server0
    side_cpu = sum(_process_cpu_seconds(pid) for pid in side_pids) - side0
    other = (
        (busy_cpu_seconds() - busy0) - server_cpu - gen_cpu - side_cpu - (_own_cpu_seconds() - own0)
    )
    metrics1 = scrape_batching(server.port, name) if metrics0 is not None else None
    if metrics0 is not None and metrics1 is not None:
        d = {k: metrics1[k] - metrics0[k] for k in metrics0}
        if d["kserve_batch_size_count"] > 0:
            cell.mean_batch = d["kserve_batch_size_sum"] / d["kserve_batch_size_count"]
        workers = int(cell.layout.split("x")[0])
        cell.compute_busy_pct = 100 * d["kserve_compute_duration_seconds_sum"] / (wall * workers)
    duration = stats["duration_us"] / 1e6
    cell.requests = int(stats["requests"])
    cell.duration_s = duration
    cell.throughput = stats["requests"] / duration
    cell.p50_ms = stats["p50_us"] / 1000
    cell.p90_ms = stats["p90_us"] / 1000
    cell.p99_ms = stats["p99_us"] / 1000
    cell.max_ms = stats["max_us"] / 1000
    cell.errors = int(sum(stats[k] for k in ("connect", "read", "write", "status", "timeout")))
    cell.generator_cpu_pct = 100 * gen_cpu / wall
    cell.server_cpu_pct = 100 * server_cpu / wall
    cell.other_cpu_pct = 100 * max(0.0, other) / wall
    if side_pids:
        cell.side_cpu_pct = 100 * side_cpu / wall
    log.info(
        "%-8s %-7s %s %-8s %-4s %s batching %-3s c=%-2d %8.1f req/s  p50 %7.2f ms  "
        "p99 %7.2f ms  errors %d  gen CPU %3.0f%%  server CPU %3.0f%%  other CPU %3.0f%%  "
        "mean batch %s",
        cell.regime,
        cell.target,
        cell.model,
        cell.layout,
        cell.protocol,
        cell.background,
        cell.batching,
        cell.concurrency,
        cell.throughput,
        cell.p50_ms,
        cell.p99_ms,
        cell.errors,
        cell.generator_cpu_pct,
        cell.server_cpu_pct,
        cell.other_cpu_pct,
        "-" if cell.mean_batch is None else f"{cell.mean_batch:.1f}",
    )
    return cell
