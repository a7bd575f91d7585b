"""What a search leaves behind, and what makes two searches the same study.

- :func:`write`: the search's output directory, atomically: ``overlay.yaml`` (what train
  reads), ``trials.json``, the Optuna plots, any engine files (Katib's ``experiment.yaml``)
  and ``manifest.json``; then ``metrics/hpo.json`` (:func:`metrics`).
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


def write(
    out_dir: Path,
    metrics_file: Path,
    overlay: dict[str, Any],
    trials: dict[str, Any],
    all_params: dict[str, Any],
    data_dir: str | Path,
    study: Any = None,
    files: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write the overlay, the trials, the plots of ``study``, ``files`` (name -> text) and the
    manifest atomically, then the metrics; the overlay."""
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        (tmp / overrides.OVERLAY).write_text(yaml.safe_dump(overlay, sort_keys=False))
        outputs: dict[str, Path] = {"overlay": tmp / overrides.OVERLAY}
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
            extra={"adopted": overlay["adopted"], "reason": overlay["reason"]},
        )
    write_json(metrics_file, metrics(overlay, trials))
    return overlay


def metrics(overlay: dict[str, Any], trials: dict[str, Any]) -> dict[str, Any]:
    """``metrics/hpo.json``: the decision, the trial counts, the best and the baseline values,
    and the trial-epochs the search spent (its cost)."""
    rows = [t for t in trials.get("trials", []) if not t["stale"]]
    states = [t["state"] for t in rows]
    by_number = {t["number"]: t for t in rows}
    best, baseline = by_number.get(trials.get("best")), by_number.get(0)
    return {
        "enabled": bool(trials),
        "adopted": overlay["adopted"],
        "trials": len(rows),
        **{s.lower(): states.count(s) for s in ("COMPLETE", "PRUNED", "FAIL")},
        "trial_epochs": sum(len(t["curve"]) for t in trials.get("trials", [])),
        "best_value": None if best is None else best["value"],
        "baseline_value": None if baseline is None else baseline["value"],
    }
