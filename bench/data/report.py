"""What the benchmark prints and writes: the tables of each step's memory and time per size,
one paragraph per scenario, the failures, the goals, the ``--json`` report and the last
(machine-readable) line."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from bench.data.common import ALL_STEPS, GOAL_STEPS, GOALS
from bench.data.scenarios import Bench
from bench.data.steps import StepRun


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "na" if value is None else format(value, spec)


def verdict(name: str, value: float | None) -> str:
    if value is None:
        return "not measured"
    op, limit = GOALS[name]
    ok = value <= limit if op == "<=" else value >= limit if op == ">=" else value < limit
    return f"{'met' if ok else 'NOT met'} (goal {op} {limit:g})"


def print_tables(
    sizes: Sequence[int], runs: dict[int, dict[str, StepRun]], failed: dict[int, dict[str, str]]
) -> None:
    small, big = min(sizes), max(sizes)
    steps = [s for s in ALL_STEPS if any(s in runs[n] or s in failed[n] for n in sizes)]
    head = "".join(f"{n:>16,}" for n in sizes)
    for title, attr, unit in (
        ("max RSS (largest process, kernel high-water mark)", "max_rss_mb", "MB"),
        ("tree RSS (peak of the summed RSS of the step's processes, sampled)", "tree_rss_mb", "MB"),
        ("wall time (process start to exit)", "seconds", "s"),
    ):
        print(f"\n{title}, {unit}, images:")
        growth = f"{big // small}x growth" if attr != "seconds" else f"{big // small}x ratio"
        print(f"  {'step':<9}{head}{growth:>14}")
        for step in steps:
            cells = [getattr(runs[n][step], attr) if step in runs[n] else None for n in sizes]
            ratio = cells[-1] / cells[0] if cells[0] and cells[-1] is not None else None
            shown = [
                fmt(c, ".0f" if attr != "seconds" else ".1f") if c is not None else "failed"
                for c in cells
            ]
            print(
                f"  {step:<9}"
                + "".join(f"{c:>16}" for c in shown)
                + f"{fmt(ratio):>14}"
                + ("" if step in GOAL_STEPS else "   (not in the goal)")
            )


def rss_growth(sizes: Sequence[int], runs: dict[int, dict[str, StepRun]]) -> dict[str, float]:
    small, big = min(sizes), max(sizes)
    return {
        step: runs[big][step].max_rss_mb / runs[small][step].max_rss_mb
        for step in GOAL_STEPS
        if step in runs[big] and step in runs[small]
    }


def goal_values(b: Bench) -> tuple[dict[str, float], str | None, dict[str, float | None]]:
    """The rss growth per step, the worst step, and the value of each of :data:`GOALS` (None:
    its scenario did not run)."""
    runs, _ = b.results["rss"]
    big, _ = b.results["big"]
    growth = rss_growth(b.sizes, runs) if runs else {}
    worst = max(growth, key=growth.get) if growth else None

    def value(scenario: str, key: str) -> float | None:
        result = b.results.get(scenario)
        return None if result is None else result[key]

    values = {
        "rss_growth_16x": growth[worst] if worst else None,
        "ingest_vs_decode": value("throughput", "ingest_vs_decode"),
        "reader_vs_train": value("reader", "reader_vs_train"),
        "incremental_ingest": value("incremental", "incremental_ingest"),
        "rerun_no_change": value("incremental", "rerun_no_change"),
        "rss_100k_224_mb": max((r.max_rss_mb for r in big.values()), default=None),
        "train_vs_memory": value("train_vs_memory", "train_vs_memory"),
    }
    return growth, worst, values


def print_measurements(b: Bench, growth: dict[str, float], worst: str | None) -> None:
    """The tables and one paragraph per scenario that ran."""
    args, sizes, (runs, failed) = b.args, b.sizes, b.results["rss"]
    print(
        f"\nCPU: {b.cpu.get('cpu_model', '?')}, {os.cpu_count()} cores; "
        f"{b.started:%Y-%m-%d %H:%M} UTC"
    )
    print(f"ingest.workers = decode processes = {args.workers}; train batch {args.batch_size}")
    if runs:
        print_tables(sizes, runs, failed)
        print(f"\nrss_growth ({sizes[-1]:,} vs {sizes[0]:,} images, max RSS): "
              + ", ".join(f"{s} {v:.2f}" for s, v in growth.items())
              + (f"; worst {worst}" if worst else ""))  # fmt: skip
    throughput, reader, inc = (b.results.get(k) for k in ("throughput", "reader", "incremental"))
    if throughput is not None:
        print(
            f"ingest vs decode ({b.throughput_n:,} images, median of {b.repeats}): decode "
            f"{throughput['decode_images_per_s']:.0f} images/s, ingest "
            f"{throughput['ingest_images_per_s']:.0f} images/s"
        )
    if reader is not None:
        print_reader(b, reader)
    if inc is not None:
        print(
            f"incremental ({inc['images_full']:,} + {inc['images_added']:,} images, median of "
            f"{inc['rounds']}): full "
            f"{inc['full_s']:.2f} s, rerun with no change {inc['rerun_s']:.2f} s (units reused "
            f"{inc['rerun_units_reused']}/{inc['old_units']}, snapshot.json identical: "
            f"{inc['rerun_identical']}), incremental {inc['incremental_s']:.2f} s; units "
            f"reused {inc['units_reused']}/{inc['units']} (old units re-read: "
            f"{inc['old_units_reread']}); old shards byte-identical: {inc['shards_identical']} "
            f"({inc['old_shards']} shards); no old sample changed split: {inc['splits_stable']}"
        )
    memory = b.results.get("train_vs_memory")
    if memory is not None:
        for name, run in memory["runs"].items():
            print(
                f"train vs memory ({name}, {run['samples_per_epoch']:,} samples x "
                f"{run['epochs']} epochs, batch {run['batch_size']}, {run['stream']}): shards "
                f"{run['shards_samples_per_s']:.0f} samples/s, in memory "
                f"{run['memory_samples_per_s']:.0f} samples/s -> {run['train_vs_memory']:.2f}; "
                "epoch seconds shards "
                + " ".join(f"{t:.2f}" for t in run["epoch_seconds"]["shards"])
                + ", memory "
                + " ".join(f"{t:.2f}" for t in run["epoch_seconds"]["memory"])
            )
    big, _ = b.results["big"]
    if big:
        cells = [f"{s} {r.max_rss_mb:.0f} MB ({r.seconds:.0f} s)" for s, r in big.items()]
        print(f"{args.big_images:,} images at 224x224: " + ", ".join(cells))


def print_reader(b: Bench, reader: dict[str, Any]) -> None:
    loader = reader.get("loader") or {}
    print(
        f"reader vs train ({reader['reader_samples']:,} train samples of the {b.reader_n:,} "
        f"set): iter_split + preprocess {reader['reader_samples_per_s']:.0f} samples/s, the "
        f"train step's loader "
        + (
            f"{loader['samples_per_s']:.0f} samples/s ({loader['settings']})"
            if "samples_per_s" in loader
            else loader.get("error", "not there")
        )
        + f"; resnet18 64x64 train step {reader['train_samples_per_s']:.0f} samples/s "
        f"(batch {b.args.batch_size}); reader_vs_train uses {reader['reader']}"
    )
    print_train_metrics(b)


def print_train_metrics(b: Bench) -> None:
    """The train step's own reader and throughput metrics, at each size it ran."""
    for n in b.sizes:
        metrics = b.cache / "runs" / str(n) / "out" / "metrics" / "train.json"
        if metrics.exists():
            doc = json.loads(metrics.read_text())
            print(
                f"  the train step's own metrics at {n:,} images: samples/s "
                f"{fmt(doc.get('samples_per_second'), '.0f')}, reader samples/s "
                f"{fmt(doc.get('reader_samples_per_second'), '.0f')}, reader_vs_train "
                f"{fmt(doc.get('reader_vs_train'))}"
            )


