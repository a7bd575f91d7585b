"""The serving-config search against an exhaustive grid, in one run (``--only tune``).

1. ``components.ml.serving.tuning.tune`` searches the digits bundle with ``params.yaml``'s
   ``package.tune`` and ``package.model_config`` (what ``package`` does), timed.
2. Every config of the same space (``Search.grid``: each layout x batching off / each max
   batch x queue delay) is measured ``--tune-rounds`` times, interleaved, with the search's own
   trial (server start, wrk at each of its concurrencies, stop) and scored by its objective.
3. ``tuned_vs_grid_best`` = the tuned config's median score / the best median score of the
   grid. The tuned config is a grid cell, so both come from the same rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import time
from pathlib import Path

from bench.serving.common import REPO, Report, log
from components.core.config import load_params, section
from components.ml.serving.tuning import Search, config_key, tune
from components.steps.package import PackageParams


def run_tune(args: argparse.Namespace, report: Report, work: Path) -> None:
    bundle = Path(args.tune_bundle)
    if not (bundle / "warmup.json").is_file():
        report.notes.append(f"tune: {bundle} has no warmup.json (dvc repro first): skipped")
        return
    params = section(load_params(REPO / "params.yaml"), "package", PackageParams)
    copy = work / "tune-bundle"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(bundle, copy)
    written = params.model_config
    t0 = time.perf_counter()
    tuned, table = tune(params.tune, args.server_binary, copy, written)
    tuning_s = time.perf_counter() - t0
    log.info("tune: %s in %.1f s (%d trials)", config_key(tuned), tuning_s, len(table["trials"]))

    grid_params = dataclasses.replace(params.tune, trial_s=args.tune_trial_seconds)
    (work / "grid").mkdir(exist_ok=True)
    search = Search(grid_params, args.server_binary, copy, table["variant"], written, work / "grid")
    cells = search.grid()
    scores: dict[str, list[float]] = {config_key(c): [] for c in cells}
    for r in range(args.tune_rounds):
        order = cells if r % 2 == 0 else cells[::-1]  # no cell always first or last
        for config in order:
            scores[config_key(config)].append(search.score(search.measure("grid", config)))
        log.info("tune grid round %d of %d done", r + 1, args.tune_rounds)
    medians = {k: statistics.median(v) for k, v in scores.items()}
    best = max(medians, key=lambda k: medians[k])
    tuned_key = config_key(tuned)
    ratio = medians[tuned_key] / medians[best] if medians[best] > 0 else None
    report.tune = {
        "objective": table["objective"],
        "score_unit": table["score_unit"],
        "concurrencies": params.tune.concurrencies,
        "budget_s": params.tune.budget_s,
        "tuning_s": tuning_s,
        "tuning_trials": len(table["trials"]),
        "tuning_within_budget": tuning_s
        <= params.tune.budget_s + max(t["seconds"] for t in table["trials"]),
        "tuned": tuned_key,
        "written": config_key(written),
        "grid_best": best,
        "grid_cells": len(cells),
        "grid_rounds": args.tune_rounds,
        "grid_trial_seconds": args.tune_trial_seconds,
        "grid": {k: {"median": medians[k], "scores": scores[k]} for k in medians},
        "tuned_vs_grid_best": ratio,
        "written_vs_grid_best": (
            medians[config_key(written)] / medians[best]
            if medians[best] > 0 and config_key(written) in medians
            else None
        ),
    }
