"""The hpo step's local search against an exhaustive grid over the same space (``make bench-hpo``).

On the digits (ingested from ``builtin:digits``, the samples ``data/raw/digits`` holds):

1. **The grid.** Every key of the space (``hpo.space`` of ``--params``) is discretised to a few
   points (:func:`grid_counts`: the ends first, then more points for the keys with the most
   values, while the product stays <= ``--grid``); every config is trained by the search's
   own trial command (the hpo step's, on its train+val view) for ``--epochs`` epochs, no
   pruning, with the params' ``train.seed``. Its results are cached under
   ``build/bench-hpo/grid-<key>.json``, keyed by the code under ``components/``, the params,
   the data's train and val shards and the configs: the same at every repeat and rerun.
2. **The search**, ``--repeats`` times (sampler seeds 0, 1, ...): the hpo step's CLI
   (``python -m components hpo``) with ``hpo.enabled=true`` and the budget, epochs, pruner and
   seed as ``--set`` arguments; a fresh study each time, adoption included (its runs are
   counted apart: they are not search cost).

Per repeat: hpo_vs_grid_best = the search winner's val / the grid's best (the inverse when
lower is better: >= 1 means the search found as good), hpo_cost_vs_grid = trial-epochs the
search's trials ran (pruned ones stop early) / the grid's. Then the min/median/max of each
ratio, and the last line: the medians and ``adopted=yes`` when most repeats adopted.

    .venv/bin/python bench/hpo.py                                  # the defaults (make bench-hpo)
    .venv/bin/python bench/hpo.py --trials 6 --grid 8 --epochs 2 --repeats 1   # a smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from components.core import overrides  # noqa: E402
from components.core.config import from_dict, load_params, params_sha256  # noqa: E402
from components.ml.training import search_space  # noqa: E402
from components.ml.training.search_space import (  # noqa: E402
    CategoricalSpec,
    IntSpec,
    Space,
    Spec,
)

WORK = REPO / "build" / "bench-hpo"
DIGITS = {"source": "builtin:digits", "kind": "builtin", "sha256": {}, "idx_files": []}


# --------------------------------------------------------------------------- the grid


def cardinality(spec: Spec) -> float:
    """How many values ``spec`` can take (``inf``: a continuous float)."""
    if isinstance(spec, CategoricalSpec):
        return len(spec.choices)
    if spec.step is None:
        return spec.high - spec.low + 1 if isinstance(spec, IntSpec) else math.inf
    return math.floor((spec.high - spec.low) / spec.step + 1e-9) + 1


def grid_counts(space: Space, target: int) -> dict[str, int]:
    """Points per key: one each, then one more for the key with the fewest points (ties: the
    most values, then space order) while the product stays <= ``target``."""
    counts = dict.fromkeys(space, 1)
    while True:
        size = math.prod(counts.values())
        fits = [
            k
            for k, s in space.items()
            if counts[k] < cardinality(s) and size // counts[k] * (counts[k] + 1) <= target
        ]
        if not fits:
            return counts
        order = list(space)
        key = min(fits, key=lambda k: (counts[k], -cardinality(space[k]), order.index(k)))
        counts[key] += 1


def points(spec: Spec, n: int, current: Any = None) -> list[Any]:
    """``n`` values of ``spec`` spread over it, ends included (one: ``current`` when ``spec``
    can sample it, else the middle)."""
    if n == 1 and current is not None and search_space.contains(spec, current):
        return [current]
    if isinstance(spec, CategoricalSpec):
        picks = np.unique(np.round(np.linspace(0, len(spec.choices) - 1, n)).astype(int))
        if n == 1:
            picks = [len(spec.choices) // 2]
        return [spec.choices[int(i)] for i in picks]
    low, high = float(spec.low), float(spec.high)
    if n == 1:
        raw = [math.sqrt(low * high) if spec.log else (low + high) / 2]
    else:
        raw = list(np.geomspace(low, high, n) if spec.log else np.linspace(low, high, n))
    if spec.step is not None:
        raw = [spec.low + round((x - low) / spec.step) * spec.step for x in raw]
    if isinstance(spec, IntSpec):
        values: list[Any] = [int(round(x)) for x in raw]
    else:
        values = [float(f"{x:.6g}") for x in raw]
    return list(dict.fromkeys(values))  # rounding may merge neighbours


def grid(space: Space, target: int, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every config of the discretised space, in space order; a conditional key only where its
    condition holds (its count stays in the product: ``target`` is an upper bound)."""
    counts = grid_counts(space, target)
    current = search_space.current(space, params)
    configs: list[dict[str, Any]] = [{}]
    for key, spec in space.items():
        values = points(spec, counts[key], current.get(key))
        grown: list[dict[str, Any]] = []
        for config in configs:
            if search_space.active(spec, config, params):
                grown.extend({**config, key: value} for value in values)
            else:
                grown.append(config)
        configs = grown
    return configs


# --------------------------------------------------------------------------- the numbers


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


def code_sha256(root: Path = REPO / "components") -> str:
    """The sha256 of every source file under ``root`` (paths and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(f"{path.relative_to(root)}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def grid_key(code: str, params: Mapping[str, Any], data: str, configs: list, epochs: int) -> str:
    """The grid cache's key: the code, the task and train params, the data, the configs."""
    train = {k: v for k, v in (params.get("train") or {}).items() if k != "epochs"}
    return params_sha256(
        {
            "code": code,
            "params": {"task": params.get("task"), "train": train},
            "data": data,
            "configs": [{k: overrides.format_value(v) for k, v in c.items()} for c in configs],
            "epochs": epochs,
        }
    )[:16]


