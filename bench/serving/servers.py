"""The servers measured: the C++ server, the Python baseline, OpenVINO in-process;
and the checks of their answers."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from bench.serving.common import (
    PYTHON_SERVER,
    InProcess,
    Noise,
    _own_cpu_seconds,
    busy_cpu_seconds,
    log,
)
from components.ml.serving.ov_runtime import OVPredictor
from components.ml.serving.server import RunningServer, ServerProcess


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
