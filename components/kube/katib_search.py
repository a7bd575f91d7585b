"""A search as a Katib Experiment: what ``hpo.engine: katib`` renders from the same space,
objective, budget and trial command the local engine runs (docs/hpo-katib.md).

- The sampler maps to Katib's ``tpe``/``random`` (with its seed); the median pruner to the
  ``medianstop`` early stopping; successive halving and none to no early stopping (Katib's
  hyperband is a suggestion algorithm over an epochs parameter, not a pruner).
- The trial is the train step's command (:func:`components.kernel.step.Step.argv`) with the
  cluster's paths, each flag and its value one word (Katib joins the arguments with spaces
  into ``sh -c``), run by a ``batch/v1`` Job, or a PaddleJob for data-parallel trials; the
  data is a train+val view staged on a shared claim, read only by the trial pods.

Kube layer: no step; the caller (the hpo step) checks the result
(:func:`components.kube.check.check_manifests`), writes it, submits it
(:mod:`components.kube.katib_run`) and adopts the winner.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from components.core import overrides
from components.core.artifacts import StepError, atomic_path, write_text
from components.core.config import params_model
from components.core.retry import BackoffParams
from components.kernel import step as kernel
from components.kube import katib
from components.ml.data import snapshot
from components.ml.training import search_space
from components.ml.training.search import BudgetParams, PrunerParams, SamplerParams
from components.ml.training.trial_metrics import KATIB_DEFAULT_FILTER, TRIAL_ENV

log = logging.getLogger(__name__)
EXPERIMENT = "experiment.yaml"
TRIAL_OUT = "/tmp/trial"  # a trial pod's outputs (an emptyDir): nothing reads them
DATA, PARAMS = "data", "params.yaml"  # a search's directory on the shared claim


@params_model
class KatibParams:
    """``hpo.katib``: where and how ``engine: katib`` runs the search (docs/hpo-katib.md)."""

    namespace: str = "paddle-mlops"  # of the Experiment, its trials and the shared claim
    image: str | None = None  # trial image ref@sha256; None: $PADDLE_MLOPS_IMAGE (the KFP DAG's)
    trial_kind: Literal["job", "paddlejob"] = "job"  # paddlejob: data-parallel trials
    pvc: str = "paddle-mlops-shared"  # ReadWriteMany claim: the trials read the data view there
    mount_path: str = "/mnt/shared"  # where this step and every trial pod mount it
    runs_dir: str = "hpo-runs"  # below mount_path: one directory per search (data, params)
    memory: str = "4Gi"  # memory request and limit of a trial pod (cpu: budget.cpus_per_trial)
    trial_timeout_s: Annotated[int, Field(ge=1)] = 7200  # activeDeadlineSeconds of one trial
    paddlejob_template: str | None = None  # None: k8s/paddlejob/paddlejob.yaml
    kube_context: str | None = None  # kubeconfig context (outside a cluster)
    api_timeout_s: Annotated[float, Field(gt=0)] = 30.0  # one API request
    # reads of the Experiment until it ends; deadline_s None: budget.wall_s
    poll: BackoffParams = field(
        default_factory=lambda: BackoffParams(first_s=10.0, max_s=60.0, factor=2.0)
    )


def experiment_name(task: str, sha: str) -> str:
    """``hpo-<task>-<sha12>``: a valid Katib name (<= 40 chars) of one search."""
    return f"hpo-{re.sub(r'[^a-z0-9]+', '-', task.lower()).strip('-')[:22]}-{sha[:12]}"


def run_dir(kp: KatibParams, name: str) -> Path:
    """The search's directory on the shared claim (data view, params)."""
    return Path(kp.mount_path) / kp.runs_dir / name


def _trial_args(directory: Path, epochs: int) -> list[str]:
    """The train step's arguments for a trial pod, each flag and its value one word."""
    paths = {
        "data_dir": directory / DATA,
        "out_dir": f"{TRIAL_OUT}/model",
        "checkpoint_dir": f"{TRIAL_OUT}/checkpoints",
        "metrics_file": f"{TRIAL_OUT}/metrics.json",
        "plots_file": f"{TRIAL_OUT}/curves.csv",
        "hpo_dir": "",  # no overlay: a trial runs the params it is given
    }
    argv = kernel.load("train").argv(directory / PARAMS, paths)
    args = [argv[0], *(f"{f}={v}" for f, v in zip(argv[1::2], argv[2::2], strict=True))]
    return args + overrides.set_args({"train.reader_probe_samples": 0, "train.epochs": epochs})


