"""The prediction log's cost: the same C++ digits server without a log, logging every
request's outputs, and logging outputs plus inputs at a sample rate of 0.1, all three running
at once and measured in turn (``--repeats`` rounds, the order rotating), so each ratio is a
ratio of runs seconds apart. The limit is the server without a log."""

from __future__ import annotations

import argparse
import urllib.request
from pathlib import Path

from bench.serving.common import Cell, Report, input_shape, log, model_file, noise_of
from bench.serving.loads import Wrk, measure
from bench.serving.servers import check_answers, start_cpp
from bench.serving.stats import layouts, summarize
from components.ml.data.prediction_log import read_log
from components.ml.serving.ov_runtime import OVPredictor

REGIME = "predlog"

# background label of each server -> extra flags
VARIANTS = {
    "-": [],
    "log-outs": ["--log-input-rate=0"],
    "log-in0.1": ["--log-input-rate=0.1"],
}


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def run_prediction_log(args: argparse.Namespace, report: Report, work: Path, wrk: Wrk) -> None:
    model_dir = args.digits_dir
    shape = input_shape(model_dir)
    ((workers, threads),) = layouts(args.digits_layout)
    layout = f"{workers}x{threads}"
    noise = noise_of(args)
    reference = OVPredictor(model_file(model_dir), threads=threads)
    servers = {}
    try:
        for label, flags in VARIANTS.items():
            log_dir = work / f"predictions-{label.strip('-') or 'none'}"
            extra = [] if not flags else [f"--prediction-log-dir={log_dir}", *flags]
            # this server's flags on a copy of the run's arguments (the caller's stay as given)
            server_args = argparse.Namespace(
                **{**vars(args), "server_args": [*args.server_args, *extra]}
            )
            servers[label] = start_cpp(
                server_args,
                model_dir,
                "digits",
                workers,
                threads,
                False,
                work / f"cpp-digits-log-{label.strip('-') or 'none'}.log",
                args.digits_queue_delay_us,
                args.max_batch_size,
            )
            report.checks.append(
                check_answers(servers[label], "digits", reference, shape, f"cpp digits {label}")
            )
        c = args.log_concurrency
        keys = list(VARIANTS)
        samples: dict[str, list[Cell]] = {k: [] for k in keys}
        for i in range(args.repeats):
            for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
                cell = Cell(REGIME, "cpp", "digits", layout, "off", c, background=key)
                load = wrk.load(servers[key], "digits", shape, c)
                samples[key].append(
                    measure(load, servers[key], "digits", cell, args.duration, args.warmup, noise)
                )
        report.cells += [summarize(samples[k]) for k in keys]
        for key in keys[1:]:
            port = servers[key].port
            written = _metric(port, "serving_prediction_log_written_total")
            dropped = _metric(port, "serving_prediction_log_dropped_total")
            answered = _metric(port, 'kserve_requests_total{model="digits"')
            report.prediction_log[key] = {
                "written": written,
                "dropped": dropped,
                "answered": answered,
            }
            log.info("prediction log %s: %d written, %d dropped", key, written, dropped)
    finally:
        for server in servers.values():
            server.stop()
    # the inputs really are in the log (decoded back): a sample rate that logged nothing
    # would make the ratio meaningless
    logged = 0
    for record in read_log(work / "predictions-log-in0.1"):
        logged += record.inputs is not None
        if logged >= 10:
            break
    report.prediction_log["inputs_decoded"] = logged
