"""Statistics over the measured cells: medians, paired ratios, best cells."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from bench.serving.common import Cell, InProcess, Report


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


def best_inprocess(report: Report) -> InProcess | None:
    """The fastest in-process run at batch > 1 (any batch if none is larger than 1)."""
    batched = [r for r in report.inprocess if r.batch > 1] or report.inprocess
    return max(batched, key=lambda r: r.images_per_s, default=None)


def cell_label(cell: Cell) -> str:
    return f"{cell.layout}, batching {cell.batching}, concurrency {cell.concurrency}"


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
            if report.runtime:
                limit = report.runtime[0]
                out["runtime_best"] = limit["images_per_s"]
                out["runtime_best_cell"] = (
                    f"streams {limit['streams']} ({limit['streams_used']}), batch "
                    f"{limit['batch']}, {limit['requests']} requests"
                )
                out["ratio_vs_runtime_best"] = compute_best.throughput / limit["images_per_s"]
                out["ratio_vs_runtime_best_from"] = "table"
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
        to_runtime = [
            c["ratio_runtime"]
            for row in report.compute_rounds
            for c in row["cells"]
            if c["cell"] == chosen and c.get("ratio_runtime")
        ]
        if to_runtime:
            out["ratio_vs_runtime_best_table"] = out.get("ratio_vs_runtime_best")
            out["ratio_vs_runtime_best"] = median(to_runtime)
            out["ratio_vs_runtime_best_rounds"] = to_runtime
            out["ratio_vs_runtime_best_from"] = "rounds"
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
    slow = next((c for c in cells if c.background.startswith("slow")), None)
    if slow is not None:
        baseline = _digits_rest(cells, batching="off", concurrency=slow.concurrency)
        out["slow_cell"] = asdict(slow)
        out["slow_baseline"] = None if baseline is None else asdict(baseline)
        out["slow_clients_p99_ms"] = slow.p99_ms
        out["slow_clients_errors"] = slow.errors
        out["rss_per_idle_conn_kib"] = report.slow_clients.get("rss_per_idle_conn_kib")
    # the prediction log: each logging server against the same server without one
    plain = best(cells, regime="predlog", background="-")
    for background, key in (
        ("log-outs", "log_overhead_outputs"),
        ("log-in0.1", "log_overhead_inputs_10pct"),
    ):
        logged = best(cells, regime="predlog", background=background)
        if plain is not None and logged is not None:
            out[f"{key}_rounds"] = paired(logged, plain)
            out[key] = median(out[f"{key}_rounds"])
            out[f"{key}_p99_ms"] = [logged.p99_ms, plain.p99_ms]
    if report.prediction_log:
        out["prediction_log"] = report.prediction_log
    for key in (
        "first_request_vs_p50",
        "first_request_vs_p50_cold",
        "first_request_vs_pause",
        "first_request_vs_pause_cold",
        "swap_s",
        "swap_s_cold",
    ):
        if key in report.warmup:
            out[key] = report.warmup[key]
    for key in ("tuned_vs_grid_best", "written_vs_grid_best", "tuning_s", "tuning_within_budget"):
        if report.tune.get(key) is not None:
            out[key] = report.tune[key]
    return out
