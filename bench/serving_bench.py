"""Serving benchmark: the C++ KServe-v2 server against its limits and a Python baseline.

Two regimes, one run, everything on 127.0.0.1 and on the same cores:

- **compute-bound**: a random-initialised ``paddle.vision`` ResNet (18 by default) at
  224x224, fp32. (a) in-process OpenVINO (``OVPredictor``: one compiled model, synchronous
  calls at batch 16 and 32, the same total thread count the server gets), measured before and
  after the server runs: the upper limit is the better of the two. (b) the C++ server over
  HTTP, binary tensors, batch-1 requests at concurrency 1, 4 and 16, dynamic batching on
  (``--resnet-max-batch-size`` 8: at concurrency 16 one batch runs while the requests of
  the next arrive; ``--queue-delay-us`` 20000: a free worker waits, at most that long, for the
  clients it just answered to send their next request, so N closed-loop clients make batches
  of N) and off, for every worker layout of the same thread budget
  (``--workers 1 --threads-per-worker 2`` and ``--workers 2 --threads-per-worker 1``: the
  server compiles one model with one stream per worker). Then the ``--compute-candidates``
  (3) best (b) cells and the best (a) batch are measured again in alternation: each round
  measures (a) and then every candidate, so each ratio compares runs seconds apart. A
  candidate's ratio is the median of its rounds' ratios; ``ratio_vs_inprocess`` = the best
  of those medians (every candidate's is printed, and the table's best of many single cells
  / best of a few in-process runs beside it). Those rounds (``--compute-rounds`` 8 of
  ``--compute-round-seconds`` 6 s a side) are short enough that a slow phase of the
  machine hits both sides of a pair, long enough that a batch (~0.1 s) more or less in the
  window moves a round by ~2%.
- **overhead-bound**: the digits model (``outputs/export``, fp32), batch-1 requests, every
  server 1 worker x 1 thread (``--digits-layout``). (b) the C++ server vs (c)
  ``bench/python_server.py`` (FastAPI + uvicorn around the same ``OVPredictor``), same model
  file. The three servers (C++ batching off, C++ batching on, Python) run at once; at each
  concurrency every one of them is measured in turn, ``--repeats`` rounds (5, the order
  rotating), and a cell reports the median of its rounds with every round's req/s. A ratio
  between two servers is the median of the rounds' ratios (each a pair of runs seconds
  apart), so a slow phase of the machine (other tenants of the host) does not decide it.
  ``ratio_vs_python`` = (b) / (c) requests/s at concurrency 16
  (``--overhead-concurrency``), like for like: one inference per request, i.e. the C++
  server's dynamic batching off (the baseline has none). Beside it, on the C++ server:

  * **batching on vs off** at ``--digits-concurrency`` (1, 4 and 16): two server processes
    that differ only in ``--dynamic-batching`` (on: ``--digits-queue-delay-us``, default 0 like
    the server and ``params.yaml``; a lone request never waits for it anyway). The batching
    table gives req/s, p50 and p99 of both and the
    on/off ratios; ``batching_cN`` = req/s on / off at concurrency N, ``batching_c1_p50`` =
    p50 on / off at concurrency 1.
  * **gRPC vs REST binary** (batching off, the same server process, ``--grpc-concurrency``:
    16 and 1): REST is the wrk cell above; gRPC is ``h2load`` (nghttp2-client: one thread,
    one HTTP/2 connection per client, one stream at a time on each, i.e. the same closed loop
    as wrk) posting a prebuilt ``inference.GRPCInferenceService/ModelInfer`` call (the gRPC
    length-prefixed frame of a ``ModelInferRequest`` encoded here by hand: model name, the
    input tensor's name, datatype and shape, the requested output and the same raw input
    bytes as the REST body). gRPC failures come back as HTTP 200 with a ``grpc-status``
    trailer, so every h2load run must also grow the server's
    ``/v2/models/<name>/stats`` success count by the number of answers h2load received (at
    most by those it started) with no failure, else the benchmark stops; the answers are
    first checked with ``tritonclient.grpc`` against in-process OpenVINO. Latency
    percentiles come from h2load's per-request ``--log-file``. ``grpc_vs_rest_c16`` = gRPC /
    REST req/s at concurrency 16. Skipped (reported) when the server does not listen on
    gRPC (its "listening" log line has no ``grpc_port`` >= 0) or h2load is missing.
  * **slow clients** (batching off, the same server process, default server flags apart
    from the like-for-like ones below): ``bench/slow_clients.py``, a separate asyncio process,
    holds ``--slow-clients`` (1,000) connections, half of them (``--slow-idle-fraction``)
    connected and silent, the rest trickling a request header one byte every
    ``--slow-interval-ms`` (500 ms); every connection the server closes (its
    ``--header-timeout-ms``, 10 s by default) is opened again at once, as an attacker would:
    the report counts those reconnects, the fewest connections held at once and the
    connect errors. Meanwhile wrk at ``--slow-concurrency`` (16) measures the good clients
    for ``--slow-duration`` seconds (12: longer than the header timeout, so a wave of
    reconnects falls inside): req/s, p99 and errors (non-2xx + socket errors), next to the
    same wrk cell without slow clients. ``slow_clients_p99_ms`` and ``slow_clients_errors``
    are those of the good clients. The server's RSS (``/proc/<pid>``, psutil) is read
    before the connections open and once they are all open (the server's ESTABLISHED
    sockets on its HTTP port, counted with psutil): ``rss_per_idle_conn_kib`` = RSS growth /
    connections gained — every held connection counts, idle or trickling (none has sent a
    whole header), so it is an upper bound for a silent one. The helper's CPU is reported
    and kept out of ``other``.

Like-for-like server settings: the C++ server runs with ``--access-log=false`` (the baseline
logs no requests) and ``--keep-alive-max-count=1000000`` (uvicorn never closes a busy
keep-alive connection; the server's default closes it every 100 requests); ``--server-arg``
adds or overrides flags. OpenVINO CPU pinning is off everywhere (the server's default; the
Python baseline and the in-process runs are given the same), or on everywhere with
``--cpu-pinning``.

Load generator: ``wrk`` (one epoll thread, keep-alive connections = concurrency, a Lua script
posting a prebuilt binary-tensor request), a separate process, identical for every REST target
(``h2load`` for gRPC, above). Each cell: a warm-up run, then a timed run; the generator
reports requests, latency percentiles (send to last byte of the response) and errors. It
shares the cores with the server: its CPU time (``wait4`` rusage) over the wall time is
reported, and so are the server's (psutil), the rest of the machine's (``other``: other
tenants; a cell where it exceeds ``--noise-threshold`` is measured again, at most
``--retries`` times, keeping the quietest) and, from the C++ server's ``/metrics``, the mean
executed batch and the backend's busy time. Every server's answers are first checked with
``tritonclient.http`` (binary) and the repo's ``KServeClient`` (JSON) against in-process
OpenVINO on the same inputs.

    .venv/bin/python bench/serving_bench.py [--arch resnet50] [--quick] [--json out.json]
        [--only resnet|digits|batching|python|grpc|slow-clients ...]

``--quick``: 2 s cells, 2 rounds, ResNet at concurrency 1 and 16 in one layout, digits at
concurrency 1 and 16, a 3 s slow-clients cell. ``--only`` (repeatable) runs some parts:
``resnet`` (the compute-bound regime with the in-process limit), ``batching``, ``python``,
``grpc``, ``slow-clients``, or ``digits`` (all four); the C++ batching-off server runs
whenever a digits part needs it. The report ends with the done-when targets (batching on >=
0.9x off in req/s at c1 with p50 <= 1.2x, >= 1.0x at c16; good clients' p99 < 50 ms and no
errors among slow clients; < 64 KiB of RSS per held connection; the server >= 0.95x
in-process; >= 5x the FastAPI baseline), each met / NOT met / not measured.

The last line printed is machine-readable::

    ratio_vs_inprocess=X ratio_vs_python=Y batching_c1=A batching_c16=B slow_clients_p99_ms=P
    batching_c1_p50=Q grpc_vs_rest_c16=G rss_per_idle_conn_kib=R slow_clients_errors=E

(one line; ``nan`` for what was not measured, e.g. with ``--skip-cpp`` or ``--only``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from components.ml.ov_runtime import OVPredictor  # noqa: E402
from components.steps.serving_image import RunningServer, ServerProcess  # noqa: E402

log = logging.getLogger("serving_bench")

DEFAULT_BINARY = REPO / "build" / "serving" / "paddle-mlops-server"
DEFAULT_DIGITS = REPO / "outputs" / "export"
PYTHON_SERVER = REPO / "bench" / "python_server.py"
SLOW_CLIENTS = REPO / "bench" / "slow_clients.py"
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
# what --only selects; "digits" is every overhead-bound part
PARTS = ("resnet", "batching", "python", "grpc", "slow-clients")
DIGITS_PARTS = ("batching", "python", "grpc", "slow-clients")

# A load generator run: seconds -> (counters like the wrk script's, its CPU seconds, wall s).
Load = Callable[[float], tuple[dict[str, float], float, float]]

# wrk: POST the prebuilt request (JSON header + raw tensor bytes) on every connection and print
# one machine-readable line at the end. No response() hook: it would make wrk run Lua on
# every response and cost generator CPU; non-2xx answers are counted in errors.status anyway.
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


# --------------------------------------------------------------------------- results


@dataclass
class Cell:
    regime: str  # compute | overhead
    target: str  # cpp | python
    model: str
    layout: str  # "<workers>x<threads per worker>"
    batching: str  # on | off | n/a
    concurrency: int
    protocol: str = "rest"  # rest (wrk, binary tensors) | grpc (h2load)
    background: str = "-"  # "-" | "slow<N>": N slow clients held meanwhile
    requests: int = 0
    duration_s: float = 0.0
    throughput: float = 0.0  # requests/s (= images/s: batch-1 requests)
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    errors: int = 0
    generator_cpu_pct: float = 0.0  # of one core
    server_cpu_pct: float = 0.0  # of one core
    other_cpu_pct: float = 0.0  # every other process on the machine, of one core
    mean_batch: float | None = None  # C++ server: samples per executed batch (/metrics)
    compute_busy_pct: float | None = None  # C++ server: backend time / (wall x workers)
    side_cpu_pct: float | None = None  # helper processes (slow clients), of one core
    # repeated cells (--repeats): the fields above are medians; one entry per round, in
    # round order, so cells measured in the same rounds pair up
    rps_samples: list[float] = field(default_factory=list)
    p50_samples: list[float] = field(default_factory=list)


@dataclass
class InProcess:
    batch: int
    threads: int
    iterations: int
    seconds: float
    images_per_s: float
    latency_ms_p50: float
    other_cpu_pct: float  # the rest of the machine meanwhile (100 = one core)
    when: str = "before"  # before | after the server runs (the limit is the better of both)


@dataclass
class Report:
    arch: str
    machine: dict[str, Any]
    settings: dict[str, Any]
    inprocess: list[InProcess] = field(default_factory=list)
    cells: list[Cell] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    slow_clients: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # skipped parts and why
    ratios: dict[str, Any] = field(default_factory=dict)
    # ResNet: the best server cell and the best in-process batch, measured in alternation
    compute_rounds: list[dict[str, float]] = field(default_factory=list)
    elapsed_s: float = 0.0


# --------------------------------------------------------------------------- models


def export_resnet(arch: str, dest: Path) -> Path:
    """``dest/legacy/model.pdmodel`` + a ``signature.json`` the server (and baseline) read."""
    import paddle
    from paddle.vision import models

    from components.ml.modelio import save_legacy
    from components.ml.ov_runtime import read_model

    paddle.seed(0)
    model = getattr(models, arch)(pretrained=False)
    model.eval()
    spec = [paddle.static.InputSpec([-1, 3, 224, 224], "float32", "image")]
    save_legacy(model, spec, dest / "legacy" / "model")
    ov_model = read_model(dest / "legacy" / "model.pdmodel")
    signature = {
        "task": arch,
        "inputs": [{"name": "image", "shape": [-1, 3, 224, 224], "dtype": "float32"}],
        "outputs": [{"name": "logits", "shape": [-1, 1000], "dtype": "float32"}],
        "formats": {
            "legacy": {
                "program": "legacy/model.pdmodel",
                "params": "legacy/model.pdiparams",
                "input_names": [p.get_any_name() for p in ov_model.inputs],
                "output_names": [p.get_any_name() for p in ov_model.outputs],
            }
        },
        "paddle_version": paddle.__version__,
    }
    (dest / "signature.json").write_text(json.dumps(signature, indent=2))
    return dest


def model_file(model_dir: Path) -> Path:
    signature = json.loads((model_dir / "signature.json").read_text())
    return model_dir / signature["formats"]["legacy"]["program"]


def input_shape(model_dir: Path) -> list[int]:
    signature = json.loads((model_dir / "signature.json").read_text())
    return [1 if d == -1 else int(d) for d in signature["inputs"][0]["shape"]]


@dataclass(frozen=True)
class Noise:
    """Other processes share this machine: measure again when they were busy meanwhile."""

    threshold_pct: float = 25.0  # CPU of everything else, 100 = one core
    retries: int = 2
    quiet_wait_s: float = 30.0

    def wait_for_quiet(self) -> float:
        """Wait (bounded) until a 1 s sample shows the machine idle; its busy %."""
        deadline = time.monotonic() + self.quiet_wait_s
        while True:
            busy0, t0 = busy_cpu_seconds(), time.perf_counter()
            time.sleep(1.0)
            pct = 100 * (busy_cpu_seconds() - busy0) / (time.perf_counter() - t0)
            if pct <= self.threshold_pct or time.monotonic() >= deadline:
                return pct


def measure_inprocess(
    path: Path,
    shape: list[int],
    threads: int,
    batches: list[int],
    seconds: float,
    max_iters: int,
    noise: Noise,
    when: str = "before",
    cpu_pinning: bool = False,
) -> list[InProcess]:
    """Images/s of one compiled model, synchronous calls, time- and count-bounded."""
    predictor = OVPredictor(path, threads=threads, cpu_pinning=cpu_pinning)
    rng = np.random.default_rng(1)
    rows = []
    for bs in batches:
        x = rng.standard_normal([bs, *shape[1:]]).astype(np.float32)
        for _ in range(2):
            predictor.run([x])
        attempts = []
        for attempt in range(noise.retries + 1):
            if attempt:
                noise.wait_for_quiet()
            times: list[float] = []
            busy0, own0 = busy_cpu_seconds(), _own_cpu_seconds()
            start = time.perf_counter()
            while len(times) < max_iters and time.perf_counter() - start < seconds:
                t0 = time.perf_counter()
                predictor.run([x])
                times.append(time.perf_counter() - t0)
            elapsed = time.perf_counter() - start
            other = (busy_cpu_seconds() - busy0) - (_own_cpu_seconds() - own0)
            attempts.append(
                InProcess(
                    batch=bs,
                    threads=threads,
                    iterations=len(times),
                    seconds=elapsed,
                    images_per_s=bs * len(times) / elapsed,
                    latency_ms_p50=float(np.median(times) * 1000),
                    other_cpu_pct=100 * max(0.0, other) / elapsed,
                    when=when,
                )
            )
            log.info(
                "in-process (%s) batch %d, %d threads: %.1f images/s (%.2f ms per call), "
                "other CPU %.0f%%",
                when,
                bs,
                threads,
                attempts[-1].images_per_s,
                attempts[-1].latency_ms_p50,
                attempts[-1].other_cpu_pct,
            )
            if attempts[-1].other_cpu_pct <= noise.threshold_pct:
                break
            log.warning("  the machine was busy with something else: measuring again")
        rows.append(min(attempts, key=lambda r: r.other_cpu_pct))
    return rows


def busy_cpu_seconds() -> float:
    """Non-idle CPU seconds of the whole machine so far (all cores)."""
    import psutil

    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0))


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _process_cpu_seconds(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def scrape_batching(port: int, name: str) -> dict[str, float] | None:
    """Sums and counts of the C++ server's batch-size and compute-time histograms."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        for metric in ("kserve_batch_size", "kserve_compute_duration_seconds"):
            for suffix in ("_sum", "_count"):
                if line.startswith(metric + suffix + "{") and f'model="{name}"' in line:
                    out[metric + suffix] = float(line.rsplit(" ", 1)[1])
    return out if len(out) == 4 else None


