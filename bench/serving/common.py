"""Shared by the serving benchmark: paths, the measured cells and the report record."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.ml.serving.tuning import cpu_model

REPO = Path(__file__).resolve().parents[2]


log = logging.getLogger("bench.serving")


DEFAULT_BINARY = REPO / "build" / "serving" / "paddle-mlops-server"


DEFAULT_DIGITS = REPO / "outputs" / "export"


PYTHON_SERVER = REPO / "bench" / "python_server.py"


SLOW_CLIENTS = REPO / "bench" / "slow_clients.py"


GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"


# what --only selects; "digits" is every overhead-bound part
PARTS = (
    "resnet",
    "batching",
    "python",
    "grpc",
    "slow-clients",
    "prediction-log",
    "warmup",
    "tune",
)


DIGITS_PARTS = PARTS[1:]  # all but resnet


# A load generator run: seconds -> (counters like the wrk script's, its CPU seconds, wall s).
Load = Callable[[float], tuple[dict[str, float], float, float]]


@dataclass
class Cell:
    regime: str  # compute | overhead | predlog (the prediction log's cost)
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
    # the prediction log's servers: records written / dropped / answered (predlog.py)
    prediction_log: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # skipped parts and why
    ratios: dict[str, Any] = field(default_factory=dict)
    # ResNet: the best server cell and the best in-process batch, measured in alternation
    compute_rounds: list[dict[str, float]] = field(default_factory=list)
    # ResNet: OpenVINO's own best (THROUGHPUT hint, async requests), every cell searched
    runtime: list[dict[str, Any]] = field(default_factory=list)
    # first requests after a swap, with and without the bundle's warm-up (warm.py)
    warmup: dict[str, Any] = field(default_factory=dict)
    # the serving-config search vs the exhaustive grid of its space (tune.py)
    tune: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0


def export_resnet(arch: str, dest: Path) -> Path:
    """``dest/legacy/model.pdmodel`` + a ``signature.json`` the server (and baseline) read."""
    import paddle
    from paddle.vision import models

    from components.ml.serving.ov_runtime import read_model
    from components.ml.training.modelio import save_legacy

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


def request_input(shape: list[int]) -> np.ndarray:
    """The one input every load generator posts (REST and gRPC alike)."""
    return np.random.default_rng(3).standard_normal(shape).astype("<f4")


def noise_of(args: argparse.Namespace) -> Noise:
    return Noise(threshold_pct=args.noise_threshold, retries=args.retries)


def _cpu_model() -> str:
    return cpu_model() or platform.processor() or "unknown"
