"""hpo: search the task's hyperparameters on the train and val splits, and hand the winner to
train as a params overlay, adopted only on evidence (docs/hpo.md).

- **Off by default** (``hpo.enabled: false``): the step writes an overlay that sets nothing,
  and ``train`` trains on the params as they are.
- **Space** (``hpo.space``, else the task's ``Task.search_space()``): dotted keys of the
  ``task`` and ``train`` sections with float/int (linear or log), categorical and conditional
  specs (:mod:`components.ml.training.search_space`); a key the params do not have is one
  error line naming the closest one.
- **Trials** are the train step's own command on a view of the snapshot that holds only its
  train and val splits (test and the pinned holdout are never read), with the sample as
  ``--set`` arguments and ``train.epochs`` = ``hpo.trial_epochs``. The objective is the
  task's validation score (``val_<score>``), printed by the trial once per epoch in the line
  format Katib's metrics collector reads (:mod:`components.ml.training.trial_metrics`).
- **Engines.** ``optuna`` (the default): a study in a journal file under ``--study`` (a killed
  search resumes), TPE and a median or successive-halving pruner, trials as processes here
  (:mod:`components.ml.training.search`). ``katib``: the same space, objective, budget and
  trial command rendered as a Katib ``Experiment`` (``experiment.yaml``), checked against
  the vendored CRD, submitted and waited for by :mod:`components.kube.katib_run`
  (docs/hpo-katib.md; no cluster configured: the CLI exits 4 after writing it).
- **Adoption** (:mod:`components.ml.decisions.adoption`): the winner and the current params
  are trained ``hpo.adopt.seeds`` times each with paired seeds, for the full
  ``train.epochs``; the overlay sets the winner's keys only when the paired gain beats the
  noise between seeds. Else it sets nothing, and the step says why in one line (also in
  ``decision.yaml``). The model trained on an adopted overlay must still beat the champion in
  ``register``.

Outputs under ``--out``: ``overlay.yaml``, what train applies and nothing else (adopted:
``adopted``, ``params``, ``engine``, ``study``, ``trial``, ``objective``; not adopted or off:
exactly ``{adopted: false, params: {}}``, so a search that adopts nothing leaves train's
dependency byte for byte as it was); ``decision.yaml``, the decision (``adopted``, ``reason``,
``engine``, ``study``, ``trial``, ``objective``, ``winner_params``, ``evidence``);
``trials.json``, the Optuna plots and ``manifest.json``. Under ``--study``: the study journal
and the adoption runs' scores. And ``metrics/hpo.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shutil
import sys
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field

from components.core import overrides
from components.core.artifacts import (
    StepError,
    write_text,
)
from components.core.config import params_model, params_sha256
from components.faults import failpoints
from components.kernel import step as kernel
from components.kernel.cli import step_main
from components.kernel.step import DATA, VALIDATED, Out, Step
from components.kube import katib_run, katib_search
from components.kube.check import check_manifests
from components.kube.katib_search import KatibParams
from components.ml.data import snapshot
from components.ml.decisions import adoption
from components.ml.decisions.adoption import AdoptParams
from components.ml.training import search, search_outputs, search_space
from components.ml.training.search import BudgetParams, PrunerParams, SamplerParams
from components.tasks import Task

log = logging.getLogger(__name__)
TRIAL_SPLITS = ("train", "val")  # all a trial's data view holds
VIEW, SCRATCH, PARAMS = "view", "trials", "params.yaml"
# the adoption runs' scores (search.score_runs), kept with the study: a rerun that only
# changes the rule (hpo.adopt.min_gain, say) or was killed mid-adoption trains nothing again
ADOPTION_RUNS = "adoption_runs.jsonl"
OFF = "hpo.enabled is false"  # the decision's reason when the step is off


@params_model
class HpoParams:
    enabled: bool = False
    engine: Literal["optuna", "katib"] = "optuna"
    trial_epochs: Annotated[int, Field(ge=1)] | None = 8  # None: train.epochs
    budget: BudgetParams = field(default_factory=BudgetParams)
    sampler: SamplerParams = field(default_factory=SamplerParams)
    pruner: PrunerParams = field(default_factory=PrunerParams)
    adopt: AdoptParams = field(default_factory=AdoptParams)
    space: dict[str, Any] | None = None  # None: the task's Task.search_space()
    katib: KatibParams = field(default_factory=KatibParams)  # engine: katib


def run(
    params: HpoParams,
    task: Task,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    study_dir: str | Path,
    metrics_file: str | Path,
    all_params: dict[str, Any],
    params_file: str,
) -> dict[str, Any]:
    """Search (or not: ``enabled: false``) and write the overlay and the decision; the
    decision's mapping."""
    out_dir, study_dir = Path(out_dir), Path(study_dir)
    study_dir.mkdir(parents=True, exist_ok=True)  # an output even when there is no study
    if not params.enabled:
        off = _decision(adoption.Adoption(False, OFF), None, None, None, {}, None)
        return search_outputs.write(out_dir, Path(metrics_file), off, {}, all_params, data_dir)
    space = search_space.parse_space(_space(params, task), source=params_file)
    search_space.validate(space, all_params, source=params_file)
    _typed_check(space, all_params, params_file)
    objective = task.objective()
    metric = f"val_{objective.score}"
    direction: Literal["maximize", "minimize"] = (
        "maximize" if objective.higher_is_better else "minimize"
    )
    trials = Trials(study_dir, Path(data_dir), all_params, params.budget)
    epochs = params.trial_epochs or int(all_params["train"]["epochs"])
    engine = _katib if params.engine == "katib" else _optuna
    return engine(
        params, space, (metric, direction), trials, epochs, all_params, data_dir, out_dir,
        Path(metrics_file),
    )  # fmt: skip