# --------------------------------------------------------------------------- servers


class PythonServer(ServerProcess):
    """``bench/python_server.py`` on a free loopback port, managed like the C++ server."""

    def __init__(
        self,
        model_dir: Path,
        name: str,
        workers: int,
        threads: int,
        log_file: Path,
        cpu_pinning: bool = False,
    ):
        super().__init__(
            lambda port: [
                sys.executable,
                str(PYTHON_SERVER),
                f"--model-dir={model_dir}",
                f"--model-name={name}",
                "--host=127.0.0.1",
                f"--port={port}",
                f"--workers={workers}",
                f"--threads={threads}",
                "--cpu-pinning" if cpu_pinning else "--no-cpu-pinning",
            ],
            name,
            log_file,
        )


def start_cpp(
    args: argparse.Namespace,
    model_dir: Path,
    name: str,
    workers: int,
    threads: int,
    batching: bool,
    log_file: Path,
    queue_delay_us: int,
    max_batch_size: int,
) -> RunningServer:
    """The C++ server, the grid cell's settings as flags (they override the bundle's
    model_config.json); batching on and off differ only in ``--dynamic-batching``."""
    extra = [
        f"--workers={workers}",
        f"--threads-per-worker={threads}",
        f"--max-batch-size={max_batch_size}",
        f"--max-queue-delay-us={queue_delay_us}",
        f"--dynamic-batching={'true' if batching else 'false'}",
        "--access-log=false",  # the Python baseline logs no requests either
        "--keep-alive-max-count=1000000",  # uvicorn never closes a busy keep-alive connection
        f"--cpu-pinning={'true' if args.cpu_pinning else 'false'}",
        *args.server_args,
    ]
    server = RunningServer(args.server_binary, model_dir, "fp32", name, log_file, extra_args=extra)
    _ready_or_raise(server, args.startup_timeout, log_file)
    return server


