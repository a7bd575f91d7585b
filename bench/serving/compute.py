"""The compute-bound part: ResNet in the server against OpenVINO in-process."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.serving import runtime_best
from bench.serving.common import Cell, Report, input_shape, log, model_file, noise_of
from bench.serving.loads import Wrk, measure
from bench.serving.runtime_best import RuntimeCell
from bench.serving.servers import check_answers, measure_inprocess, start_cpp
from bench.serving.stats import best_inprocess, cell_label, layouts
from components.ml.serving.ov_runtime import OVPredictor
from components.ml.serving.server import RunningServer


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


def compute_round(
    args: argparse.Namespace,
    report: Report,
    model_dir: Path,
    shape: Any,
    batch: int,
    noise: Any,
    servers: dict[tuple[str, str], RunningServer],
    loads: list[tuple[Cell, Any]],
    i: int,
) -> dict[str, Any]:
    """Round ``i`` of :func:`confirm_compute`: the in-process batch (and the runtime's best
    layout, where measured) then each candidate cell; their ratios."""
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
    limit = None
    if report.runtime:
        best = RuntimeCell(**{**report.runtime[0], "when": f"round{i + 1}"})
        limit = runtime_best.again(
            model_file(model_dir), shape, best, args.compute_round_seconds, best.when
        ).images_per_s
        row["runtime_best"] = limit
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
                "ratio_runtime": measured.throughput / limit if limit else None,
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
    return row


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
            rounds.append(
                compute_round(args, report, model_dir, shape, batch, noise, servers, loads, i)
            )
    finally:
        for server in servers.values():
            server.stop()
    return rounds