def _optuna(
    params: HpoParams,
    space: search_space.Space,
    objective: tuple[str, Literal["maximize", "minimize"]],
    trials: Trials,
    epochs: int,
    all_params: dict[str, Any],
    data_dir: str | Path,
    out_dir: Path,
    metrics_file: Path,
) -> dict[str, Any]:
    """The search as an Optuna study of trials run here (:mod:`components.ml.training.search`),
    then the adoption."""
    metric, direction = objective
    identity = search_outputs.identity(space, metric, trials.data_sha256, all_params, epochs)
    name = search.study_name(str(all_params["task"]["name"]), identity)
    found = search.run_search(
        trials.root,
        name,
        space,
        all_params,
        metric,
        direction,
        lambda number, sample: trials.argv(f"{number}", {**sample, "train.epochs": epochs}),
        budget=params.budget,
        sampler=params.sampler,
        pruner=params.pruner,
        env=trials.env(),
        after_trial=lambda trial: failpoints.hit("hpo.after_trial", str(trial.number)),
    )
    decision = _adopt(params, space, found, trials, metric, direction, all_params)
    best = found.best
    trial, winner = (None, {}) if best is None else (best.number, best.params)
    decided = _decision(decision, "optuna", found.study, trial, winner, metric)
    trials.cleanup()
    study = search.open_study(trials.root, name, direction, params.sampler, params.pruner)
    return search_outputs.write(
        out_dir, metrics_file, decided, found.to_json(), all_params, data_dir, study
    )


def _space(params: HpoParams, task: Task) -> Any:
    space = params.space if params.space is not None else type(task).search_space()
    if space is None:
        raise StepError(
            f"hpo.space: not set, and task {task.name!r} declares no search space "
            "(Task.search_space)"
        )
    return space


def _typed_check(space: search_space.Space, all_params: dict[str, Any], source: str) -> None:
    """Each key at each end of its range, and at each choice, still makes valid ``train`` and
    ``task`` params (one error line naming the key and value otherwise)."""
    from components.core.config import section
    from components.tasks import task_from_params

    train_params = kernel.load("train").params
    for key, spec in space.items():
        for value in search_space.ends(spec):
            where = f"{source}: hpo.space: {key}={overrides.format_value(value)}"
            sample = overrides.override(all_params, {key: value}, what="hpo.space:")
            section(dict(sample), "train", train_params, source=where)  # type: ignore[arg-type]
            try:
                task_from_params(sample)
            except StepError as exc:
                raise StepError(f"{where}: {exc}") from None