def start_python(
    model_dir: Path,
    name: str,
    workers: int,
    threads: int,
    log_file: Path,
    startup_s: float,
    cpu_pinning: bool = False,
) -> PythonServer:
    server = PythonServer(model_dir, name, workers, threads, log_file, cpu_pinning)
    _ready_or_raise(server, startup_s, log_file)
    return server


def _ready_or_raise(server: Any, timeout_s: float, log_file: Path) -> None:
    try:
        server.wait_ready(timeout_s)
    except Exception:
        server.stop()
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"server did not start; log tail:\n{tail}") from None


def listening_record(log_file: Path) -> dict[str, Any]:
    """The C++ server's "listening" log line (its ports and its whole configuration)."""
    for line in log_file.read_text(errors="replace").splitlines():
        if '"listening"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("msg") == "listening":
            return record
    return {}


def grpc_port_of(log_file: Path) -> int | None:
    """The port the server's gRPC endpoint listens on, None when it has none."""
    port = listening_record(log_file).get("grpc_port")
    return int(port) if isinstance(port, int) and port > 0 else None


def model_stats(port: int, name: str) -> tuple[int, int]:
    """(success, fail) request counts of ``/v2/models/<name>/stats``."""
    url = f"http://127.0.0.1:{port}/v2/models/{name}/stats"
    with urllib.request.urlopen(url, timeout=10) as resp:
        stats = json.loads(resp.read())["model_stats"][0]["inference_stats"]
    return int(stats["success"]["count"]), int(stats["fail"]["count"])


def rss_bytes(pid: int) -> int:
    import psutil

    return int(psutil.Process(pid).memory_info().rss)


def established(pid: int, port: int) -> int:
    """The process's ESTABLISHED TCP connections on local ``port`` (accepted ones)."""
    import psutil

    return sum(
        1
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port
    )


