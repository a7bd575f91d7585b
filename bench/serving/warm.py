"""Warm from the first request: the first answers after a ``load`` swap against the steady
median of the same requests on the same connection.

One C++ digits server with ``--model-control``. Each round swaps a new version in
(``POST /v2/repository/models/<name>/load``), then, at once, sends one request of each batch
size in ``--warm-batches`` (the first of each shape this version sees), then ``--warm-repeats``
more of each: the ratio of a round is the worst first-request latency over its size's median.
A second ratio isolates what warm-up can fix: the first requests against the same requests on
the then-warm version after a pause as long as the swap (any first request after a quiet
spell is slower: sleeping threads, cold caches).
Rounds alternate between the bundle as ``export`` wrote it (``warmup.json``: the server runs
every batch size before the swap) and a copy without ``warmup.json`` (the cold reference).
The verdict is the median over the rounds of each."""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from bench.serving.common import Report, input_shape, log
from bench.serving.loads import binary_request
from bench.serving.servers import start_cpp
from bench.serving.stats import layouts
from components.ml.serving.warmup import WARMUP_FILE

NAME = "digits"


class Client:
    """One keep-alive connection; binary-tensor requests built once per batch size."""

    def __init__(self, port: int, shape: list[int]):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.shape = shape
        self.bodies: dict[int, tuple[bytes, int]] = {}

    def _body(self, batch: int) -> tuple[bytes, int]:
        if batch not in self.bodies:
            self.bodies[batch] = binary_request([batch, *self.shape[1:]])
        return self.bodies[batch]

    def call(self, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> bytes:
        self.conn.request(method, path, body=body, headers=headers or {})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {resp.status} {data[:300]!r}")
        return data

    def infer_ms(self, batch: int) -> float:
        body, header_len = self._body(batch)
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(header_len),
        }
        start = time.perf_counter()
        self.call("POST", f"/v2/models/{NAME}/infer", body, headers)
        return (time.perf_counter() - start) * 1e3

    def load(self, model_dir: Path, version: int) -> float:
        """Seconds the swap took (the warm-up runs inside it, before the swap)."""
        doc = {"parameters": {"model_dir": str(model_dir), "version": str(version)}}
        start = time.perf_counter()
        self.call("POST", f"/v2/repository/models/{NAME}/load", json.dumps(doc).encode())
        return time.perf_counter() - start


def one_round(client: Client, model_dir: Path, version: int, args: argparse.Namespace) -> dict:
    swap_s = client.load(model_dir, version)
    first = {b: client.infer_ms(b) for b in args.warm_batches}
    steady = {
        b: statistics.median(client.infer_ms(b) for _ in range(args.warm_repeats))
        for b in args.warm_batches
    }
    # the same first requests on this version, now warm, after a pause as long as the swap:
    # what any first request after a quiet spell costs on this machine (waking threads and
    # caches), which no warm-up can remove
    time.sleep(max(swap_s, 0.05))
    idle = {b: client.infer_ms(b) for b in args.warm_batches}
    ratio = {b: first[b] / steady[b] for b in args.warm_batches}
    worst = max(ratio, key=lambda b: ratio[b])
    return {
        "version": version,
        "swap_s": round(swap_s, 3),
        "first_ms": {b: round(v, 3) for b, v in first.items()},
        "p50_ms": {b: round(v, 3) for b, v in steady.items()},
        "after_pause_ms": {b: round(v, 3) for b, v in idle.items()},
        "ratio": round(ratio[worst], 3),
        "worst_batch": worst,
        "ratio_vs_pause": round(max(first[b] / idle[b] for b in args.warm_batches), 3),
    }


def run_warmup(args: argparse.Namespace, report: Report, work: Path) -> None:
    model_dir = args.digits_dir
    if not (model_dir / WARMUP_FILE).is_file():
        note = f"warm-up: {model_dir / WARMUP_FILE} missing (export.warmup_samples: 0?)"
        report.notes.append(note)
        return
    cold_dir = work / "digits-cold"
    shutil.rmtree(cold_dir, ignore_errors=True)
    shutil.copytree(model_dir, cold_dir, ignore=shutil.ignore_patterns(WARMUP_FILE, "warmup"))
    ((workers, threads),) = layouts(args.digits_layout)
    server_args = argparse.Namespace(
        **{**vars(args), "server_args": [*args.server_args, "--model-control=true"]}
    )
    max_batch = max(args.max_batch_size, *args.warm_batches)
    server = start_cpp(
        server_args, model_dir, NAME, workers, threads, True, work / "cpp-warm.log", 0, max_batch
    )
    rounds: dict[str, list[dict[str, Any]]] = {"warm": [], "cold": []}
    try:
        client = Client(server.port, input_shape(model_dir))
        client.call("GET", "/v2/health/ready")
        version = 1
        for i in range(args.warm_rounds):
            for label in ("warm", "cold") if i % 2 == 0 else ("cold", "warm"):
                version += 1
                directory = model_dir if label == "warm" else cold_dir
                rounds[label].append(one_round(client, directory, version, args))
                log.info("warm-up round %s: %s", label, rounds[label][-1])
    finally:
        server.stop()
    report.warmup = {
        "batches": list(args.warm_batches),
        "layout": f"{workers}x{threads}",
        "max_batch_size": max_batch,
        "rounds": rounds,
        "first_request_vs_p50": statistics.median(r["ratio"] for r in rounds["warm"]),
        "first_request_vs_p50_cold": statistics.median(r["ratio"] for r in rounds["cold"]),
        "first_request_vs_pause": statistics.median(r["ratio_vs_pause"] for r in rounds["warm"]),
        "first_request_vs_pause_cold": statistics.median(
            r["ratio_vs_pause"] for r in rounds["cold"]
        ),
        "swap_s": statistics.median(r["swap_s"] for r in rounds["warm"]),
        "swap_s_cold": statistics.median(r["swap_s"] for r in rounds["cold"]),
    }
