"""``python -m bench.hpo``: the knobs, the ratios and the printed lines (see the package)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.hpo.grid import REPO
from bench.hpo.runs import ingest, run_grid, run_search
from components.core import overrides
from components.core.config import load_params
from components.ml.training import search_space

WORK = REPO / "build" / "bench-hpo"


def best_ratio(search: float, grid_best: float, higher_is_better: bool) -> float:
    """The search's best over the grid's (inverted when lower is better): >= 1, as good."""
    return search / grid_best if higher_is_better else grid_best / search


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(min, median, max)."""
    return min(values), statistics.median(values), max(values)


def last_line(best: Sequence[float], cost: Sequence[float], adopted: Sequence[bool]) -> str:
    """The bench's last line: the medians over repeats; adopted when most repeats adopted."""
    yes = sum(adopted) > len(adopted) / 2
    return (
        f"hpo_vs_grid_best={statistics.median(best):.4f} "
        f"hpo_cost_vs_grid={statistics.median(cost):.3f} adopted={'yes' if yes else 'no'}"
    )


def parser() -> argparse.ArgumentParser:
    """The bench's knobs (the defaults are ``make bench-hpo``'s)."""
    knobs = argparse.ArgumentParser(
        description="the hpo step's search vs an exhaustive grid (docs/hpo.md)"
    )
    knobs.add_argument("--params", type=Path, default=REPO / "params.yaml")
    knobs.add_argument("--trials", type=int, default=16, help="search budget (hpo.budget.trials)")
    knobs.add_argument("--grid", type=int, default=48, help="at most this many grid configs")
    knobs.add_argument("--epochs", type=int, help="epochs of a trial (default: hpo.trial_epochs)")
    knobs.add_argument("--repeats", type=int, default=3, help="searches, sampler seeds 0, 1, ...")
    knobs.add_argument(
        "--pruner", default="median", choices=("median", "successive_halving", "none")
    )
    knobs.add_argument("--parallel", type=int, help="trials at once (default: hpo.budget)")
    knobs.add_argument("--adopt-seeds", type=int, help="adoption seeds (default: hpo.adopt)")
    knobs.add_argument("--adopt-epochs", type=int, help="adoption epochs (default: train.epochs)")
    knobs.add_argument("--work", type=Path, default=WORK, help="data, grid cache, searches")
    return knobs


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress lines
    params = load_params(args.params)
    args.epochs = args.epochs or params["hpo"].get("trial_epochs") or params["train"]["epochs"]
    raw_space = params["hpo"].get("space")
    space = search_space.parse_space(raw_space, source=str(args.params))
    search_space.validate(space, params, source=str(args.params))
    args.work.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    data = ingest(args.work, args.params)
    grid_result = run_grid(args, data, params, space)
    print(
        f"grid: best {grid_result['metric']} {grid_result['best']:.4f} at "
        f"{overrides.set_args(grid_result['best_config'])}; {grid_result['trial_epochs']} "
        f"trial-epochs, {grid_result['seconds']:.0f} s of runs, {grid_result['failed']} failed"
    )
    searches = []
    for seed in range(args.repeats):
        found = run_search(args, data, seed)
        found["hpo_vs_grid_best"] = best_ratio(
            found["best_value"], grid_result["best"], grid_result["higher_is_better"]
        )
        found["hpo_cost_vs_grid"] = found["trial_epochs"] / grid_result["trial_epochs"]
        searches.append(found)
        print(
            f"search seed {seed}: best {found['best_value']:.4f} "
            f"(x{found['hpo_vs_grid_best']:.4f} of the grid's) in {found['trial_epochs']} "
            f"trial-epochs (x{found['hpo_cost_vs_grid']:.3f}), {found['complete']} complete, "
            f"{found['pruned']} pruned, {found['fail']} failed, {found['seconds']:.0f} s with "
            f"adoption; {found['reason']}"
        )
    for name in ("hpo_vs_grid_best", "hpo_cost_vs_grid"):
        low, mid, high = spread([s[name] for s in searches])
        print(f"{name}: min {low:.4f} median {mid:.4f} max {high:.4f} over {len(searches)}")
    report = {"grid": grid_result, "searches": searches, "args": {k: str(v) for k, v in
              vars(args).items()}, "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    (args.work / "report.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"bench-hpo: {report['seconds']:.0f} s on this machine; {args.work / 'report.json'}")
    print(
        last_line(
            [s["hpo_vs_grid_best"] for s in searches],
            [s["hpo_cost_vs_grid"] for s in searches],
            [s["adopted"] for s in searches],
        )
    )
    return 0
