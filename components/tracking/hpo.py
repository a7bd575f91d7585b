"""The hyperparameter search the ``hpo`` step ran, as MLflow runs under the pipeline's run.

Read from the hpo step's output directory only (``overlay.yaml``, what train applied;
``decision.yaml``, why, with the evidence; ``trials.json``, ``manifest.json`` and the Optuna
plots; formats: ``components/steps/hpo.py`` and
:meth:`components.ml.training.search.SearchResult.to_json`):

- The **pipeline run** always gets the decision as tags (``hpo_adopted``, ``hpo_reason``, from
  ``decision.yaml``) and, when an overlay was adopted, the keys it set as params
  ``overlay.<dotted key>`` (``train`` trained on them, not on the ``params.yaml`` values the
  run's other params show).
- When a search ran (``trials.json`` is there), **one nested run** ``hpo`` for the search: the
  ``hpo`` section and the overlay's keys as params; the trial counts, best and baseline
  values and the adoption evidence (``evidence.current``/``winner``/``diffs`` with
  ``step`` = the seed's position) as metrics; ``adopted``, ``reason``, ``study``, ``trial``,
  ``objective`` and the rule as tags; ``overlay.yaml``, ``decision.yaml``, ``trials.json``,
  ``manifest.json`` and the plots as artifacts. Under it, **a run per trial**
  (``trial-<number>``): its sampled params (dotted keys, as ``--set`` writes them), ``value``
  and the per-epoch objective curve (``<objective>`` with ``step`` = epoch), tags ``trial``,
  ``state`` (COMPLETE, PRUNED, FAIL), ``error``, ``stale`` and ``retry_of``; a FAIL trial's
  run ends FAILED, the others FINISHED. ``trials.json`` records no times per trial: a
  trial's run spans the search's.
- When the search was off (no ``trials.json``) there is no run, only the pipeline run's tags.

Cost: three calls per trial (create, one batch of params, metrics and tags, end) whatever
its curve's length, and a few for the search run. Idempotent: logging again under the same
pipeline run reuses its ``hpo`` run and skips the trials already ended there.

Library layer: imported by the track step, imports no step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from components.core import overrides
from components.core.artifacts import StepError, read_json
from components.tracking.pipeline_run import closed_on_failure
from components.tracking.step_outputs import ended_ms, flatten, numeric_metrics, step_times

log = logging.getLogger(__name__)

SEARCH_RUN = "hpo"  # the search run's name and ``step`` tag
ADOPTED_TAG, REASON_TAG = "hpo_adopted", "hpo_reason"  # on the pipeline run
OVERLAY_PARAM = "overlay."  # prefix of the adopted keys as params
TRIAL_TAG, STATE_TAG = "trial", "state"
TRIALS, MANIFEST = "trials.json", "manifest.json"
PLOTS = ("parallel_coordinate.png", "param_importances.png")
# a trial's journal state -> its run's end status (RUNNING/WAITING: a search that stopped)
STATUS = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED"}
_TEXT = 5000  # the longest tag or param value logged


@dataclass(frozen=True)
class Search:
    """What the hpo step left: its decision, the keys its overlay set, its trials (None: no
    search ran), its manifest."""

    dir: Path
    decision: dict[str, Any]
    adopted_params: dict[str, Any]
    trials: dict[str, Any] | None
    manifest: dict[str, Any]

    def files(self) -> list[Path]:
        """The search run's artifacts that exist."""
        names = (overrides.OVERLAY, overrides.DECISION, TRIALS, MANIFEST, *PLOTS)
        return [self.dir / n for n in names if (self.dir / n).is_file()]


def read_search(hpo_dir: str | Path) -> Search:
    """The hpo step's output directory; a malformed file is one error line naming the file
    and the field."""
    hpo_dir = Path(hpo_dir)
    adopted = overrides.read_overlay(hpo_dir)  # checks adopted and params
    overlay = yaml.safe_load((hpo_dir / overrides.OVERLAY).read_text(encoding="utf-8"))
    decision = read_decision(hpo_dir / overrides.DECISION, overlay["adopted"])
    trials_file = hpo_dir / TRIALS
    trials = read_json(trials_file) if trials_file.exists() else None
    if trials is not None:
        _check_trials(trials_file, trials)
    return Search(hpo_dir, decision, adopted, trials, read_json(hpo_dir / MANIFEST))


