"""The compute-bound limit: OpenVINO's own best throughput on the same model file and CPU.

What ``benchmark_app -hint throughput`` does, searched: the ``THROUGHPUT`` performance hint,
``NUM_STREAMS`` over ``--runtime-streams``, the batch over ``--runtime-batches``, and as many
asynchronous infer requests in flight as the compiled model asks for
(``OPTIMAL_NUMBER_OF_INFER_REQUESTS``), through ``AsyncInferQueue``. The best cell is the limit
the server is measured against (``ratio_vs_runtime_best``); the synchronous one-request
reference stays beside it (``ratio_vs_inprocess``). Same precision as the server (f32), same
thread budget (``--threads``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.serving.common import log


@dataclass
class RuntimeCell:
    streams: str  # NUM_STREAMS as asked ("1", "2", "AUTO")
    streams_used: int  # what the compiled model chose
    batch: int
    requests: int  # infer requests in flight
    threads: int
    images_per_s: float
    seconds: float
    when: str = "search"

    def label(self) -> str:
        return (
            f"streams {self.streams} ({self.streams_used}), batch {self.batch}, "
            f"{self.requests} requests"
        )


def measure_async(
    path: Path,
    shape: list[int],
    threads: int,
    streams: str,
    batch: int,
    seconds: float,
    when: str = "search",
) -> RuntimeCell:
    """Images/s of the model compiled with the THROUGHPUT hint and ``streams``, its optimal
    number of requests kept in flight for ``seconds`` (after one warm round per request)."""
    import openvino as ov

    from components.ml.serving.ov_runtime import _core, read_model

    config: dict[str, Any] = {
        "PERFORMANCE_HINT": "THROUGHPUT",
        "NUM_STREAMS": streams,
        "INFERENCE_NUM_THREADS": threads,
        "INFERENCE_PRECISION_HINT": "f32",
    }
    compiled = _core().compile_model(read_model(path), "CPU", config)
    requests = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    used = int(compiled.get_property("NUM_STREAMS"))
    x = np.random.default_rng(1).standard_normal([batch, *shape[1:]]).astype(np.float32)
    queue = ov.AsyncInferQueue(compiled, requests)
    for _ in range(requests):  # warm every request
        queue.start_async({0: x})
    queue.wait_all()
    started = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds and started < 1_000_000:
        queue.start_async({0: x})  # blocks while every request is busy
        started += 1
    queue.wait_all()
    elapsed = time.perf_counter() - start
    cell = RuntimeCell(
        streams, used, batch, requests, threads, batch * started / elapsed, elapsed, when
    )
    log.info("runtime (%s) %s: %.1f images/s", when, cell.label(), cell.images_per_s)
    return cell


def search(
    path: Path,
    shape: list[int],
    threads: int,
    streams: list[str],
    batches: list[int],
    seconds: float,
) -> list[RuntimeCell]:
    """Every (streams, batch) cell, best first."""
    cells = [measure_async(path, shape, threads, s, b, seconds) for s in streams for b in batches]
    return sorted(cells, key=lambda c: c.images_per_s, reverse=True)


def again(
    path: Path, shape: list[int], best: RuntimeCell, seconds: float, when: str
) -> RuntimeCell:
    """The best cell measured again (a round of the alternation)."""
    return measure_async(path, shape, best.threads, best.streams, best.batch, seconds, when)


def as_dicts(cells: list[RuntimeCell]) -> list[dict[str, Any]]:
    return [asdict(c) for c in cells]