class Trials:
    """The train step's command for a trial, on a train+val view of the snapshot."""

    def __init__(
        self, study_dir: Path, data_dir: Path, all_params: dict[str, Any], budget: BudgetParams
    ) -> None:
        study_dir.mkdir(parents=True, exist_ok=True)
        self.root, self.budget = study_dir, budget
        shutil.rmtree(study_dir / VIEW, ignore_errors=True)
        view = snapshot.subset(data_dir, study_dir / VIEW, TRIAL_SPLITS, copy=False)
        self.view = study_dir / VIEW
        self.data_sha256 = params_sha256(
            {s.path: s.sha256 for s in view.shards}  # the train and val shards only
        )
        self.all_params = all_params
        self.params_file = study_dir / PARAMS
        self.params_file.write_text(yaml.safe_dump(dict(all_params), sort_keys=False))
        self.train = kernel.load("train")

    def argv(self, name: str, sample: dict[str, Any]) -> list[str]:
        """``python -m components train ...`` for ``sample`` in scratch dir ``trials/<name>``."""
        import sys

        scratch = self.root / SCRATCH / name
        shutil.rmtree(scratch, ignore_errors=True)
        paths = {
            "data_dir": self.view,
            "out_dir": scratch / "model",
            "checkpoint_dir": scratch / "checkpoints",
            "metrics_file": scratch / "metrics.json",
            "plots_file": scratch / "curves.csv",
            "hpo_dir": "",  # no overlay: a trial runs the params it is given
        }
        fixed = {"train.reader_probe_samples": 0}
        return [
            sys.executable,
            "-m",
            "components",
            *self.train.argv(self.params_file, paths),
            *overrides.set_args({**fixed, **sample}),
        ]

    def run_key(self, sample: dict[str, Any]) -> str:
        """What a run of ``sample`` trains, hashed: the view's data and the task and train
        params with ``sample`` set (the same key is the same run, whatever it is called)."""
        resolved = overrides.apply(self.all_params, sample)
        return params_sha256(
            {"data": self.data_sha256, **{k: resolved.get(k) for k in ("task", "train")}}
        )

    def env(self) -> dict[str, str]:
        cpus = str(self.budget.cpus_per_trial)
        return {"OMP_NUM_THREADS": cpus, "CPU_NUM": cpus}

    def cleanup(self) -> None:
        shutil.rmtree(self.root / SCRATCH, ignore_errors=True)
        shutil.rmtree(self.view, ignore_errors=True)


def _adopt(
    params: HpoParams,
    space: search_space.Space,
    found: search.SearchResult,
    trials: Trials,
    metric: str,
    direction: Literal["maximize", "minimize"],
    all_params: dict[str, Any],
) -> adoption.Adoption:
    """Train the current params and the winner once per paired seed; the rule's decision."""
    best = found.best
    if best is None:
        return adoption.Adoption(False, "hpo: kept current params: no trial completed")
    current = search_space.current(space, all_params)
    if best.number == 0 or all(overrides.same(best.params.get(k), v) for k, v in current.items()):
        return adoption.baseline_won(best.number, metric)
    seed0 = int(all_params["train"]["seed"])
    seeds = [seed0 + i for i in range(params.adopt.seeds)]
    argvs, names, keys = [], [], []
    for side, sample in (("current", {}), ("winner", best.params)):
        for seed in seeds:
            run = {**sample, "train.seed": seed}
            argvs.append(trials.argv(f"{side}-{seed}", run))
            names.append(f"the {side} params with seed {seed}")
            keys.append(trials.run_key(run))
    scores = search.score_runs(
        argvs,
        metric,
        direction,
        parallel=params.budget.parallel,
        env=trials.env(),
        names=names,
        record=trials.root / ADOPTION_RUNS,
        keys=keys,
    )
    k = len(seeds)
    return adoption.decide(
        scores[:k],
        scores[k:],
        seeds=seeds,
        higher_is_better=direction == "maximize",
        limits=params.adopt,
        metric=metric,
        trial=best.number,
    )


# --------------------------------------------------------------------------- engine: katib


