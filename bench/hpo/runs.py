"""The bench's runs: the digits snapshot, the grid's trials (cached) and the searches."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from bench.hpo.grid import REPO, code_sha256, grid, grid_key
from components.core import overrides
from components.core.config import from_dict
from components.ml.training.search_space import Space

DIGITS = {"source": "builtin:digits", "kind": "builtin", "sha256": {}, "idx_files": []}


def ingest(work: Path, params_file: Path) -> Path:
    """The digits snapshot under ``work/data`` (the ingest step; unchanged units are reused)."""
    params = yaml.safe_load(params_file.read_text())
    params["ingest"].update(DIGITS)
    bench_params = work / "ingest-params.yaml"
    bench_params.write_text(yaml.safe_dump(params, sort_keys=False))
    data = work / "data"
    _run(["ingest", "--params", str(bench_params), "--data", str(data)], work / "ingest.log")
    return data


def _run(args: list[str], log: Path) -> None:
    """``python -m components <args>``, its stderr (logs, progress) in ``log``."""
    with log.open("w") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "components", *args],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
        )
    if proc.returncode != 0:
        tail = log.read_text().splitlines()[-20:]
        sys.exit(f"bench-hpo: {args[0]} failed ({log}):\n" + "\n".join(tail))


def run_grid(args: argparse.Namespace, data: Path, params: Any, space: Space) -> dict[str, Any]:
    """Each grid config's best val over its epochs (cached; a partial grid resumes)."""
    from components.core.artifacts import write_json
    from components.ml.training import search
    from components.ml.training.search import BudgetParams
    from components.ml.training.trial_metrics import TRIAL_ENV
    from components.steps.hpo import Trials  # the search's own trial command
    from components.tasks import task_from_params

    objective = task_from_params(params).objective()
    metric, higher = f"val_{objective.score}", objective.higher_is_better
    budget = from_dict(BudgetParams, params["hpo"].get("budget") or {}, where="hpo.budget")
    configs = grid(space, args.grid, params)
    trials = Trials(args.work / "grid", data, params, budget)
    key = grid_key(code_sha256(), params, trials.data_sha256, configs, args.epochs)
    cache = args.work / f"grid-{key}.json"
    done = json.loads(cache.read_text())["runs"] if cache.exists() else {}
    todo = [i for i in range(len(configs)) if done.get(str(i), {}).get("value") is None]
    print(
        f"grid: {len(configs)} configs x {args.epochs} epochs, {len(todo)} to run ({cache})",
        flush=True,
    )
    env = {**os.environ, **trials.env(), TRIAL_ENV: "1"}
    pick = max if higher else min
    lock = threading.Lock()

    def one(i: int) -> None:
        started = time.perf_counter()
        argv = trials.argv(f"grid-{i}", {**configs[i], "train.epochs": args.epochs})
        out = search.run_trial(argv, env, lambda e, v: False, metric, lambda: None)
        shutil.rmtree(trials.root / "trials" / f"grid-{i}", ignore_errors=True)
        curve = [v for _, v in out.curve]
        row = {
            "config": configs[i],
            "value": pick(curve) if out.returncode == 0 and curve else None,
            "epochs": len(curve),
            "seconds": round(time.perf_counter() - started, 1),
            "error": None if out.returncode == 0 else out.stderr.splitlines()[-1:],
        }
        with lock:  # one writer at a time (--parallel > 1)
            done[str(i)] = row
            write_json(cache, {"key": key, "metric": metric, "runs": done})  # atomic
            ran = sum(r["value"] is not None for r in done.values())
        print(f"grid {ran}/{len(configs)}: {row['value']} {overrides.set_args(configs[i])}")

    with ThreadPoolExecutor(max_workers=args.parallel or budget.parallel) as pool:
        list(pool.map(one, todo))
    trials.cleanup()
    runs = [done[str(i)] for i in range(len(configs))]
    ok = [r for r in runs if r["value"] is not None]
    if not ok:
        sys.exit(f"bench-hpo: every grid config failed, e.g. {runs[0]['error']}")
    top = pick(ok, key=lambda r: r["value"])
    top["config"] = configs[runs.index(top)]  # in space order (the cache's JSON sorts keys)
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
    root.mkdir(parents=True)
    print(f"search seed {seed}: {args.trials} trials (log: {root / 'hpo.log'})", flush=True)
    _run(
        ["hpo", "--params", str(args.params), "--data", str(data), "--out", str(root / "out"),
         "--study", str(root / "study"), "--metrics", str(root / "hpo.json"),
         *overrides.set_args(sets)],
        root / "hpo.log",
    )  # fmt: skip
    metrics = json.loads((root / "hpo.json").read_text())
    decision = yaml.safe_load((root / "out" / "decision.yaml").read_text())
    trials = json.loads((root / "out" / "trials.json").read_text())
    best = next(t for t in trials["trials"] if t["number"] == trials["best"])
    return {
        "seed": seed,
        **{k: metrics[k] for k in ("best_value", "trial_epochs", "complete", "pruned", "fail")},
        "adopted": metrics["adopted"],
        "best_params": best["params"],
        "reason": decision["reason"],
        "seconds": round(time.perf_counter() - started, 1),
    }