def read_decision(file: Path, adopted: bool) -> dict[str, Any]:
    """``decision.yaml``, which must agree with its overlay's ``adopted``; a malformed one is
    one error line naming the file and the field."""
    doc = overrides.read_outcome(file, "the hpo step writes it beside its overlay")
    if doc["adopted"] is not adopted:
        raise StepError(
            f"{file}: adopted: {str(doc['adopted']).lower()}, but {overrides.OVERLAY} beside it "
            f"says {str(adopted).lower()}"
        )
    if not isinstance(doc.get("reason"), str) or not doc["reason"]:
        raise StepError(f"{file}: reason: expected the decision's one line")
    if not isinstance(doc.get("evidence") or {}, dict):
        raise StepError(f"{file}: evidence: expected a mapping")
    return doc


def _check_trials(file: Path, doc: Any) -> None:
    if not isinstance(doc, dict) or not isinstance(doc.get("trials"), list):
        raise StepError(f"{file}: trials: expected a list of trials")
    if not isinstance(doc.get("objective"), str):
        raise StepError(f"{file}: objective: expected the metric's name")
    for i, t in enumerate(doc["trials"]):
        for key, kind in (("number", int), ("state", str), ("params", dict), ("curve", list)):
            if not isinstance(t, dict) or not isinstance(t.get(key), kind):
                raise StepError(f"{file}: trials[{i}].{key}: expected {kind.__name__}")


def decision_tags(search: Search) -> dict[str, str]:
    """The pipeline run's tags: whether an overlay was adopted, and the one line why."""
    return {
        ADOPTED_TAG: str(bool(search.decision["adopted"])).lower(),
        REASON_TAG: search.decision["reason"][:_TEXT],
    }


def overlay_params(search: Search) -> dict[str, str]:
    """The adopted keys as params ``overlay.<key>`` (none when nothing was adopted)."""
    return {
        f"{OVERLAY_PARAM}{k}": overrides.format_value(v)[:_TEXT]
        for k, v in search.adopted_params.items()
    }


def search_summary(trials: Mapping[str, Any]) -> dict[str, float]:
    """The search run's metrics from ``trials.json``: the trials that count (stale ones do
    not), by state, the trial-epochs spent, the best and the baseline (trial 0) values."""
    rows = [t for t in trials["trials"] if not t.get("stale")]
    states = [t["state"] for t in rows]
    by_number = {t["number"]: t for t in rows}
    best, baseline = by_number.get(trials.get("best")), by_number.get(0)
    summary: dict[str, float] = {
        "trials": len(rows),
        **{s.lower(): states.count(s) for s in ("COMPLETE", "PRUNED", "FAIL")},
        "trial_epochs": sum(len(t["curve"]) for t in trials["trials"]),
    }
    for name, row in (("best_value", best), ("baseline_value", baseline)):
        if row is not None and row.get("value") is not None:
            summary[name] = float(row["value"])
    return summary


def log_search(
    client: Any,
    experiment_id: str,
    parent_id: str,
    hpo_dir: str | Path,
    tags: Mapping[str, str],
    section_params: Mapping[str, Any] | None = None,
) -> str | None:
    """Log the search of ``hpo_dir`` under pipeline run ``parent_id`` (the module's doc):
    the decision on the pipeline run, and when a search ran, its run and a run per trial.
    ``tags`` are the pipeline run's, copied to the new runs. Returns the search run's id
    (None: no search ran)."""
    from mlflow.entities import Param, RunTag

    search = read_search(hpo_dir)
    client.log_batch(
        parent_id,
        params=[Param(k, v) for k, v in overlay_params(search).items()],
        tags=[RunTag(k, v) for k, v in decision_tags(search).items()],
    )
    if search.trials is None:
        log.info("hpo: no search ran (%s): no search run", search.decision["reason"])
        return None
    span = step_times(search.manifest)
    ended = span[1] if span else ended_ms(search.manifest)
    started = span[0] if span else ended
    found = client.search_runs(
        [experiment_id],
        f"tags.mlflow.parentRunId = '{parent_id}' AND tags.step = '{SEARCH_RUN}'",
        max_results=1,
    )
    if found and found[0].info.status == "FINISHED":
        return found[0].info.run_id  # logged already
    if found:  # a logger that died part way: go on where it stopped
        run_id = found[0].info.run_id
    else:
        run_tags = {**tags, "step": SEARCH_RUN, "mlflow.parentRunId": parent_id}
        run_id = client.create_run(
            experiment_id, start_time=started, tags=run_tags, run_name=SEARCH_RUN
        ).info.run_id
    with closed_on_failure(client, run_id):
        if not found or not found[0].data.metrics:
            _log_search_run(client, run_id, search, section_params or {}, ended)
        for file in search.files():
            client.log_artifact(run_id, str(file))
        done = _ended_trials(client, experiment_id, run_id)
        objective = search.trials["objective"]
        for trial in search.trials["trials"]:
            if trial["number"] not in done:
                _log_trial(client, experiment_id, run_id, trial, objective, tags, (started, ended))
        client.set_terminated(run_id, "FINISHED", end_time=ended)
    log.info(
        "hpo: search run %s with %d trial runs (%s)",
        run_id,
        len(search.trials["trials"]),
        search.decision["reason"],
    )
    return run_id


