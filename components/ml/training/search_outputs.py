"""What a search leaves behind, and what makes two searches the same study.

- :func:`write`: the search's output directory, atomically: ``overlay.yaml`` (what train
  applies, and nothing else: :func:`overlay`), ``decision.yaml`` (the decision: why, the
  evidence, the winner), ``trials.json``, the Optuna plots, any engine files (Katib's
  ``experiment.yaml``) and ``manifest.json``; then ``metrics/hpo.json`` (:func:`metrics`).
  train depends on ``overlay.yaml`` alone, so a search that adopts nothing leaves it byte
  for byte as it was, whatever it found, and ``dvc repro`` does not rerun train.
- :func:`identity`: the space, the objective, the train and val data, the params the space
  does not set and the trial epochs; a change in any of them starts a new study.

ML layer: knows no task and no step.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from components.core import overrides
from components.core.artifacts import atomic_path, write_json, write_manifest
from components.core.config import params_sha256
from components.ml.training import search
from components.ml.training.search_space import Space


def identity(
    space: Space, metric: str, data_sha256: str, all_params: dict[str, Any], epochs: int
) -> dict[str, Any]:
    """What makes two searches the same study (module docstring)."""
    rest = overrides.apply(all_params, dict.fromkeys(space))  # searched keys blanked
    return {
        "space": {k: asdict(s) for k, s in space.items()},
        "objective": metric,
        "data": data_sha256,
        "params": params_sha256({k: rest[k] for k in ("task", "train") if k in rest}),
        "epochs": epochs,
    }


# what train applies from a search: these keys of the decision, and only when it adopted
APPLIED = ("engine", "study", "trial", "objective")


def overlay(decision: dict[str, Any]) -> dict[str, Any]:
    """``overlay.yaml`` of ``decision``: when adopted, the winner's keys (``params``) and where
    they came from; else exactly ``{adopted: false, params: {}}``, whatever the search found or
    said (byte-stable: train's dependency does not change when nothing is adopted)."""
    if not decision["adopted"]:
        return {"adopted": False, "params": {}}
    return {
        "adopted": True,
        "params": dict(decision["winner_params"]),
        **{k: decision[k] for k in APPLIED},
    }


def write(
    out_dir: Path,
    metrics_file: Path,
    decision: dict[str, Any],
    trials: dict[str, Any],
    all_params: dict[str, Any],
    data_dir: str | Path,
    study: Any = None,
    files: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write the overlay and the ``decision`` it comes from (:func:`overlay`), the trials, the
    plots of ``study``, ``files`` (name -> text) and the manifest atomically, then the metrics;
    the decision."""
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        outputs: dict[str, Path] = {
            "overlay": tmp / overrides.OVERLAY,
            "decision": tmp / overrides.DECISION,
        }
        for path, doc in ((outputs["overlay"], overlay(decision)), (outputs["decision"], decision)):
            path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        for name, text in (files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
            outputs[Path(name).stem] = tmp / name
        if trials:
            outputs["trials"] = write_json(tmp / "trials.json", trials)
        for plot in search.save_plots(study, tmp) if study is not None else []:
            outputs[plot.stem] = plot
        write_manifest(
            tmp,
            "hpo",
            inputs={"data": data_dir},
            outputs=outputs,
            params=dict(all_params.get("hpo") or {}),
            extra={"adopted": decision["adopted"], "reason": decision["reason"]},
        )
    write_json(metrics_file, metrics(decision, trials))
    return decision


def metrics(decision: dict[str, Any], trials: dict[str, Any]) -> dict[str, Any]:
    """``metrics/hpo.json``: the decision, the trial counts, the best and the baseline values,
    and the trial-epochs the search spent (its cost)."""
    rows = [t for t in trials.get("trials", []) if not t["stale"]]
    states = [t["state"] for t in rows]
    by_number = {t["number"]: t for t in rows}
    best, baseline = by_number.get(trials.get("best")), by_number.get(0)
    return {
        "enabled": bool(trials),
        "adopted": decision["adopted"],
        "trials": len(rows),
        **{s.lower(): states.count(s) for s in ("COMPLETE", "PRUNED", "FAIL")},
        "trial_epochs": sum(len(t["curve"]) for t in trials.get("trials", [])),
        "best_value": None if best is None else best["value"],
        "baseline_value": None if baseline is None else baseline["value"],
    }