# --------------------------------------------------------------------------- the runs


def ingest(work: Path, params_file: Path) -> Path:
    """The digits snapshot under ``work/data`` (the ingest step; unchanged units are reused)."""
    params = yaml.safe_load(params_file.read_text())
    params["ingest"].update(DIGITS)
    bench_params = work / "ingest-params.yaml"
    bench_params.write_text(yaml.safe_dump(params, sort_keys=False))
    data = work / "data"
    _run(["ingest", "--params", str(bench_params), "--data", str(data)])
    return data


def _run(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "components", *args], cwd=REPO, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"bench-hpo: {args[0]} failed:\n{proc.stderr[-3000:]}")


def run_grid(args: argparse.Namespace, data: Path, params: Any, space: Space) -> dict[str, Any]:
    """Each grid config's best val over its epochs (cached; a partial grid resumes)."""
    from components.core.artifacts import write_json
    from components.ml.training import search
    from components.ml.training.search import BudgetParams
    from components.ml.training.trial_metrics import TRIAL_ENV
    from components.steps.hpo import _Trials  # the search's own trial command
    from components.tasks import task_from_params

    objective = task_from_params(params).objective()
    metric, higher = f"val_{objective.score}", objective.higher_is_better
    budget = from_dict(BudgetParams, params["hpo"].get("budget") or {}, where="hpo.budget")
    configs = grid(space, args.grid, params)
    trials = _Trials(args.work / "grid", data, params, budget)
    key = grid_key(code_sha256(), params, trials.data_sha256, configs, args.epochs)
    cache = args.work / f"grid-{key}.json"
    done = json.loads(cache.read_text())["runs"] if cache.exists() else {}
    todo = [i for i in range(len(configs)) if str(i) not in done]
    print(f"grid: {len(configs)} configs x {args.epochs} epochs, {len(todo)} to run ({cache})")
    env = {**os.environ, **trials.env(), TRIAL_ENV: "1"}
    pick = max if higher else min

    def one(i: int) -> None:
        started = time.perf_counter()
        argv = trials.argv(f"grid-{i}", {**configs[i], "train.epochs": args.epochs})
        out = search.run_trial(argv, env, lambda e, v: False, metric, lambda: None)
        shutil.rmtree(trials.root / "trials" / f"grid-{i}", ignore_errors=True)
        curve = [v for _, v in out.curve]
        done[str(i)] = {
            "config": configs[i],
            "value": pick(curve) if out.returncode == 0 and curve else None,
            "epochs": len(curve),
            "seconds": round(time.perf_counter() - started, 1),
            "error": None if out.returncode == 0 else out.stderr.splitlines()[-1:],
        }
        write_json(cache, {"key": key, "metric": metric, "runs": done})  # atomic

    with ThreadPoolExecutor(max_workers=args.parallel or budget.parallel) as pool:
        list(pool.map(one, todo))
    trials.cleanup()
    runs = [done[str(i)] for i in range(len(configs))]
    ok = [r for r in runs if r["value"] is not None]
    if not ok:
        sys.exit(f"bench-hpo: every grid config failed, e.g. {runs[0]['error']}")
    top = pick(ok, key=lambda r: r["value"])
    return {
        "metric": metric,
        "higher_is_better": higher,
        "configs": len(runs),
        "failed": len(runs) - len(ok),
        "best": top["value"],
        "best_config": top["config"],
        "trial_epochs": sum(r["epochs"] for r in runs),
        "seconds": round(sum(r["seconds"] for r in runs), 1),
        "cache": str(cache.relative_to(REPO)) if cache.is_relative_to(REPO) else str(cache),
    }


def run_search(args: argparse.Namespace, data: Path, seed: int) -> dict[str, Any]:
    """One search (the hpo step's CLI, a fresh study) with sampler seed ``seed``."""
    root = args.work / f"search-{seed}"
    shutil.rmtree(root, ignore_errors=True)
    sets: dict[str, Any] = {
        "hpo.enabled": True,
        "hpo.engine": "optuna",
        "hpo.budget.trials": args.trials,
        "hpo.trial_epochs": args.epochs,
        "hpo.sampler.seed": seed,
        "hpo.pruner.name": args.pruner,
    }
    if args.parallel:
        sets["hpo.budget.parallel"] = args.parallel
    if args.adopt_seeds:
        sets["hpo.adopt.seeds"] = args.adopt_seeds
    if args.adopt_epochs:
        sets["train.epochs"] = args.adopt_epochs
    started = time.perf_counter()
    _run(
        ["hpo", "--params", str(args.params), "--data", str(data), "--out", str(root / "out"),
         "--study", str(root / "study"), "--metrics", str(root / "hpo.json"),
         *overrides.set_args(sets)]
    )  # fmt: skip
    metrics = json.loads((root / "hpo.json").read_text())
    overlay = yaml.safe_load((root / "out" / "overlay.yaml").read_text())
    trials = json.loads((root / "out" / "trials.json").read_text())
    best = next(t for t in trials["trials"] if t["number"] == trials["best"])
    return {
        "seed": seed,
        **{k: metrics[k] for k in ("best_value", "trial_epochs", "complete", "pruned", "fail")},
        "adopted": metrics["adopted"],
        "best_params": best["params"],
        "reason": overlay["reason"],
        "seconds": round(time.perf_counter() - started, 1),
    }


def parser() -> argparse.ArgumentParser:
    """The bench's knobs (the defaults are ``make bench-hpo``'s)."""
    knobs = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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


if __name__ == "__main__":
    sys.exit(main())
