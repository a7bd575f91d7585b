"""The scenario table: each measurement of the benchmark as a :class:`Scenario` of
:data:`SCENARIOS`, run in order on one :class:`Bench` (the options, the sizes, the generated
images) whose ``results`` hold each scenario's result by name."""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench.data.common import CLASSES, REPO, log
from bench.data.corpus import generated, link_folder
from bench.data.measurements import incremental, ingest_vs_decode
from bench.data.params import parse_sets, set_key, write_params
from bench.data.steps import StepRun, run_steps
from bench.data.workers import call_worker


@dataclass
class Bench:
    """One run of the benchmark: its options, the sizes and sets each scenario measures, the
    generated images, and each scenario's result (:data:`SCENARIOS`) by name."""

    args: argparse.Namespace
    sizes: list[int]
    repeats: int
    throughput_n: int
    reader_n: int
    incremental_n: int
    memory_n: int  # train_vs_memory's image folder
    sets: list[tuple[str, Any]]
    cache: Path
    cpu: dict[str, Any]
    started: datetime
    gen: Path
    results: dict[str, Any] = field(default_factory=dict)


def setup(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Bench:
    """The sizes (checked), the cache and the generated 64x64 images every scenario reads."""
    sizes = sorted(args.sizes or ([500, 2000] if args.quick else [2000, 8000, 32000]))
    if len(sizes) < 2 or any(n < 20 or n % len(CLASSES) for n in sizes):
        parser.error("--sizes: at least two sizes, multiples of 10, >= 20")
    repeats = min(args.repeats, 2) if args.quick else args.repeats
    throughput_n = args.throughput_size or sizes[-1]
    reader_n = args.reader_size or max([n for n in sizes if n <= 8000] or sizes[:1])
    incremental_n = args.incremental_size or sizes[-1]
    memory_n = args.train_memory_size or min(500, sizes[0])
    if memory_n < 20 or memory_n % len(CLASSES):
        parser.error("--train-memory-size: a multiple of 10, >= 20")
    for name, n in (("throughput", throughput_n), ("reader", reader_n)):
        if n not in sizes:
            parser.error(f"--{name}-size {n} must be one of --sizes {sizes}")
    sets = parse_sets(args.set)
    cache = args.cache_dir.resolve()
    cache.mkdir(parents=True, exist_ok=True)

    from components.core.artifacts import machine

    cpu = machine()
    started = datetime.now(UTC)
    log.info("CPU %s, %d cores; cache %s", cpu.get("cpu_model"), os.cpu_count(), cache)
    # the images the chosen scenarios read: train_vs_memory alone needs only its folder's
    most = memory_n if set(args.scenarios) <= {"train_vs_memory"} else max(*sizes, incremental_n)
    most = max(most, memory_n)
    gen = generated(cache, 64, most // 10 + max(1, most // 100), args.seed, args.workers)
    return Bench(
        args, sizes, repeats, throughput_n, reader_n, incremental_n, memory_n, sets, cache, cpu,
        started, gen,
    )  # fmt: skip


# --------------------------------------------------------------------------- scenarios


def scenario_rss(b: Bench) -> tuple[dict[int, dict[str, StepRun]], dict[int, dict[str, str]]]:
    """Peak RSS per step and size: (runs, failed steps) by size."""
    runs: dict[int, dict[str, StepRun]] = {}
    failed: dict[int, dict[str, str]] = {}
    for n in b.sizes:
        folder = link_folder(b.cache / f"folder-64px-{n}", b.gen, n // len(CLASSES))
        params = write_params(
            b.cache / "runs" / str(n) / "params.yaml", folder, image_size=64,
            workers=b.args.workers, batch_size=b.args.batch_size, sets=b.sets,
        )  # fmt: skip
        log.info("%d images (%s):", n, folder)
        runs[n], failed[n] = run_steps(params, b.cache / "runs" / str(n) / "out", b.args.steps)
    return runs, failed


def scenario_ingest_vs_decode(b: Bench) -> dict[str, Any]:
    """Ingest vs the bare decode loop, on the throughput size's folder."""
    log.info("ingest vs decode, %d images, %d processes:", b.throughput_n, b.args.workers)
    tp_params = b.cache / "runs" / str(b.throughput_n) / "params.yaml"
    unit_files = int(yaml.safe_load(tp_params.read_text())["ingest"].get("unit_files", 256))
    return ingest_vs_decode(
        b.cache / f"folder-64px-{b.throughput_n}", tp_params, b.cache / "scratch" / "throughput",
        b.args.workers, b.repeats, unit_files,
    )  # fmt: skip


def scenario_reader(b: Bench) -> dict[str, Any]:
    """The streaming reader (the train step's loader when it reports one) vs the train step."""
    log.info("reader vs train step, the train split of %d images:", b.reader_n)
    reader = call_worker(
        "reader", str(b.cache / "runs" / str(b.reader_n) / "params.yaml"),
        str(b.cache / "runs" / str(b.reader_n) / "out" / "ingest"), str(b.args.batch_size),
        str(b.args.train_steps),
    )  # fmt: skip
    loader = reader.get("loader") or {}
    if "samples_per_s" in loader:  # the train step's own pipeline is the reader it trains on
        reader["reader"] = "components.tasks.stream (the train step's loader)"
        reader_rate = loader["samples_per_s"]
    else:
        reader["reader"] = "iter_split + task.preprocess"
        reader_rate = reader["reader_samples_per_s"]
    reader["reader_vs_train"] = reader_rate / reader["train_samples_per_s"]
    log.info(
        "  iter_split + preprocess %.0f samples/s (%d samples); the train step's loader: %s",
        reader["reader_samples_per_s"], reader["reader_samples"],
        f"{loader['samples_per_s']:.0f} samples/s" if "samples_per_s" in loader
        else loader.get("error", "none"),
    )  # fmt: skip
    log.info(
        "  train step %.0f samples/s (batch %d) -> reader_vs_train %.2f (%s)",
        reader["train_samples_per_s"], b.args.batch_size, reader["reader_vs_train"],
        reader["reader"],
    )  # fmt: skip
    return reader


def digits_params(dest: Path, sets: list[tuple[str, Any]]) -> Path:
    """The repo's params.yaml (the digits task, its default) reading ``builtin:digits``."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["ingest"].update(source="builtin:digits", kind="builtin", sha256={}, idx_files=[])
    params["train"]["distributed"]["nproc"] = 1
    for key, value in sets:
        set_key(params, key, value)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(params, sort_keys=False))
    return dest


def ingested(params: Path, out: Path) -> Path:
    """``out``, ingested from ``params`` unless a snapshot of the same ``ingest`` params is
    there."""
    stamp = out.parent / (out.name + ".params.yaml")
    section = yaml.safe_dump(yaml.safe_load(params.read_text())["ingest"], sort_keys=True)
    fresh = (out / "snapshot.json").exists() and stamp.exists() and stamp.read_text() == section
    if not fresh:
        shutil.rmtree(out, ignore_errors=True)
        call_worker("ingest", str(params), str(out))
        stamp.write_text(section)
    return out


def scenario_train_vs_memory(b: Bench) -> dict[str, Any]:
    """The train step reading shards (its own input pipeline) vs the same model on the split
    held in memory, epoch by epoch in one process: on digits (the repo's task) and on the
    64x64 image folder (resnet18)."""
    args, out = b.args, b.cache / "runs" / "train_vs_memory"
    epochs = str(args.train_memory_epochs)
    runs: dict[str, Any] = {}
    digits = digits_params(out / "digits" / "params.yaml", b.sets)
    folder = link_folder(b.cache / f"folder-64px-{b.memory_n}", b.gen, b.memory_n // len(CLASSES))
    images = write_params(
        out / str(b.memory_n) / "params.yaml", folder, image_size=64, workers=args.workers,
        batch_size=args.batch_size, sets=b.sets,
    )  # fmt: skip
    for name, params in (("digits", digits), (f"resnet18 64x64, {b.memory_n:,} images", images)):
        log.info("train vs memory, %s, %s epochs:", name, epochs)
        data = ingested(params, params.parent / "ingest")
        got = call_worker("train_vs_memory", str(params), str(data), epochs)
        log.info(
            "  shards %.0f samples/s, memory %.0f samples/s -> train_vs_memory %.2f "
            "(epoch seconds, shards: %s; memory: %s)",
            got["shards_samples_per_s"], got["memory_samples_per_s"], got["train_vs_memory"],
            " ".join(f"{t:.2f}" for t in got["epoch_seconds"]["shards"]),
            " ".join(f"{t:.2f}" for t in got["epoch_seconds"]["memory"]),
        )  # fmt: skip
        runs[name] = got
    worst = min(runs, key=lambda k: runs[k]["train_vs_memory"])
    return {"runs": runs, "worst": worst, "train_vs_memory": runs[worst]["train_vs_memory"]}


def scenario_incremental(b: Bench) -> dict[str, Any]:
    """Incremental ingest: +10% new files, into the same output directory (``repeats``
    rounds from scratch, the medians)."""
    log.info("incremental ingest, %d images + 10%%, %d round(s):", b.incremental_n, b.repeats)
    return incremental(
        b.gen, b.cache / "scratch" / "incremental", b.incremental_n, b.args.workers,
        b.args.batch_size, b.sets, b.repeats,
    )  # fmt: skip


def scenario_big(b: Bench) -> tuple[dict[str, StepRun], dict[str, str]]:
    """``--big``: 100k RGB images at 224x224 (runs, failed steps)."""
    args = b.args
    per_class = args.big_images // len(CLASSES)
    gen224 = generated(b.cache, 224, per_class, args.seed, args.workers)
    folder = link_folder(b.cache / f"folder-224px-{args.big_images}", gen224, per_class)
    params = write_params(
        b.cache / "runs" / "big" / "params.yaml", folder, image_size=224,
        workers=args.workers, batch_size=args.batch_size,
        sets=[*b.sets, *parse_sets(args.big_set)],
    )  # fmt: skip
    log.info("%d images at 224x224 (%s):", args.big_images, folder)
    return run_steps(params, b.cache / "runs" / "big" / "out", args.big_steps)


@dataclass(frozen=True)
class Scenario:
    """One measurement of the benchmark: ``run`` when ``when`` holds for the options, else
    ``default`` is its result."""

    name: str
    run: Callable[[Bench], Any]
    when: Callable[[argparse.Namespace], bool] = lambda args: True
    default: Any = None


def chosen(name: str) -> Callable[[argparse.Namespace], bool]:
    """Run scenario ``name`` when ``--scenarios`` names it."""
    return lambda args: name in args.scenarios


# run in this order; each result is Bench.results[name] (None: not run)
SCENARIOS = (
    Scenario("rss", scenario_rss, chosen("rss"), ({}, {})),  # 1. peak RSS per step and size
    # 2. ingest vs the bare decode loop
    Scenario("throughput", scenario_ingest_vs_decode, chosen("throughput")),
    Scenario("reader", scenario_reader, chosen("reader")),  # 3. the reader vs the train step
    Scenario("incremental", scenario_incremental, chosen("incremental")),  # 4. incremental
    # 5. 100k images at 224x224
    Scenario("big", scenario_big, when=lambda args: args.big, default=({}, {})),
    # 6. the train step reading shards vs in memory
    Scenario("train_vs_memory", scenario_train_vs_memory, chosen("train_vs_memory")),
)
SCENARIO_NAMES = ("rss", "throughput", "reader", "incremental", "train_vs_memory")