def _log_search_run(
    client: Any,
    run_id: str,
    search: Search,
    section_params: Mapping[str, Any],
    ended: int | None,
) -> None:
    """The search run's params, metrics and tags, in one batch."""
    from mlflow.entities import Metric, Param, RunTag

    decision, trials = search.decision, search.trials or {}
    stamp = ended or int(time.time() * 1000)
    params = {k: str(v)[:_TEXT] for k, v in flatten(section_params)}
    params |= overlay_params(search)
    evidence = decision.get("evidence") or {}
    metrics = [
        Metric(k, v, stamp, 0)
        for k, v in {
            **search_summary(trials),
            **numeric_metrics(
                {k: v for k, v in evidence.items() if not isinstance(v, list)}, "evidence."
            ),
        }.items()
    ]
    for key in ("current", "winner", "diffs"):  # per seed, in the seeds' order
        values = evidence.get(key) or []
        metrics += [Metric(f"evidence.{key}", float(v), stamp, i) for i, v in enumerate(values)]
    if evidence.get("seeds"):
        params["evidence.seeds"] = overrides.format_value(list(evidence["seeds"]))
    tag_values = {
        "adopted": str(bool(decision["adopted"])).lower(),
        "reason": decision["reason"],
        "study": decision.get("study"),
        "trial": decision.get("trial"),
        "engine": decision.get("engine"),
        "objective": decision.get("objective") or trials.get("objective"),
        "direction": trials.get("direction"),
        "rule": evidence.get("rule"),
    }
    client.log_batch(
        run_id,
        metrics=metrics,
        params=[Param(k, v) for k, v in params.items()],
        tags=[RunTag(k, str(v)[:_TEXT]) for k, v in tag_values.items() if v not in (None, "")],
    )


def _ended_trials(client: Any, experiment_id: str, search_id: str) -> set[int]:
    """The trial numbers with an ended run under ``search_id``; a run a killed logger left
    RUNNING is deleted (it is logged again whole)."""
    done: set[int] = set()
    page_token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            f"tags.mlflow.parentRunId = '{search_id}'",
            max_results=1000,
            page_token=page_token,
        )
        for run in page:
            if run.info.status == "RUNNING":
                client.delete_run(run.info.run_id)
            elif TRIAL_TAG in run.data.tags:
                done.add(int(run.data.tags[TRIAL_TAG]))
        page_token = page.token
        if not page_token:
            return done


def _log_trial(
    client: Any,
    experiment_id: str,
    search_id: str,
    trial: Mapping[str, Any],
    objective: str,
    tags: Mapping[str, str],
    span: tuple[int | None, int | None],
) -> str:
    """A trial's run: create (with its tags), one batch (params, value, curve), end."""
    from mlflow.entities import Metric, Param

    started, ended = span
    stamp = ended or int(time.time() * 1000)
    trial_tags = {
        **tags,
        "mlflow.parentRunId": search_id,
        TRIAL_TAG: str(trial["number"]),
        STATE_TAG: trial["state"],
        "stale": str(bool(trial.get("stale"))).lower(),
    }
    if trial.get("error"):
        trial_tags["error"] = str(trial["error"])[:_TEXT]
    if trial.get("retry_of") is not None:
        trial_tags["retry_of"] = str(trial["retry_of"])
    run_id = client.create_run(
        experiment_id,
        start_time=started,
        tags=trial_tags,
        run_name=f"trial-{trial['number']}",
    ).info.run_id
    metrics = [Metric(objective, float(v), stamp, int(epoch)) for epoch, v in trial["curve"]]
    if trial.get("value") is not None:
        metrics.append(Metric("value", float(trial["value"]), stamp, 0))
    client.log_batch(
        run_id,
        params=[Param(k, overrides.format_value(v)[:_TEXT]) for k, v in trial["params"].items()],
        metrics=metrics,
    )
    client.set_terminated(run_id, STATUS.get(trial["state"], "KILLED"), end_time=ended)
    return run_id