def _probe(reference: OVPredictor, shape: list[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Four random inputs of ``shape`` and in-process OpenVINO's answers, one at a time."""
    x = np.random.default_rng(seed).standard_normal([4, *shape[1:]]).astype(np.float32)
    expected = np.concatenate([reference.run([x[i : i + 1]])[0].copy() for i in range(len(x))])
    return x, expected


def _verdict(label: str, answers: list[np.ndarray], expected: np.ndarray) -> dict[str, Any]:
    """Every answer (each compared with the leading rows of ``expected``) within 1e-3 of the
    reference's scale, else RuntimeError."""
    scale = max(1.0, float(np.abs(expected).max()))
    diff = max(float(np.abs(a - expected[: len(a)]).max()) for a in answers)
    ok = diff <= 1e-3 * scale
    if not ok:
        raise RuntimeError(f"{label}: answers differ from in-process OpenVINO by {diff:.3g}")
    return {"target": label, "max_abs_diff": diff, "scale": scale, "passed": ok}


def check_answers(
    server: Any, name: str, reference: OVPredictor, shape: list[int], label: str
) -> dict[str, Any]:
    """Binary (tritonclient) and JSON (KServeClient) answers vs in-process OpenVINO."""
    import tritonclient.http as httpclient

    x, expected = _probe(reference, shape, 7)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=60.0)
    try:
        got = []
        for i in range(len(x)):
            tensor = httpclient.InferInput("image", list(x[i : i + 1].shape), "FP32")
            tensor.set_data_from_numpy(x[i : i + 1], binary_data=True)
            wanted = [httpclient.InferRequestedOutput("logits", binary_data=True)]
            got.append(client.infer(name, [tensor], outputs=wanted).as_numpy("logits"))
    finally:
        client.close()
    json_out = server.client.infer(name, {"image": x[:1]}, binary=False)["logits"]
    return _verdict(label, [np.concatenate(got), json_out], expected)


def check_grpc_answers(
    grpc_port: int, name: str, reference: OVPredictor, shape: list[int], label: str
) -> dict[str, Any]:
    """gRPC answers (``tritonclient.grpc``) vs in-process OpenVINO."""
    import tritonclient.grpc as grpcclient

    x, expected = _probe(reference, shape, 11)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        got = []
        for i in range(len(x)):
            tensor = grpcclient.InferInput("image", list(x[i : i + 1].shape), "FP32")
            tensor.set_data_from_numpy(x[i : i + 1])
            wanted = [grpcclient.InferRequestedOutput("logits")]
            got.append(client.infer(name, [tensor], outputs=wanted).as_numpy("logits"))
    finally:
        client.close()
    return _verdict(f"{label} (gRPC)", [np.concatenate(got)], expected)


# --------------------------------------------------------------------------- load generator


class Wrk:
    def __init__(self, binary: str, work: Path):
        self.binary = binary
        self.script = work / "infer.lua"
        self.script.write_text(WRK_SCRIPT)
        self.bodies: dict[tuple[int, ...], tuple[Path, int]] = {}
        self.work = work

    def body(self, shape: list[int]) -> tuple[Path, int]:
        """A binary-tensor request with a random input: (file, JSON header length)."""
        key = tuple(shape)
        if key not in self.bodies:
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
            path = self.work / f"body-{'x'.join(map(str, shape))}.bin"
            path.write_bytes(header + raw)
            self.bodies[key] = (path, len(header))
        return self.bodies[key]

    def run(
        self, url: str, shape: list[int], concurrency: int, seconds: float
    ) -> tuple[dict[str, float], float, float]:
        """One wrk run: its parsed counters, its CPU seconds, the wall seconds."""
        body, header_len = self.body(shape)
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
        with tempfile.TemporaryFile() as out:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
            watchdog = threading.Timer(seconds + 60.0, proc.kill)
            watchdog.start()
            try:
                _, status, usage = os.wait4(proc.pid, 0)  # reaps it, with its rusage
            finally:
                watchdog.cancel()
            proc.returncode = os.waitstatus_to_exitcode(status)
            wall = time.perf_counter() - t0
            out.seek(0)
            text = out.read().decode(errors="replace")
        line = next((ln for ln in text.splitlines() if ln.startswith("BENCH ")), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"wrk failed (exit {proc.returncode}):\n{text[-2000:]}")
        stats = {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
        return stats, usage.ru_utime + usage.ru_stime, wall

    def load(self, server: Any, name: str, shape: list[int], concurrency: int) -> Load:
        url = f"http://127.0.0.1:{server.port}/v2/models/{name}/infer"
        return lambda seconds: self.run(url, shape, concurrency, seconds)


def request_input(shape: list[int]) -> np.ndarray:
    """The one input every load generator posts (REST and gRPC alike)."""
    return np.random.default_rng(3).standard_normal(shape).astype("<f4")


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
        with tempfile.TemporaryFile() as out:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
            watchdog = threading.Timer(seconds + 60.0, proc.kill)
            watchdog.start()
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            finally:
                watchdog.cancel()
            proc.returncode = os.waitstatus_to_exitcode(status)
            wall = time.perf_counter() - t0
            out.seek(0)
            text = out.read().decode(errors="replace")
        requests = self._REQUESTS.search(text)
        codes = self._STATUS.search(text)
        finished = self._FINISHED.search(text)
        if proc.returncode != 0 or not (requests and codes and finished):
            raise RuntimeError(f"h2load failed (exit {proc.returncode}):\n{text[-2000:]}")
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
        return stats, usage.ru_utime + usage.ru_stime, wall

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


def summarize(samples: list[Cell]) -> Cell:
    """One cell from its repeated measurements: the median of every number, the samples
    kept (``rps_samples``/``p50_samples`` in round order), errors summed."""
    cell = dataclasses.replace(samples[0])

    for name in (
        "duration_s",
        "throughput",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "max_ms",
        "generator_cpu_pct",
        "server_cpu_pct",
        "other_cpu_pct",
        "mean_batch",
        "compute_busy_pct",
        "side_cpu_pct",
    ):
        values = [v for v in (getattr(c, name) for c in samples) if v is not None]
        setattr(cell, name, median(values))
    cell.requests = sum(c.requests for c in samples)
    cell.errors = sum(c.errors for c in samples)
    cell.rps_samples = [c.throughput for c in samples]
    cell.p50_samples = [c.p50_ms for c in samples]
    return cell


def paired(a: Cell, b: Cell, what: str = "rps") -> list[float]:
    """Round-by-round ratios a / b of two cells measured in the same rounds."""
    xs = a.rps_samples if what == "rps" else a.p50_samples
    ys = b.rps_samples if what == "rps" else b.p50_samples
    if not xs or len(xs) != len(ys):  # not repeated: the single numbers
        xs, ys = (
            [a.throughput if what == "rps" else a.p50_ms],
            [b.throughput if what == "rps" else b.p50_ms],
        )
    return [x / y for x, y in zip(xs, ys, strict=True) if y > 0]


def median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if values else None


# --------------------------------------------------------------------------- slow clients


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


# --------------------------------------------------------------------------- report


def layouts(spec: str) -> list[tuple[int, int]]:
    out = []
    for item in spec.split(","):
        w, t = item.lower().split("x")
        out.append((int(w), int(t)))
    return out


def best(cells: list[Cell], **match: Any) -> Cell | None:
    chosen = [c for c in cells if all(getattr(c, k) == v for k, v in match.items())]
    return max(chosen, key=lambda c: c.throughput, default=None)


def _digits_rest(cells: list[Cell], **match: Any) -> Cell | None:
    """The C++ digits REST cell without background load matching ``match``."""
    return best(cells, regime="overhead", target="cpp", protocol="rest", background="-", **match)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def targets(r: dict[str, Any]) -> list[tuple[str, bool | None]]:
    """The done-when targets: (what, met); met is None when something was not measured."""
    rules: list[tuple[str, tuple[str, ...], Callable[..., bool]]] = [
        (
            "batching on >= 0.9x off in req/s at c1, p50 <= 1.2x",
            ("batching_c1", "batching_c1_p50"),
            lambda rps, p50: rps >= 0.9 and p50 <= 1.2,
        ),
        ("batching on >= 1.0x off in req/s at c16", ("batching_c16",), lambda rps: rps >= 1.0),
        (
            "compute-bound: server >= 0.95x in-process (median of the rounds)",
            ("ratio_vs_inprocess",),
            lambda ratio: ratio >= 0.95,
        ),
        (
            "C++ (batching off) >= 5x the FastAPI baseline at c16",
            ("ratio_vs_python",),
            lambda ratio: ratio >= 5.0,
        ),
        (
            "good clients among slow ones: p99 < 50 ms, no errors",
            ("slow_clients_p99_ms", "slow_clients_errors"),
            lambda p99, errors: p99 < 50 and errors == 0,
        ),
        (
            "server RSS < 64 KiB per idle connection",
            ("rss_per_idle_conn_kib",),
            lambda kib: kib < 64,
        ),
    ]
    out: list[tuple[str, bool | None]] = []
    for what, keys, rule in rules:
        values = [r.get(k) for k in keys]
        out.append((what, None if None in values else bool(rule(*values))))
    return out


def render(report: Report) -> str:
    cpus = report.machine["cpus"]
    lines = [
        f"serving benchmark: {report.arch} 224x224 (compute-bound) and digits 28x28 "
        f"(overhead-bound), fp32, OpenVINO CPU, f32 precision hint",
        f"machine: {cpus} CPUs ({report.machine['cpu_model']}); load generator: wrk (REST) / "
        "h2load (gRPC), 1 thread, keep-alive, binary tensors, batch-1 requests; CPU% = CPU time "
        "/ wall time, 100% = one core",
    ]
    if report.inprocess:
        lines += [
            "",
            "in-process OpenVINO (one compiled model, synchronous calls):",
            "  when    batch  threads   images/s   ms/call   other%",
        ]
    for r in report.inprocess:
        lines.append(
            f"  {r.when:<6}  {r.batch:>5}  {r.threads:>7}  {r.images_per_s:>9.1f}"
            f"  {r.latency_ms_p50:>8.2f}  {r.other_cpu_pct:>7.0f}"
        )
    lines += [
        "",
        f"{'regime':<9}{'target':<7}{'model':<9}{'WxT':>4}{'batching':>9}{'proto':>6}"
        f"{'bg':>9}{'conc':>5}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'err':>4}{'batch':>6}"
        f"{'busy%':>6}{'gen CPU%':>9}{'srv CPU%':>9}{'other%':>7}  req/s of each round",
    ]
    for c in report.cells:
        batch = "-" if c.mean_batch is None else f"{c.mean_batch:.1f}"
        busy = "-" if c.compute_busy_pct is None else f"{c.compute_busy_pct:.0f}"
        each = " ".join(f"{x:.0f}" for x in c.rps_samples) if len(c.rps_samples) > 1 else ""
        lines.append(
            f"{c.regime:<9}{c.target:<7}{c.model:<9}{c.layout:>4}{c.batching:>9}"
            f"{c.protocol:>6}{c.background:>9}{c.concurrency:>5}{c.throughput:>9.1f}"
            f"{c.p50_ms:>9.2f}{c.p99_ms:>9.2f}{c.errors:>4}{batch:>6}{busy:>6}"
            f"{c.generator_cpu_pct:>9.0f}{c.server_cpu_pct:>9.0f}{c.other_cpu_pct:>7.0f}"
            f"  {each}".rstrip()
        )
    lines += [
        "",
        "batch = mean samples per executed batch, busy% = backend compute time / (wall x "
        "workers) (C++ /metrics; batches straddling the window count whole); gen = wrk or "
        "h2load, srv = server process, other = the rest of the machine (noise: should be ~0; "
        "the slow-clients helper's CPU is not in it); bg = background load (slowN: N slow "
        "clients held); a cell measured in several rounds shows the median of each "
        "number and every round's req/s",
    ]
    r = report.ratios
    if r.get("batching"):
        lines += [
            "",
            "digits, C++ server, dynamic batching on vs off (REST binary; medians; a ratio is "
            "the median of the rounds' on / off ratios, each round's in [ ]):",
            f"  {'conc':>4}{'on req/s':>10}{'off req/s':>11}{'ratio':>7}{'on p50':>8}"
            f"{'off p50':>9}{'ratio':>7}{'on p99':>8}{'off p99':>9}{'ratio':>7}",
        ]
        for b in r["batching"]:
            lines.append(
                f"  {b['concurrency']:>4}{b['on_rps']:>10.1f}{b['off_rps']:>11.1f}"
                f"{_fmt(b['rps_ratio']):>7}{b['on_p50_ms']:>8.2f}{b['off_p50_ms']:>9.2f}"
                f"{_fmt(b['p50_ratio']):>7}{b['on_p99_ms']:>8.2f}{b['off_p99_ms']:>9.2f}"
                f"{_fmt(b['p99_ratio']):>7}"
            )
            if len(b["rps_ratio_rounds"]) > 1:
                lines.append(
                    f"        req/s ratio each round {_rounds(b['rps_ratio_rounds'])}, "
                    f"p50 ratio each round {_rounds(b['p50_ratio_rounds'])}"
                )
    if r.get("grpc"):
        lines += [
            "",
            "digits, C++ server, batching off, one process: gRPC (h2load) vs REST binary (wrk):",
            f"  {'conc':>4}{'gRPC req/s':>12}{'REST req/s':>12}{'ratio':>7}{'gRPC p50':>10}"
            f"{'REST p50':>10}{'gRPC p99':>10}{'REST p99':>10}{'gRPC err':>10}",
        ]
        for g in r["grpc"]:
            lines.append(
                f"  {g['concurrency']:>4}{g['grpc_rps']:>12.1f}{g['rest_rps']:>12.1f}"
                f"{_fmt(g['ratio']):>7}{g['grpc_p50_ms']:>10.2f}{g['rest_p50_ms']:>10.2f}"
                f"{g['grpc_p99_ms']:>10.2f}{g['rest_p99_ms']:>10.2f}{g['grpc_errors']:>10}"
            )
    s = report.slow_clients
    if s:
        with_cell, without = r.get("slow_cell"), r.get("slow_baseline")
        lines += [
            "",
            f"slow clients (digits, C++ server, batching off, --header-timeout-ms="
            f"{s['header_timeout_ms']}, --http-threads={s['http_threads']}, "
            f"--max-connections={s['max_connections']}): {s['connections']} connections from "
            f"bench/slow_clients.py, {s['idle']} idle + {s['trickling']} trickling a header "
            f"1 byte / {s['interval_ms']:.0f} ms, reopened when the server closes them",
        ]
        for label, c in (("without", without), ("with", with_cell)):
            if c is not None:
                lines.append(
                    f"  good clients (wrk c{c['concurrency']}) {label + ' slow clients:':<22}"
                    f"{c['throughput']:>9.1f} req/s  p50 {c['p50_ms']:.2f} ms  "
                    f"p99 {c['p99_ms']:.2f} ms  errors {c['errors']}"
                )
        per_conn = s["rss_per_idle_conn_kib"]
        helper_cpu = "-" if s["helper_cpu_pct"] is None else f"{s['helper_cpu_pct']:.0f}"
        lines += [
            f"  during the cell ({s['window_s']:.0f} s incl. warm-up): at least "
            f"{s.get('held_min')} held, {s.get('reconnects')} reconnects after the server "
            f"closed them, {s.get('connect_errors')} connect errors, answers to slow clients "
            f"{s.get('statuses') or 'none'}; helper CPU "
            f"{helper_cpu}%",
            f"  server RSS {s['rss_before_kib'] / 1024:.1f} MiB with "
            f"{s['server_connections_before']} connections -> {s['rss_open_kib'] / 1024:.1f} MiB "
            f"with {s['server_connections_open']} ({'-' if per_conn is None else f'{per_conn:.1f}'}"
            f" KiB per connection); {s['rss_after_load_kib'] / 1024:.1f} MiB after the load",
        ]
    noisy = [c for c in report.cells if c.other_cpu_pct > report.settings["noise_threshold"]]
    noisy_inprocess = [
        x for x in report.inprocess if x.other_cpu_pct > report.settings["noise_threshold"]
    ]
    if noisy or noisy_inprocess:
        lines.append(
            f"WARNING: {len(noisy) + len(noisy_inprocess)} measurement(s) shared the CPU with "
            "other processes (other% above the threshold even after retries): rerun on a quiet "
            "machine"
        )
    for note in report.notes:
        lines.append(f"NOTE: {note}")
    lines.append("")
    if report.compute_rounds:
        lines.append(
            f"compute-bound, in alternation: the {len(report.compute_rounds[0]['cells'])} best "
            f"server cells of the table vs in-process batch {report.compute_rounds[0]['batch']}:"
        )
        for i, x in enumerate(report.compute_rounds, 1):
            servers = ", ".join(
                f"[{c['cell']}] {c['server']:.1f} ({c['ratio']:.3f})" for c in x["cells"]
            )
            lines.append(f"  round {i}: in-process {x['inprocess']:.1f} images/s; server {servers}")
        for cell, m in r.get("ratio_vs_inprocess_candidates", {}).items():
            lines.append(f"  median ratio [{cell}]: {m:.3f}")
    if r.get("ratio_vs_inprocess") is not None:
        if r.get("ratio_vs_inprocess_from") == "rounds":
            lines.append(
                f"ratio_vs_inprocess = median of the rounds of [{r['server_rounds_cell']}] "
                f"{_rounds(r['ratio_vs_inprocess_rounds'])}"
                f" = {r['ratio_vs_inprocess']:.3f} (from the table alone: best C++ "
                f"{r['server_best']:.1f} / best in-process {r['inprocess_best']:.1f} = "
                f"{_fmt(r.get('ratio_vs_inprocess_table'))})"
            )
        else:
            lines.append(
                f"ratio_vs_inprocess = best C++ server images/s {r['server_best']:.1f} "
                f"({r['server_best_cell']}) / best in-process {r['inprocess_best']:.1f} "
                f"(batch {r['inprocess_best_batch']}, {r['inprocess_best_when']}) = "
                f"{r['ratio_vs_inprocess']:.3f}"
            )
    if r.get("ratio_vs_python") is not None:
        lines.append(
            f"ratio_vs_python = C++ (batching off) / Python req/s at concurrency "
            f"{r['overhead_concurrency']}, median of the rounds "
            f"{_rounds(r['ratio_vs_python_rounds'])} = {r['ratio_vs_python']:.3f} "
            f"(medians {r['cpp_rps']:.1f} / {r['python_rps']:.1f} req/s)"
        )
    if r.get("ratio_vs_python_batching_on") is not None:
        lines.append(
            f"  (C++ with dynamic batching on: {r['cpp_rps_batching_on']:.1f} req/s, "
            f"{r['ratio_vs_python_batching_on']:.3f}x the Python baseline, rounds "
            f"{_rounds(r['ratio_vs_python_batching_on_rounds'])})"
        )
    lines += ["", "targets:"]
    for what, met in targets(r):
        verdict = "not measured" if met is None else "met" if met else "NOT met"
        lines.append(f"  {verdict:<13} {what}")
    lines.append(f"elapsed {report.elapsed_s:.0f} s")
    return "\n".join(lines)


def _rounds(values: Sequence[float]) -> str:
    return "[" + " ".join(f"{v:.3f}" for v in values) + "]"


def _fmt(x: float | None) -> str:
    return "nan" if x is None else f"{x:.3f}"


def last_line(r: dict[str, Any]) -> str:
    """The machine-readable summary (the first two keys keep their place and meaning)."""
    errors = r.get("slow_clients_errors")
    return (
        f"ratio_vs_inprocess={_fmt(r.get('ratio_vs_inprocess'))} "
        f"ratio_vs_python={_fmt(r.get('ratio_vs_python'))} "
        f"batching_c1={_fmt(r.get('batching_c1'))} "
        f"batching_c16={_fmt(r.get('batching_c16'))} "
        f"slow_clients_p99_ms={_fmt(r.get('slow_clients_p99_ms'))} "
        f"batching_c1_p50={_fmt(r.get('batching_c1_p50'))} "
        f"grpc_vs_rest_c16={_fmt(r.get('grpc_vs_rest_c16'))} "
        f"rss_per_idle_conn_kib={_fmt(r.get('rss_per_idle_conn_kib'))} "
        f"slow_clients_errors={'nan' if errors is None else errors}"
    )


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet18", choices=["resnet18", "resnet34", "resnet50"])
    parser.add_argument("--server-binary", type=Path, default=DEFAULT_BINARY)
    parser.add_argument("--digits-dir", type=Path, default=DEFAULT_DIGITS)
    parser.add_argument("--threads", type=int, default=2, help="total inference threads")
    parser.add_argument(
        "--layouts",
        default=None,
        help="C++ worker layouts for the compute-bound regime, e.g. '1x2,2x1' (workers x "
        "threads per worker, each adding up to --threads); default: all of them",
    )
    parser.add_argument(
        "--digits-layout", default="1x1", help="workers x threads for both digits servers"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument(
        "--digits-concurrency",
        type=int,
        nargs="+",
        default=[1, 4, 16],
        help="digits: batching on vs off, and the Python baseline",
    )
    parser.add_argument("--overhead-concurrency", type=int, default=16, help="of ratio_vs_python")
    parser.add_argument(
        "--grpc-concurrency",
        type=int,
        nargs="+",
        default=[16, 1],
        help="digits, batching off: gRPC (h2load) vs REST binary (wrk)",
    )
    parser.add_argument(
        "--slow-clients",
        type=int,
        default=1000,
        help="connections the slow-clients helper holds (0: no slow-clients cell)",
    )
    parser.add_argument(
        "--slow-idle-fraction", type=float, default=0.5, help="of them silent, the rest trickle"
    )
    parser.add_argument(
        "--slow-interval-ms", type=float, default=500.0, help="between trickled header bytes"
    )
    parser.add_argument(
        "--slow-duration",
        type=int,
        default=12,
        help="seconds of the good clients' timed run among slow clients",
    )
    parser.add_argument(
        "--slow-concurrency", type=int, default=16, help="good clients (wrk connections)"
    )
    parser.add_argument("--max-batch-size", type=int, default=16, help="digits servers")
    parser.add_argument(
        "--resnet-max-batch-size",
        type=int,
        default=8,
        help="ResNet servers (8: at concurrency 16 one batch runs while the next one's "
        "requests arrive)",
    )
    parser.add_argument(
        "--queue-delay-us",
        type=int,
        default=20000,
        help="ResNet, batching on: the longest a free worker waits for answered clients to "
        "come back (server default 0: never waits)",
    )
    parser.add_argument(
        "--digits-queue-delay-us",
        type=int,
        default=0,
        help="digits, batching on (server default 0)",
    )
    parser.add_argument("--inprocess-batches", type=int, nargs="+", default=[1, 16, 32])
    parser.add_argument("--duration", type=int, default=4, help="seconds per timed cell")
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="digits: rounds of the compared servers (each measured in turn at each "
        "concurrency); medians and paired ratios are reported",
    )
    parser.add_argument(
        "--compute-rounds",
        type=int,
        default=8,
        help="ResNet: rounds of the best server cell vs the best in-process batch, in turn",
    )
    parser.add_argument(
        "--compute-candidates",
        type=int,
        default=3,
        help="ResNet: how many of the table's best server cells the rounds measure (the "
        "best median ratio is the verdict; every candidate's is printed)",
    )
    parser.add_argument(
        "--compute-round-seconds",
        type=int,
        default=6,
        help="ResNet: seconds of each side of a round (short: the machine's slow phases "
        "then hit both sides of a pair; not too short: whole batches of 16 finish in it)",
    )
    parser.add_argument(
        "--cpu-pinning",
        action="store_true",
        help="OpenVINO CPU pinning for every runtime (C++ server, Python baseline, "
        "in-process); default off, like the server",
    )
    parser.add_argument("--warmup", type=int, default=1, help="seconds of warm-up per cell")
    parser.add_argument("--inprocess-seconds", type=float, default=5.0)
    parser.add_argument(
        "--noise-threshold",
        type=float,
        default=25.0,
        help="CPU %% of other processes (100 = one core) above which a cell is measured again",
    )
    parser.add_argument("--retries", type=int, default=2, help="re-measurements of a noisy cell")
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    parser.add_argument(
        "--server-arg",
        dest="server_args",
        action="append",
        default=[],
        help="extra flag for every C++ server run (repeatable), e.g. --server-arg=--http-threads=8",
    )
    parser.add_argument(
        "--wait-for-binary", type=float, default=0.0, help="seconds to wait for the server binary"
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=[*PARTS, "digits"],
        help="run only these parts (repeatable): resnet, batching, python, grpc, slow-clients, "
        "or digits (the last four); default: everything",
    )
    parser.add_argument("--quick", action="store_true", help="short cells, fewer of them")
    parser.add_argument("--skip-cpp", action="store_true", help="no C++ server (development)")
    parser.add_argument("--work-dir", type=Path, help="keep model, requests and logs here")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.compute_rounds < 1 or args.compute_candidates < 1:
        parser.error("--repeats, --compute-rounds and --compute-candidates must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True, stream=sys.stderr)
    os.environ.setdefault("GLOG_minloglevel", "2")
    chosen = set(args.only or PARTS)
    if "digits" in chosen:
        chosen = (chosen - {"digits"}) | set(DIGITS_PARTS)
    if args.slow_clients <= 0:
        chosen.discard("slow-clients")
    args.parts = [p for p in PARTS if p in chosen]
    if args.quick:
        args.duration, args.warmup, args.inprocess_seconds = 2, 1, 2.0
        args.repeats = min(args.repeats, 2)
        args.compute_rounds = min(args.compute_rounds, 3)
        args.concurrency, args.digits_concurrency = [1, 16], [1, 16]
        args.slow_duration = 3
        args.layouts = args.layouts or f"1x{args.threads}"
        args.inprocess_batches = [16]
    if args.layouts is None:
        args.layouts = ",".join(
            f"{w}x{args.threads // w}" for w in range(1, args.threads + 1) if args.threads % w == 0
        )
    wrk_bin = shutil.which("wrk")
    if wrk_bin is None:
        print("error: wrk not found (apt-get install wrk)", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.wait_for_binary
    while not args.skip_cpp and not args.server_binary.exists() and time.monotonic() < deadline:
        time.sleep(min(10.0, max(0.1, deadline - time.monotonic())))
    if not args.skip_cpp and not args.server_binary.exists():
        print(
            f"error: {args.server_binary} not found: build it with `make serving` "
            "(or pass --server-binary, or --skip-cpp)",
            file=sys.stderr,
        )
        return 2
    digits = any(p in args.parts for p in DIGITS_PARTS)
    if digits and not (args.digits_dir / "signature.json").exists():
        print(f"error: {args.digits_dir}/signature.json not found (dvc repro)", file=sys.stderr)
        return 2

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        report = Report(
            arch=args.arch,
            machine={
                "cpus": os.cpu_count(),
                "cpu_model": _cpu_model(),
                "python": platform.python_version(),
            },
            settings={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        )
        run_all(args, report, work, wrk_bin)
        report.elapsed_s = time.perf_counter() - t_start
        print(render(report))
        if args.json:
            args.json.write_text(json.dumps(asdict(report), indent=2))
    print(last_line(report.ratios))
    return 0


def noise_of(args: argparse.Namespace) -> Noise:
    return Noise(threshold_pct=args.noise_threshold, retries=args.retries)


def run_all(args: argparse.Namespace, report: Report, work: Path, wrk_bin: str) -> None:
    wrk = Wrk(wrk_bin, work)
    busy = noise_of(args).wait_for_quiet()
    log.info("machine busy before the first measurement: %.0f%% of one core", busy)
    if "resnet" in args.parts:
        log.info("exporting %s (random init, paddle.seed(0))", args.arch)
        resnet_dir = export_resnet(args.arch, work / args.arch)
        shape = input_shape(resnet_dir)
        report.inprocess = measure_inprocess(
            model_file(resnet_dir),
            shape,
            args.threads,
            args.inprocess_batches,
            args.inprocess_seconds,
            max_iters=10_000,
            noise=noise_of(args),
            cpu_pinning=args.cpu_pinning,
        )
        if not args.skip_cpp:
            run_compute(args, report, work, wrk, resnet_dir)
            # again after the server runs: the machine's speed drifts; the limit is the better
            report.inprocess += measure_inprocess(
                model_file(resnet_dir),
                shape,
                args.threads,
                [b for b in args.inprocess_batches if b > 1] or args.inprocess_batches,
                args.inprocess_seconds,
                max_iters=10_000,
                noise=noise_of(args),
                when="after",
                cpu_pinning=args.cpu_pinning,
            )
            report.compute_rounds = confirm_compute(args, report, work, wrk, resnet_dir)
    if any(p in args.parts for p in DIGITS_PARTS):
        run_overhead(args, report, work, wrk)
    report.ratios = ratios(report, args.overhead_concurrency)


def run_compute(
    args: argparse.Namespace, report: Report, work: Path, wrk: Wrk, model_dir: Path
) -> None:
    """The C++ server on the ResNet: each worker layout, batching on and off."""
    shape = input_shape(model_dir)
    noise = noise_of(args)
    reference = OVPredictor(model_file(model_dir), threads=args.threads)
    for workers, threads in layouts(args.layouts):
        for batching in (True, False):
            server = start_resnet(
                args, model_dir, workers, threads, batching, work, f"batching-{int(batching)}"
            )
            label = f"cpp {args.arch} {workers}x{threads} batching {'on' if batching else 'off'}"
            try:
                report.checks.append(check_answers(server, args.arch, reference, shape, label))
                for c in args.concurrency:
                    cell = Cell(
                        "compute",
                        "cpp",
                        args.arch,
                        f"{workers}x{threads}",
                        "on" if batching else "off",
                        c,
                    )
                    load = wrk.load(server, args.arch, shape, c)
                    report.cells.append(
                        measure(load, server, args.arch, cell, args.duration, args.warmup, noise)
                    )
            finally:
                server.stop()


def start_resnet(
    args: argparse.Namespace,
    model_dir: Path,
    workers: int,
    threads: int,
    batching: bool,
    work: Path,
    tag: str,
) -> RunningServer:
    """The C++ server on the ResNet (``--queue-delay-us``), logging to a file named by
    layout and ``tag``."""
    log_file = work / f"cpp-{args.arch}-{workers}x{threads}-{tag}.log"
    return start_cpp(
        args,
        model_dir,
        args.arch,
        workers,
        threads,
        batching,
        log_file,
        args.queue_delay_us,
        args.resnet_max_batch_size,
    )


def confirm_compute(
    args: argparse.Namespace, report: Report, work: Path, wrk: Wrk, model_dir: Path
) -> list[dict[str, Any]]:
    """The ``--compute-candidates`` best server cells of the table against the best
    in-process batch, measured in alternation, ``--compute-rounds`` rounds: each round's
    ratios compare runs a few seconds apart, so drift of the machine's speed (other tenants
    of the host) cancels, and the best of many single cells (often the luckiest) no longer
    decides the ratio on its own. The candidates' servers run at once (idle but one)."""
    inprocess = best_inprocess(report)
    table = sorted(
        (c for c in report.cells if c.regime == "compute" and c.target == "cpp"),
        key=lambda c: c.throughput,
        reverse=True,
    )
    candidates = table[: args.compute_candidates]
    if not candidates or inprocess is None:
        return []
    batch = inprocess.batch
    shape = input_shape(model_dir)
    noise = noise_of(args)
    servers: dict[tuple[str, str], RunningServer] = {}
    rounds: list[dict[str, Any]] = []
    try:
        loads = []
        for cell in candidates:
            key = (cell.layout, cell.batching)
            if key not in servers:
                workers, threads = (int(x) for x in cell.layout.split("x"))
                servers[key] = start_resnet(
                    args, model_dir, workers, threads, cell.batching == "on", work,
                    f"rounds-{cell.batching}",
                )  # fmt: skip
            loads.append((cell, wrk.load(servers[key], args.arch, shape, cell.concurrency)))
        for i in range(args.compute_rounds):
            (ip,) = measure_inprocess(
                model_file(model_dir),
                shape,
                args.threads,
                [batch],
                args.compute_round_seconds,
                max_iters=10_000,
                noise=noise,
                when=f"round{i + 1}",
                cpu_pinning=args.cpu_pinning,
            )
            row: dict[str, Any] = {"inprocess": ip.images_per_s, "batch": batch, "cells": []}
            for cell, load in loads:
                measured = measure(
                    load,
                    servers[(cell.layout, cell.batching)],
                    args.arch,
                    cell,
                    args.compute_round_seconds,
                    args.warmup,
                    noise,
                )
                row["cells"].append(
                    {
                        "cell": cell_label(cell),
                        "server": measured.throughput,
                        "ratio": measured.throughput / ip.images_per_s,
                    }
                )
                log.info(
                    "round %d: %s %.1f images/s vs in-process %.1f = %.3f",
                    i + 1,
                    cell_label(cell),
                    measured.throughput,
                    ip.images_per_s,
                    row["cells"][-1]["ratio"],
                )
            rounds.append(row)
    finally:
        for server in servers.values():
            server.stop()
    return rounds


def best_inprocess(report: Report) -> InProcess | None:
    """The fastest in-process run at batch > 1 (any batch if none is larger than 1)."""
    batched = [r for r in report.inprocess if r.batch > 1] or report.inprocess
    return max(batched, key=lambda r: r.images_per_s, default=None)


def cell_label(cell: Cell) -> str:
    return f"{cell.layout}, batching {cell.batching}, concurrency {cell.concurrency}"


def run_overhead(args: argparse.Namespace, report: Report, work: Path, wrk: Wrk) -> None:
    """Digits: the C++ server with batching off, with batching on, and the Python baseline,
    same layout, all three running at once. At each concurrency every server is measured in
    turn, ``--repeats`` rounds (the order rotates each round), so the ratios between them are
    ratios of runs seconds apart. Then gRPC vs REST and the slow clients on the batching-off
    server."""
    model_dir = args.digits_dir
    shape = input_shape(model_dir)
    ((workers, threads),) = layouts(args.digits_layout)
    layout = f"{workers}x{threads}"
    noise = noise_of(args)
    reference = OVPredictor(model_file(model_dir), threads=threads)
    parts = set(args.parts)
    both = sorted(set(args.digits_concurrency))
    plan: dict[tuple[str, str], list[int]] = {}
    if not args.skip_cpp:
        off: set[int] = set()
        if "batching" in parts:
            off |= set(both)
        if "python" in parts:
            off.add(args.overhead_concurrency)
        if "grpc" in parts:
            off |= set(args.grpc_concurrency)
        if "slow-clients" in parts:
            off.add(args.slow_concurrency)
        if off:
            plan["cpp", "off"] = sorted(off)
        if "batching" in parts:
            plan["cpp", "on"] = both
    if "python" in parts:
        plan["python", "n/a"] = sorted(set(both) | {args.overhead_concurrency})
    servers: dict[tuple[str, str], Any] = {}
    try:
        for target, batching in plan:
            log_file = work / f"{target}-digits-batching-{batching.replace('/', '')}.log"
            if target == "cpp":
                server: Any = start_cpp(
                    args,
                    model_dir,
                    "digits",
                    workers,
                    threads,
                    batching == "on",
                    log_file,
                    args.digits_queue_delay_us,
                    args.max_batch_size,
                )
            else:
                server = start_python(
                    model_dir,
                    "digits",
                    workers,
                    threads,
                    log_file,
                    args.startup_timeout,
                    args.cpu_pinning,
                )
            servers[target, batching] = server
            label = f"{target} digits batching {batching}"
            report.checks.append(check_answers(server, "digits", reference, shape, label))
        for c in sorted({c for cs in plan.values() for c in cs}):
            keys = [k for k, cs in plan.items() if c in cs]
            samples: dict[tuple[str, str], list[Cell]] = {k: [] for k in keys}
            for i in range(args.repeats):
                for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
                    target, batching = key
                    cell = Cell("overhead", target, "digits", layout, batching, c)
                    load = wrk.load(servers[key], "digits", shape, c)
                    samples[key].append(
                        measure(
                            load, servers[key], "digits", cell, args.duration, args.warmup, noise
                        )
                    )
            report.cells += [summarize(samples[k]) for k in keys]
        off_server = servers.get(("cpp", "off"))
        if off_server is not None:
            log_file = work / "cpp-digits-batching-off.log"
            if "grpc" in parts:
                run_grpc(args, report, off_server, shape, reference, layout, log_file, work)
            if "slow-clients" in parts:
                run_slow_clients(
                    args, report, off_server, "digits", shape, wrk, layout, log_file, work
                )
    finally:
        for server in servers.values():
            server.stop()


def run_grpc(
    args: argparse.Namespace,
    report: Report,
    server: RunningServer,
    shape: list[int],
    reference: OVPredictor,
    layout: str,
    log_file: Path,
    work: Path,
) -> None:
    """gRPC cells on the batching-off digits server (its REST cells are already measured)."""
    h2load_bin = shutil.which("h2load")
    if h2load_bin is None:
        report.notes.append(
            "gRPC vs REST not measured: h2load not found (apt-get install nghttp2-client)"
        )
        log.warning(report.notes[-1])
        return
    grpc_port = grpc_port_of(log_file)
    if grpc_port is None:
        report.notes.append(
            "gRPC vs REST not measured: the server does not listen on gRPC (no grpc_port >= 0 "
            "in its 'listening' log line; a build without gRPC?)"
        )
        log.warning(report.notes[-1])
        return
    report.checks.append(
        check_grpc_answers(grpc_port, "digits", reference, shape, "cpp digits gRPC batching off")
    )
    h2load = H2load(h2load_bin, work)
    noise = noise_of(args)
    for c in args.grpc_concurrency:
        cell = Cell("overhead", "cpp", "digits", layout, "off", c, protocol="grpc")
        load = h2load.load(server, grpc_port, "digits", shape, c)
        report.cells.append(
            measure(load, server, "digits", cell, args.duration, args.warmup, noise)
        )


def ratios(report: Report, concurrency: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    top = best_inprocess(report)
    if top is not None:
        out["inprocess_best"] = top.images_per_s
        out["inprocess_best_batch"] = top.batch
        out["inprocess_best_when"] = top.when
        compute_best = best(report.cells, regime="compute", target="cpp")
        if compute_best is not None:
            out["server_best"] = compute_best.throughput
            out["server_best_cell"] = cell_label(compute_best)
            out["ratio_vs_inprocess"] = compute_best.throughput / top.images_per_s
            out["ratio_vs_inprocess_from"] = "table"
    if report.compute_rounds:
        # the verdict: the median of the alternating rounds (the table's best of many
        # single cells over the best of a few in-process runs is biased both ways)
        # of the candidates, the one with the best median ratio over the rounds
        per_cell: dict[str, list[float]] = {}
        for row in report.compute_rounds:
            for c in row["cells"]:
                per_cell.setdefault(c["cell"], []).append(c["ratio"])
        medians = {cell: median(r) or 0.0 for cell, r in per_cell.items()}
        chosen = max(medians, key=lambda cell: medians[cell])
        out["ratio_vs_inprocess_table"] = out.get("ratio_vs_inprocess")
        out["ratio_vs_inprocess"] = medians[chosen]
        out["ratio_vs_inprocess_rounds"] = per_cell[chosen]
        out["ratio_vs_inprocess_candidates"] = medians
        out["server_rounds_cell"] = chosen
        out["ratio_vs_inprocess_from"] = "rounds"
    cells = report.cells
    py = best(cells, regime="overhead", target="python", concurrency=concurrency)
    off = _digits_rest(cells, batching="off", concurrency=concurrency)
    on = _digits_rest(cells, batching="on", concurrency=concurrency)
    out["overhead_concurrency"] = concurrency
    if py is not None:
        out["python_rps"] = py.throughput
        if off is not None:
            out["cpp_rps"] = off.throughput
            out["ratio_vs_python_rounds"] = paired(off, py)
            out["ratio_vs_python"] = median(out["ratio_vs_python_rounds"])
        if on is not None:
            out["cpp_rps_batching_on"] = on.throughput
            out["ratio_vs_python_batching_on_rounds"] = paired(on, py)
            out["ratio_vs_python_batching_on"] = median(out["ratio_vs_python_batching_on_rounds"])
    out["batching"] = []
    for c in sorted({c.concurrency for c in cells if c.regime == "overhead"}):
        on_c = _digits_rest(cells, batching="on", concurrency=c)
        off_c = _digits_rest(cells, batching="off", concurrency=c)
        if on_c is None or off_c is None:
            continue
        rps_rounds, p50_rounds = paired(on_c, off_c), paired(on_c, off_c, "p50")
        row = {
            "concurrency": c,
            "on_rps": on_c.throughput,
            "off_rps": off_c.throughput,
            "rps_ratio": median(rps_rounds),
            "rps_ratio_rounds": rps_rounds,
            "on_p50_ms": on_c.p50_ms,
            "off_p50_ms": off_c.p50_ms,
            "p50_ratio": median(p50_rounds),
            "p50_ratio_rounds": p50_rounds,
            "on_p99_ms": on_c.p99_ms,
            "off_p99_ms": off_c.p99_ms,
            "p99_ratio": _ratio(on_c.p99_ms, off_c.p99_ms),
        }
        out["batching"].append(row)
        out[f"batching_c{c}"] = row["rps_ratio"]
        if c == 1:
            out["batching_c1_p50"] = row["p50_ratio"]
    out["grpc"] = []
    for c in sorted({c.concurrency for c in cells if c.protocol == "grpc"}):
        grpc = best(cells, regime="overhead", target="cpp", protocol="grpc", concurrency=c)
        rest = _digits_rest(cells, batching="off", concurrency=c)
        if grpc is None or rest is None:
            continue
        out["grpc"].append(
            {
                "concurrency": c,
                "grpc_rps": grpc.throughput,
                "rest_rps": rest.throughput,
                "ratio": _ratio(grpc.throughput, rest.throughput),
                "grpc_p50_ms": grpc.p50_ms,
                "rest_p50_ms": rest.p50_ms,
                "grpc_p99_ms": grpc.p99_ms,
                "rest_p99_ms": rest.p99_ms,
                "grpc_errors": grpc.errors,
            }
        )
        out[f"grpc_vs_rest_c{c}"] = out["grpc"][-1]["ratio"]
    slow = next((c for c in cells if c.background != "-"), None)
    if slow is not None:
        baseline = _digits_rest(cells, batching="off", concurrency=slow.concurrency)
        out["slow_cell"] = asdict(slow)
        out["slow_baseline"] = None if baseline is None else asdict(baseline)
        out["slow_clients_p99_ms"] = slow.p99_ms
        out["slow_clients_errors"] = slow.errors
        out["rss_per_idle_conn_kib"] = report.slow_clients.get("rss_per_idle_conn_kib")
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