def failures_of(b: Bench) -> list[tuple[str, tuple[str, str]]]:
    """(where, (step, why)) of every step that failed, at each size and in the --big run."""
    _, failed = b.results["rss"]
    _, big_failed = b.results["big"]
    failures = [(f"{n:,} images", f) for n in b.sizes for f in failed.get(n, {}).items()]
    failures += [("224x224", f) for f in big_failed.items()]
    return failures


def write_json(b: Bench, growth: dict[str, float], values: dict[str, float | None]) -> None:
    runs, failed = b.results["rss"]
    big, big_failed = b.results["big"]
    report = {
        "machine": b.cpu,
        "date": b.started.isoformat(timespec="seconds"),
        "sizes": b.sizes,
        "workers": b.args.workers,
        "runs": {n: {s: asdict(r) for s, r in rs.items()} for n, rs in runs.items()},
        "failed": {**failed, "big": big_failed},
        "rss_growth": growth,
        "throughput": b.results["throughput"],
        "reader": b.results["reader"],
        "incremental": b.results["incremental"],
        "train_vs_memory": b.results["train_vs_memory"],
        "big": {s: asdict(r) for s, r in big.items()},
        "values": values,
    }
    b.args.json.write_text(json.dumps(report, indent=2))


def report(b: Bench) -> int:
    """Print the measurements, the failures, the goals and the last (machine-readable) line;
    0 when the incremental ingest (where run) kept the old shards and splits and read no old
    unit, the rerun with no change wrote the same snapshot.json, and no step failed."""
    growth, worst, values = goal_values(b)
    print_measurements(b, growth, worst)
    failures = failures_of(b)
    if failures:
        print("\nFAILED steps (not measured; rss_growth_16x covers the measured ones):")
        for where, (step, why) in failures:
            print(f"  {where}: {step}: {why.splitlines()[0]}")
    print("\ngoals:")
    for name, value in values.items():
        print(f"  {name:<20} {fmt(value, '.3f'):>8}  {verdict(name, value)}")
    if b.args.json:
        write_json(b, growth, values)
    inc = b.results["incremental"]
    kept = inc is None or (
        inc["shards_identical"]
        and inc["splits_stable"]
        and inc["rerun_identical"]
        and not inc["old_units_reread"]
    )
    ok = kept and not failures
    print(
        f"rss_growth_16x={fmt(values['rss_growth_16x'])} "
        f"ingest_vs_decode={fmt(values['ingest_vs_decode'])} "
        f"reader_vs_train={fmt(values['reader_vs_train'])} "
        f"incremental_ingest={fmt(values['incremental_ingest'], '.3f')} "
        f"rerun_no_change={fmt(values['rerun_no_change'], '.3f')} "
        f"rss_100k_224_mb={fmt(values['rss_100k_224_mb'], '.0f')} "
        f"train_vs_memory={fmt(values['train_vs_memory'])}"
    )
    return 0 if ok else 1