def _trial(
    kp: KatibParams, budget: BudgetParams, args: list[str], distributed: Mapping[str, Any]
) -> dict[str, Any]:
    """The trial workload: a Job, or a PaddleJob of ``train.distributed.nnodes`` pods."""
    image = kp.image or os.environ.get("PADDLE_MLOPS_IMAGE", "")
    if not image:
        raise StepError(
            "hpo.katib.image: not set and $PADDLE_MLOPS_IMAGE is empty: the trials need the "
            "component image (ref@sha256:...)"
        )
    cpus = str(budget.cpus_per_trial)
    work = katib.Workload(
        image=image,
        command=("python", "-m", "components"),
        args=tuple(args),
        env={TRIAL_ENV: "1", "OMP_NUM_THREADS": cpus, "CPU_NUM": cpus},
        resources={
            "requests": {"cpu": cpus, "memory": kp.memory},
            "limits": {"cpu": cpus, "memory": kp.memory},
        },
        pvc=kp.pvc,
        mount_path=kp.mount_path,
        deadline_s=kp.trial_timeout_s,
    )
    if kp.trial_kind == "job":
        return katib.job_trial(work)
    if distributed.get("backend") != "paddlejob":
        raise StepError(
            "hpo.katib.trial_kind paddlejob: train.distributed.backend is "
            f"{distributed.get('backend')!r}: set it to paddlejob (its nnodes are the trial's pods)"
        )
    return katib.paddlejob_trial(
        work,
        nnodes=int(distributed.get("nnodes", 1)),
        template=katib.load_paddlejob_template(kp.paddlejob_template),
        source=kp.paddlejob_template or str(katib.PADDLEJOB_TEMPLATE),
    )


def experiment(
    name: str,
    space: search_space.Space,
    objective: tuple[str, Literal["maximize", "minimize"]],
    *,
    kp: KatibParams,
    budget: BudgetParams,
    sampler: SamplerParams,
    pruner: PrunerParams,
    epochs: int,
    distributed: Mapping[str, Any],
) -> dict[str, Any]:
    """The Experiment of a search (module docstring)."""
    metric, direction = objective
    stopping = None
    if pruner.name == "median":
        stopping = katib.EarlyStopping(
            min_trials_required=max(1, pruner.n_startup_trials),
            start_step=pruner.n_warmup_steps + 1,
        )
    elif pruner.name == "successive_halving":
        log.info("hpo.katib: no early stopping (Katib has no successive-halving pruner)")
    args = _trial_args(run_dir(kp, name), epochs)
    return katib.render(
        name=name,
        namespace=kp.namespace,
        objective=katib.Objective(metric, direction),
        algorithm=katib.Algorithm(sampler.name, {"random_state": sampler.seed}),
        early_stopping=stopping,
        budget=katib.Budget(
            max_trials=budget.trials,
            parallel=min(budget.parallel, budget.trials),
            max_failed=int(budget.max_fail_fraction * budget.trials),
        ),
        parameters=search_space.katib_parameters(space),
        trial_parameters=search_space.katib_trial_parameters(space),
        args=search_space.katib_args(space),
        trial=_trial(kp, budget, args, distributed),
        metrics_format=KATIB_DEFAULT_FILTER,
    )


def stage(view: Path, params_file: Path, directory: Path, kp: KatibParams) -> None:
    """The train+val ``view`` and the params onto the shared volume, once per search (its
    name is a hash of the data): what every trial pod reads."""
    mount = Path(kp.mount_path)
    if not mount.is_dir():
        raise StepError(
            f"hpo.katib.mount_path {mount}: not a directory; the shared volume (claim "
            f"{kp.pvc}) must be mounted there where the hpo step runs"
        )
    data = directory / DATA
    try:
        if not data.is_dir():
            with atomic_path(data) as tmp:
                snapshot.subset(view, tmp, ("train", "val"), copy=True)
        write_text(directory / PARAMS, params_file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise StepError(f"staging the trials' data into {directory} failed: {exc}") from exc
    log.info("hpo: staged the train+val view and params into %s", directory)
