"""The command line: which parts run, in which order."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.serving import runtime_best
from bench.serving.common import (
    DIGITS_PARTS,
    PARTS,
    Cell,
    Report,
    _cpu_model,
    export_resnet,
    input_shape,
    log,
    model_file,
    noise_of,
)
from bench.serving.compute import confirm_compute, run_compute
from bench.serving.loads import H2load, Wrk, measure
from bench.serving.options import OPTIONS
from bench.serving.predlog import run_prediction_log
from bench.serving.report import last_line, render
from bench.serving.servers import (
    check_answers,
    check_grpc_answers,
    grpc_port_of,
    measure_inprocess,
    start_cpp,
    start_python,
)
from bench.serving.slow import run_slow_clients
from bench.serving.stats import layouts, ratios, summarize
from bench.serving.tune import run_tune
from bench.serving.warm import run_warmup
from components.ml.serving.ov_runtime import OVPredictor
from components.ml.serving.server import RunningServer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving",
        description="Serving benchmark: the C++ KServe-v2 server against its limits and a "
        "Python baseline (docs/serving-benchmark.md).",
    )
    for flags, kwargs in OPTIONS:
        parser.add_argument(*flags, **kwargs)
    return parser


def choose_parts(args: argparse.Namespace) -> list[str]:
    """``--only`` (``digits``: all but resnet), without slow-clients when it has no
    connections; in the order of :data:`PARTS`."""
    chosen = set(args.only or PARTS)
    if "digits" in chosen:
        chosen = (chosen - {"digits"}) | set(DIGITS_PARTS)
    if args.slow_clients <= 0:
        chosen.discard("slow-clients")
    return [p for p in PARTS if p in chosen]


def apply_quick(args: argparse.Namespace) -> None:
    """``--quick``: short cells, fewer of them; then the default ``--layouts`` (every split
    of ``--threads``)."""
    if args.quick:
        args.duration, args.warmup, args.inprocess_seconds = 2, 1, 2.0
        args.repeats = min(args.repeats, 2)
        args.compute_rounds = min(args.compute_rounds, 3)
        args.concurrency, args.digits_concurrency = [1, 16], [1, 16]
        args.slow_duration = 3
        args.layouts = args.layouts or f"1x{args.threads}"
        args.inprocess_batches = [16]
        args.runtime_streams, args.runtime_batches = ["AUTO"], [16]
        args.warm_rounds = min(args.warm_rounds, 2)
        args.tune_rounds, args.tune_trial_seconds = 1, 1
    if args.layouts is None:
        args.layouts = ",".join(
            f"{w}x{args.threads // w}" for w in range(1, args.threads + 1) if args.threads % w == 0
        )


def preflight(args: argparse.Namespace) -> str | None:
    """wrk's path, once wrk, the server binary (waited for ``--wait-for-binary`` s) and the
    digits model the chosen parts need are there; else None, the missing one printed."""
    wrk_bin = shutil.which("wrk")
    if wrk_bin is None:
        print("error: wrk not found (apt-get install wrk)", file=sys.stderr)
        return None
    deadline = time.monotonic() + args.wait_for_binary
    while not args.skip_cpp and not args.server_binary.exists() and time.monotonic() < deadline:
        time.sleep(min(10.0, max(0.1, deadline - time.monotonic())))
    if not args.skip_cpp and not args.server_binary.exists():
        print(
            f"error: {args.server_binary} not found: build it with `make serving` "
            "(or pass --server-binary, or --skip-cpp)",
            file=sys.stderr,
        )
        return None
    digits = any(p in args.parts for p in DIGITS_PARTS)
    if digits and not (args.digits_dir / "signature.json").exists():
        print(f"error: {args.digits_dir}/signature.json not found (dvc repro)", file=sys.stderr)
        return None
    return wrk_bin


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.compute_rounds < 1 or args.compute_candidates < 1:
        parser.error("--repeats, --compute-rounds and --compute-candidates must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True, stream=sys.stderr)
    os.environ.setdefault("GLOG_minloglevel", "2")
    args.parts = choose_parts(args)
    apply_quick(args)
    wrk_bin = preflight(args)
    if wrk_bin is None:
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


def run_resnet(args: argparse.Namespace, report: Report, work: Path, wrk: Wrk) -> None:
    """ResNet (random init): the in-process limit and OpenVINO's best, then the C++ server's
    cells and the rounds that confirm the best of them (the in-process limit again after)."""
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
    report.runtime = runtime_best.as_dicts(
        runtime_best.search(
            model_file(resnet_dir),
            shape,
            args.threads,
            args.runtime_streams,
            args.runtime_batches,
            args.inprocess_seconds,
        )
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


@dataclass(frozen=True)
class Scenario:
    """A part of the benchmark: ``run(args, report, work, wrk)`` when ``when(args)``."""

    name: str
    when: Callable[[argparse.Namespace], bool]
    run: Callable[[argparse.Namespace, Report, Path, Wrk], None]


# run in this order (the digits parts share one set of servers: run_overhead)
SCENARIOS = (
    Scenario("resnet", lambda a: "resnet" in a.parts, run_resnet),
    Scenario(
        "digits",
        lambda a: any(p in a.parts for p in DIGITS_PARTS if p != "prediction-log"),
        lambda a, r, w, wrk: run_overhead(a, r, w, wrk),
    ),
    Scenario(
        "prediction-log",
        lambda a: "prediction-log" in a.parts and not a.skip_cpp,
        lambda a, r, w, wrk: run_prediction_log(a, r, w, wrk),
    ),
    Scenario(
        "warmup",
        lambda a: "warmup" in a.parts and not a.skip_cpp,
        lambda a, r, w, wrk: run_warmup(a, r, w),
    ),
    Scenario(
        "tune",
        lambda a: "tune" in a.parts and not a.skip_cpp,
        lambda a, r, w, wrk: run_tune(a, r, w),
    ),
)


def run_all(args: argparse.Namespace, report: Report, work: Path, wrk_bin: str) -> None:
    wrk = Wrk(wrk_bin, work)
    busy = noise_of(args).wait_for_quiet()
    log.info("machine busy before the first measurement: %.0f%% of one core", busy)
    for scenario in SCENARIOS:
        if scenario.when(args):
            scenario.run(args, report, work, wrk)
    report.ratios = ratios(report, args.overhead_concurrency)


def overhead_plan(args: argparse.Namespace) -> dict[tuple[str, str], list[int]]:
    """The digits servers the chosen parts need, as (target, batching), and the concurrencies
    each is measured at (grpc and the slow clients reuse the batching-off C++ server)."""
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
    return plan


def start_digits(
    args: argparse.Namespace, target: str, batching: str, workers: int, threads: int, log_file: Path
) -> Any:
    """One digits server of :func:`overhead_plan`: the C++ server (batching on or off) or the
    Python baseline."""
    if target == "cpp":
        return start_cpp(
            args,
            args.digits_dir,
            "digits",
            workers,
            threads,
            batching == "on",
            log_file,
            args.digits_queue_delay_us,
            args.max_batch_size,
        )
    return start_python(
        args.digits_dir,
        "digits",
        workers,
        threads,
        log_file,
        args.startup_timeout,
        args.cpu_pinning,
    )


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
    plan = overhead_plan(args)
    servers: dict[tuple[str, str], Any] = {}
    try:
        for target, batching in plan:
            log_file = work / f"{target}-digits-batching-{batching.replace('/', '')}.log"
            server = start_digits(args, target, batching, workers, threads, log_file)
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
