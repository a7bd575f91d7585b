"""Serving benchmark: the C++ KServe-v2 server against its limits and a Python baseline.

Two regimes, one run, everything on 127.0.0.1 and on the same cores:

- **compute-bound**: a random-initialised ``paddle.vision`` ResNet (18 by default) at
  224x224, fp32. (a) in-process OpenVINO (``OVPredictor``: one compiled model, synchronous
  calls at batch 16 and 32, the same total thread count the server gets), measured before and
  after the server runs: the upper limit is the better of the two. (b) the C++ server over
  HTTP, binary tensors, batch-1 requests at concurrency 1, 4 and 16, dynamic batching on
  (max batch 16, 3 ms queue delay) and off, for every worker layout of the same thread budget
  (``--workers 1 --threads-per-worker 2`` and ``--workers 2 --threads-per-worker 1``: the
  server compiles one model with one stream per worker). ``ratio_vs_inprocess`` = best (b)
  images/s / best (a) images/s.
- **overhead-bound**: the digits model (``outputs/export``, fp32), batch-1 requests. (b) the
  C++ server vs (c) ``bench/python_server.py`` (FastAPI + uvicorn around the same
  ``OVPredictor``), same model file, same workers x threads (1 x 1). ``ratio_vs_python`` =
  (b) / (c) requests/s at concurrency 16, like for like: one inference per request, i.e. the
  C++ server's dynamic batching off (the baseline has none); the C++ server with batching on
  (1 ms delay) is reported beside it.

Like-for-like server settings: the C++ server runs with ``--access-log=false`` (the baseline
logs no requests) and ``--keep-alive-max-count=1000000`` (uvicorn never closes a busy
keep-alive connection; the server's default closes it every 100 requests); ``--server-arg``
adds or overrides flags.

Load generator: ``wrk`` (one epoll thread, keep-alive connections = concurrency, a Lua script
posting a prebuilt binary-tensor request), a separate process, identical for every target.
Each cell: a warm-up run, then a timed run; wrk reports requests, latency percentiles (send to
last byte of the response) and errors. The generator shares the cores with the server: its CPU
time (``wait4`` rusage) over the wall time is reported, and so are the server's (psutil), the
rest of the machine's (``other``: other tenants; a cell where it exceeds
``--noise-threshold`` is measured again, at most ``--retries`` times, keeping the quietest)
and, from the C++ server's ``/metrics``, the mean executed batch and the backend's busy time.
Every server's answers are first checked with ``tritonclient.http`` (binary) and the repo's
``KServeClient`` (JSON) against in-process OpenVINO on the same inputs.

    .venv/bin/python bench/serving_bench.py [--arch resnet50] [--quick] [--json out.json]

The last line printed is ``ratio_vs_inprocess=X ratio_vs_python=Y`` (``nan`` for a ratio
that was not measured, e.g. with ``--skip-cpp``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from components.ov_runtime import OVPredictor  # noqa: E402
from components.serving_image import RunningServer, ServerFlags, ServerProcess  # noqa: E402

log = logging.getLogger("serving_bench")

DEFAULT_BINARY = REPO / "build" / "serving" / "paddle-mlops-server"
DEFAULT_DIGITS = REPO / "outputs" / "export"
PYTHON_SERVER = REPO / "bench" / "python_server.py"

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
    ratios: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0


# --------------------------------------------------------------------------- models


def export_resnet(arch: str, dest: Path) -> Path:
    """``dest/legacy/model.pdmodel`` + a ``signature.json`` the server (and baseline) read."""
    import paddle
    from paddle.vision import models

    from components.modelio import save_legacy
    from components.ov_runtime import read_model

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
) -> list[InProcess]:
    """Images/s of one compiled model, synchronous calls, time- and count-bounded."""
    predictor = OVPredictor(path, threads=threads)
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
    import urllib.request

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

    def __init__(self, model_dir: Path, name: str, workers: int, threads: int, log_file: Path):
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
) -> RunningServer:
    """The C++ server; batching on and off differ only in ``--dynamic-batching``."""
    flags = ServerFlags(
        workers=workers,
        threads_per_worker=threads,
        max_batch_size=args.max_batch_size,
        max_queue_delay_us=queue_delay_us,
    )
    extra = [
        f"--dynamic-batching={'true' if batching else 'false'}",
        "--access-log=false",  # the Python baseline logs no requests either
        "--keep-alive-max-count=1000000",  # uvicorn never closes a busy keep-alive connection
        *args.server_args,
    ]
    server = RunningServer(args.server_binary, model_dir, "fp32", name, flags, log_file, extra)
    _ready_or_raise(server, args.startup_timeout, log_file)
    return server


def start_python(
    model_dir: Path, name: str, workers: int, threads: int, log_file: Path, startup_s: float
) -> PythonServer:
    server = PythonServer(model_dir, name, workers, threads, log_file)
    _ready_or_raise(server, startup_s, log_file)
    return server


def _ready_or_raise(server: Any, timeout_s: float, log_file: Path) -> None:
    try:
        server.wait_ready(timeout_s)
    except Exception:
        server.stop()
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"server did not start; log tail:\n{tail}") from None


def check_answers(
    server: Any, name: str, reference: OVPredictor, shape: list[int], label: str
) -> dict[str, Any]:
    """Binary (tritonclient) and JSON (KServeClient) answers vs in-process OpenVINO."""
    import tritonclient.http as httpclient

    rng = np.random.default_rng(7)
    x = rng.standard_normal([4, *shape[1:]]).astype(np.float32)
    expected = np.concatenate([reference.run([x[i : i + 1]])[0].copy() for i in range(len(x))])
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
    binary = np.concatenate(got)
    json_out = server.client.infer(name, {"image": x[:1]}, binary=False)["logits"]
    scale = max(1.0, float(np.abs(expected).max()))
    diff = max(float(np.abs(binary - expected).max()), float(np.abs(json_out - expected[:1]).max()))
    ok = diff <= 1e-3 * scale
    result = {"target": label, "max_abs_diff": diff, "scale": scale, "passed": ok}
    if not ok:
        raise RuntimeError(f"{label}: answers differ from in-process OpenVINO by {diff:.3g}")
    return result


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
            x = np.random.default_rng(3).standard_normal(shape).astype("<f4")
            raw = x.tobytes()
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


def measure(
    wrk: Wrk,
    server: Any,
    name: str,
    shape: list[int],
    template: Cell,
    seconds: float,
    warmup_s: float,
    noise: Noise,
) -> Cell:
    """One cell; measured again (at most ``noise.retries`` times) when the machine was busy
    with other processes meanwhile. The quietest attempt is kept."""
    attempts = []
    for attempt in range(noise.retries + 1):
        if attempt:
            log.warning("  the machine was busy with something else: measuring again")
            noise.wait_for_quiet()
        attempts.append(_measure_once(wrk, server, name, shape, template, seconds, warmup_s))
        if attempts[-1].other_cpu_pct <= noise.threshold_pct:
            break
    return min(attempts, key=lambda c: c.other_cpu_pct)


def _measure_once(
    wrk: Wrk,
    server: Any,
    name: str,
    shape: list[int],
    template: Cell,
    seconds: float,
    warmup_s: float,
) -> Cell:
    cell = dataclasses.replace(template)
    url = f"http://127.0.0.1:{server.port}/v2/models/{name}/infer"
    if warmup_s > 0:
        wrk.run(url, shape, cell.concurrency, warmup_s)
    metrics0 = scrape_batching(server.port, name) if cell.target == "cpp" else None
    server0, busy0, own0 = (
        _process_cpu_seconds(server.proc.pid),
        busy_cpu_seconds(),
        _own_cpu_seconds(),
    )
    stats, gen_cpu, wall = wrk.run(url, shape, cell.concurrency, seconds)
    server_cpu = _process_cpu_seconds(server.proc.pid) - server0
    other = (busy_cpu_seconds() - busy0) - server_cpu - gen_cpu - (_own_cpu_seconds() - own0)
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
    log.info(
        "%-8s %-7s %s %-8s batching %-3s c=%-2d %8.1f req/s  p50 %7.2f ms  p99 %7.2f ms  "
        "errors %d  gen CPU %3.0f%%  server CPU %3.0f%%  other CPU %3.0f%%  mean batch %s",
        cell.regime,
        cell.target,
        cell.model,
        cell.layout,
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


def render(report: Report) -> str:
    cpus = report.machine["cpus"]
    lines = [
        f"serving benchmark: {report.arch} 224x224 (compute-bound) and digits 28x28 "
        f"(overhead-bound), fp32, OpenVINO CPU, f32 precision hint",
        f"machine: {cpus} CPUs ({report.machine['cpu_model']}); load generator: wrk, 1 thread, "
        "keep-alive, binary tensors, batch-1 requests; CPU% = CPU time / wall time, 100% = one "
        "core",
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
        f"{'regime':<9}{'target':<7}{'model':<9}{'WxT':>4}{'batching':>9}{'conc':>5}"
        f"{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'err':>4}{'batch':>6}{'busy%':>6}"
        f"{'gen CPU%':>9}{'srv CPU%':>9}{'other%':>7}",
    ]
    for c in report.cells:
        batch = "-" if c.mean_batch is None else f"{c.mean_batch:.1f}"
        busy = "-" if c.compute_busy_pct is None else f"{c.compute_busy_pct:.0f}"
        lines.append(
            f"{c.regime:<9}{c.target:<7}{c.model:<9}{c.layout:>4}{c.batching:>9}"
            f"{c.concurrency:>5}{c.throughput:>9.1f}{c.p50_ms:>9.2f}{c.p99_ms:>9.2f}"
            f"{c.errors:>4}{batch:>6}{busy:>6}{c.generator_cpu_pct:>9.0f}"
            f"{c.server_cpu_pct:>9.0f}{c.other_cpu_pct:>7.0f}"
        )
    lines += [
        "",
        "batch = mean samples per executed batch, busy% = backend compute time / (wall x "
        "workers) (C++ /metrics; batches straddling the window count whole); gen = wrk, "
        "srv = server process, other = the rest of the machine (noise: should be ~0)",
    ]
    noisy = [c for c in report.cells if c.other_cpu_pct > report.settings["noise_threshold"]]
    noisy_inprocess = [
        r for r in report.inprocess if r.other_cpu_pct > report.settings["noise_threshold"]
    ]
    if noisy or noisy_inprocess:
        lines.append(
            f"WARNING: {len(noisy) + len(noisy_inprocess)} measurement(s) shared the CPU with "
            "other processes (other% above the threshold even after retries): rerun on a quiet "
            "machine"
        )
    r = report.ratios
    lines.append("")
    if r.get("ratio_vs_inprocess") is not None:
        lines.append(
            f"ratio_vs_inprocess = best C++ server images/s {r['server_best']:.1f} "
            f"({r['server_best_cell']}) / best in-process {r['inprocess_best']:.1f} "
            f"(batch {r['inprocess_best_batch']}, {r['inprocess_best_when']}) = "
            f"{r['ratio_vs_inprocess']:.3f}"
        )
    if r.get("ratio_vs_python") is not None:
        lines.append(
            f"ratio_vs_python = C++ (batching off) {r['cpp_rps']:.1f} req/s / Python "
            f"{r['python_rps']:.1f} req/s at concurrency {r['overhead_concurrency']} = "
            f"{r['ratio_vs_python']:.3f}"
        )
    if r.get("ratio_vs_python_batching_on") is not None:
        lines.append(
            f"  (C++ with dynamic batching on: {r['cpp_rps_batching_on']:.1f} req/s, "
            f"{r['ratio_vs_python_batching_on']:.3f}x the Python baseline)"
        )
    lines.append(f"elapsed {report.elapsed_s:.0f} s")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "nan" if x is None else f"{x:.3f}"


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
    parser.add_argument("--digits-concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--overhead-concurrency", type=int, default=16)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--queue-delay-us", type=int, default=3000, help="ResNet, batching on")
    parser.add_argument(
        "--digits-queue-delay-us", type=int, default=1000, help="digits, batching on"
    )
    parser.add_argument("--inprocess-batches", type=int, nargs="+", default=[1, 16, 32])
    parser.add_argument("--duration", type=int, default=6, help="seconds per timed cell")
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
    parser.add_argument("--quick", action="store_true", help="short cells, fewer of them")
    parser.add_argument("--skip-cpp", action="store_true", help="no C++ server (development)")
    parser.add_argument("--work-dir", type=Path, help="keep model, requests and logs here")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True, stream=sys.stderr)
    os.environ.setdefault("GLOG_minloglevel", "2")
    if args.quick:
        args.duration, args.warmup, args.inprocess_seconds = 2, 1, 2.0
        args.concurrency, args.digits_concurrency = [1, 16], [16]
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
    if not (args.digits_dir / "signature.json").exists():
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
    r = report.ratios
    print(
        f"ratio_vs_inprocess={_fmt(r.get('ratio_vs_inprocess'))} "
        f"ratio_vs_python={_fmt(r.get('ratio_vs_python'))}"
    )
    return 0


def noise_of(args: argparse.Namespace) -> Noise:
    return Noise(threshold_pct=args.noise_threshold, retries=args.retries)


def run_all(args: argparse.Namespace, report: Report, work: Path, wrk_bin: str) -> None:
    log.info("exporting %s (random init, paddle.seed(0))", args.arch)
    resnet_dir = export_resnet(args.arch, work / args.arch)
    shape = input_shape(resnet_dir)
    busy = noise_of(args).wait_for_quiet()
    log.info("machine busy before the first measurement: %.0f%% of one core", busy)
    report.inprocess = measure_inprocess(
        model_file(resnet_dir),
        shape,
        args.threads,
        args.inprocess_batches,
        args.inprocess_seconds,
        max_iters=10_000,
        noise=noise_of(args),
    )
    wrk = Wrk(wrk_bin, work)
    if not args.skip_cpp:
        run_compute(args, report, work, wrk, resnet_dir)
        # again after the server runs: the machine's speed drifts; the limit is the better one
        report.inprocess += measure_inprocess(
            model_file(resnet_dir),
            shape,
            args.threads,
            [b for b in args.inprocess_batches if b > 1] or args.inprocess_batches,
            args.inprocess_seconds,
            max_iters=10_000,
            noise=noise_of(args),
            when="after",
        )
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
            server = start_cpp(
                args,
                model_dir,
                args.arch,
                workers,
                threads,
                batching,
                work / f"cpp-{args.arch}-{workers}x{threads}-batching-{int(batching)}.log",
                args.queue_delay_us,
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
                    report.cells.append(
                        measure(
                            wrk, server, args.arch, shape, cell, args.duration, args.warmup, noise
                        )
                    )
            finally:
                server.stop()


def run_overhead(args: argparse.Namespace, report: Report, work: Path, wrk: Wrk) -> None:
    """Digits: the C++ server (batching off, then on) and the Python baseline, same layout."""
    model_dir = args.digits_dir
    shape = input_shape(model_dir)
    ((workers, threads),) = layouts(args.digits_layout)
    noise = noise_of(args)
    reference = OVPredictor(model_file(model_dir), threads=threads)
    plan: list[tuple[str, str]] = [] if args.skip_cpp else [("cpp", "off"), ("cpp", "on")]
    plan.append(("python", "n/a"))
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
            )
        else:
            server = start_python(
                model_dir, "digits", workers, threads, log_file, args.startup_timeout
            )
        try:
            label = f"{target} digits batching {batching}"
            report.checks.append(check_answers(server, "digits", reference, shape, label))
            for c in args.digits_concurrency:
                cell = Cell("overhead", target, "digits", f"{workers}x{threads}", batching, c)
                report.cells.append(
                    measure(wrk, server, "digits", shape, cell, args.duration, args.warmup, noise)
                )
        finally:
            server.stop()


def ratios(report: Report, concurrency: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    batched = [r for r in report.inprocess if r.batch > 1] or report.inprocess
    top = max(batched, key=lambda r: r.images_per_s)
    out["inprocess_best"] = top.images_per_s
    out["inprocess_best_batch"] = top.batch
    out["inprocess_best_when"] = top.when
    compute_best = best(report.cells, regime="compute", target="cpp")
    if compute_best is not None:
        out["server_best"] = compute_best.throughput
        out["server_best_cell"] = (
            f"{compute_best.layout}, batching {compute_best.batching}, "
            f"concurrency {compute_best.concurrency}"
        )
        out["ratio_vs_inprocess"] = compute_best.throughput / top.images_per_s
    py = best(report.cells, regime="overhead", target="python", concurrency=concurrency)
    off = best(
        report.cells, regime="overhead", target="cpp", batching="off", concurrency=concurrency
    )
    on = best(report.cells, regime="overhead", target="cpp", batching="on", concurrency=concurrency)
    out["overhead_concurrency"] = concurrency
    if py is not None:
        out["python_rps"] = py.throughput
        if off is not None:
            out["cpp_rps"] = off.throughput
            out["ratio_vs_python"] = off.throughput / py.throughput
        if on is not None:
            out["cpp_rps_batching_on"] = on.throughput
            out["ratio_vs_python_batching_on"] = on.throughput / py.throughput
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