def _katib(
    params: HpoParams,
    space: search_space.Space,
    objective: tuple[str, Literal["maximize", "minimize"]],
    trials: Trials,
    epochs: int,
    all_params: dict[str, Any],
    data_dir: str | Path,
    out_dir: Path,
    metrics_file: Path,
) -> dict[str, Any]:
    """The search as a Katib Experiment (:mod:`components.kube.katib_search`): checked and
    written to ``experiment.yaml`` first (no cluster: :class:`~components.kube.katib_run.
    NoCluster` after that, so it can be applied by hand); the train+val view and params staged
    on the shared volume; submitted and waited for; then the same adoption as the optuna
    engine, whose paired seed runs are processes of this step on the local view."""
    kp = params.katib
    sha = params_sha256(
        search_outputs.identity(space, objective[0], trials.data_sha256, all_params, epochs)
    )
    name = katib_search.experiment_name(str(all_params["task"]["name"]), sha)
    experiment = katib_search.experiment(
        name,
        space,
        objective,
        kp=kp,
        budget=params.budget,
        sampler=params.sampler,
        pruner=params.pruner,
        epochs=epochs,
        distributed=all_params["train"].get("distributed") or {},
    )
    check_manifests([experiment], require_digest=True, what=f"Experiment {name}")
    text = yaml.safe_dump(experiment, sort_keys=False)
    manifest = write_text(out_dir / katib_search.EXPERIMENT, text)  # `kubectl apply -f` it
    log.info("hpo: Katib Experiment %s checked and written to %s", name, manifest)
    api = katib_run.api_client(kp.kube_context, str(manifest))
    katib_search.stage(trials.view, trials.params_file, katib_search.run_dir(kp, name), kp)
    found = katib_run.submit_and_wait(
        experiment,
        search_space.katib_keys(space),
        *objective,
        kp.poll.backoff(deadline_s=kp.poll.deadline_s or params.budget.wall_s),
        api=api,
        timeout_s=kp.api_timeout_s,
    )
    best = search.TrialRecord(found.trial, "COMPLETE", found.params, found.value, curve=())
    result = search.SearchResult(name, objective[0], objective[1], (best,), best)
    decision = _adopt(params, space, result, trials, *objective, all_params)
    record = {**result.to_json(), "engine": "katib", "katib": found.counts}
    trials.cleanup()
    decided = _decision(decision, "katib", name, found.trial, found.params, objective[0])
    return search_outputs.write(
        out_dir, metrics_file, decided, record, all_params, data_dir,
        files={katib_search.EXPERIMENT: text},
    )  # fmt: skip


def _decision(
    decision: adoption.Adoption,
    engine: str | None,
    study: str | None,
    trial: int | str | None,
    winner: dict[str, Any],
    metric: str | None,
) -> dict[str, Any]:
    """``decision.yaml``: adopted or not, the one line why, the search and its winner, the
    evidence (the overlay train reads is made from it: :func:`search_outputs.overlay`)."""
    log.info("%s", decision.reason)
    return {
        "adopted": decision.adopted,
        "reason": decision.reason,
        "engine": engine,
        "study": study,
        "trial": trial,
        "objective": metric,
        "winner_params": dict(winner),
        "evidence": decision.evidence(),
    }


def main(argv: list[str] | None = None) -> int:
    """The step's CLI; ``hpo.engine: katib`` without a cluster exits
    :data:`~components.kube.katib_run.EXIT_NO_CLUSTER` (experiment.yaml written and checked)."""

    @functools.wraps(run)
    def cli_run(**kwargs: Any) -> Any:
        try:
            return run(**kwargs)
        except katib_run.NoCluster as exc:
            sys.stderr.write(f"error: {exc}\n")
            return exc

    return step_main(
        dataclasses.replace(STEP, run=cli_run),
        argv,
        exit_code=lambda got: got.exit_code if isinstance(got, katib_run.NoCluster) else 0,
    )


STEP = Step(
    name="hpo",
    doc=__doc__,
    params=HpoParams,
    sections=("task", "train", "hpo"),
    run=run,
    inputs=(
        DATA,
        VALIDATED,
    ),
    outputs=(
        Out(
            "out",
            "outputs/hpo",
            "out_dir",
            help="overlay.yaml (what train applies), decision.yaml (why), trials.json, plots",
        ),
        Out(
            "study",
            "outputs/hpo_study",
            "study_dir",
            dvc="persist",
            help="the Optuna journal: a killed search resumes from it",
        ),
        Out("metrics", "metrics/hpo.json", "metrics_file", kfp="Metrics", dvc="metrics"),
    ),
)
