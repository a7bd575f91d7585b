"""The command line of the data benchmark (``bench/data_bench.py``, ``make bench-data``): the
options, the ``--worker`` mode, and the scenarios run in order then reported."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import bench.data
from bench.data.common import GOAL_STEPS, REPO
from bench.data.report import report
from bench.data.scenarios import SCENARIO_NAMES, SCENARIOS, setup
from bench.data.workers import run_worker


def build_parser() -> argparse.ArgumentParser:
    """The options of ``bench/data_bench.py`` (see :mod:`bench.data`)."""
    parser = argparse.ArgumentParser(description=bench.data.__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=None,
        help="images per data set (default 2000 8000 32000; --quick 500 2000)",
    )
    parser.add_argument("--quick", action="store_true", help="500 and 2000 images, 2 rounds")
    parser.add_argument("--big", action="store_true", help="also 100k RGB 224x224 (not in CI)")
    parser.add_argument("--big-images", type=int, default=100_000, help=argparse.SUPPRESS)
    parser.add_argument(
        "--big-steps",
        nargs="+",
        default=["ingest", "validate"],
        choices=GOAL_STEPS,
        help="steps of the --big run (default: %(default)s)",
    )
    parser.add_argument(
        "--big-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="params of the --big run, e.g. train.<bounding knob>=50",
    )
    parser.add_argument(
        "--steps",
        nargs="+",
        default=list(GOAL_STEPS),
        choices=GOAL_STEPS,
        help="steps measured per size (evaluate also runs train and export)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 2,
        help="ingest.workers and the decode pool's processes",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="train.batch_size")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="ingest/decode rounds, and incremental rounds (each from scratch; medians)",
    )
    parser.add_argument("--train-steps", type=int, default=20, help="timed resnet18 steps")
    parser.add_argument("--throughput-size", type=int, help="default: the largest size")
    parser.add_argument("--reader-size", type=int, help="default: 8000 (or the largest below)")
    parser.add_argument("--incremental-size", type=int, help="default: the largest size")
    parser.add_argument(
        "--scenarios",
        nargs="+",
        default=list(SCENARIO_NAMES),
        choices=SCENARIO_NAMES,
        help="the scenarios run (default: all; throughput and reader read rss's snapshots), "
        "e.g. --scenarios train_vs_memory alone",
    )
    parser.add_argument(
        "--train-memory-size",
        type=int,
        help="train_vs_memory's image folder (default: 500, or the smallest size below it)",
    )
    parser.add_argument(
        "--train-memory-epochs", type=int, default=4, help="train_vs_memory's epochs per side"
    )
    parser.add_argument("--seed", type=int, default=0, help="of the generated images")
    parser.add_argument("--cache-dir", type=Path, default=REPO / "build" / "bench-data")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a params key of every run, e.g. validate.workers=2",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--worker",
        choices=["decode", "ingest", "reader", "train_vs_memory"],
        help=argparse.SUPPRESS,
    )
    parser.add_argument("worker_args", nargs="*", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--worker``, one measurement: its JSON on stdout)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(args.worker, args.worker_args)))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bench = setup(parser, args)
    for scenario in SCENARIOS:
        bench.results[scenario.name] = (
            scenario.run(bench) if scenario.when(args) else scenario.default
        )
    return report(bench)
