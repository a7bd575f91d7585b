"""A Katib ``Experiment`` (``kubeflow.org/v1beta1``) rendered for a search on a cluster.

Library layer: the caller gives the search (objective, algorithm, early stopping, counts, the
``parameters`` in Katib's form: name, parameterType, feasibleSpace with string values) and one
trial's workload: a PaddleJob as the project renders it (``pipelines/paddlejob/spec.py``) or a
``batch/v1`` Job. :func:`render` makes it the trial template:

* its ``metadata.name``/``namespace`` go (Katib names each trial);
* the primary container (``paddle`` in a PaddleJob, the webhook's name; ``trial`` in a Job)
  gets ``--set=<params key>=${trialParameters.<name>}`` appended to its args, one per
  parameter: the train CLI's own override, so a trial runs the same command as a local one;
* PaddleJob is not among Katib's Kubeflow job kinds, so Katib sets no defaults for it: the
  success/failure conditions (the operator's ``Succeeded``/``Failed`` conditions) and the
  primary pod labels (worker 0: there is no Master replica in collective mode, and rank 0
  prints the metrics) are set here; a Job's (``Complete``/``Failed``) are set explicitly too;
* the metrics collector reads the primary container's stdout (``StdOut``) with Katib's
  default filter ``name=value`` (``pkg/metricscollector/v1beta1/common/const.go``).

Katib wraps the primary container's command and args into ``sh -c "<joined by spaces>"``: an
argument, or a categorical value, holding whitespace, a quote or a shell operator is refused.
The cluster's katib-config must list ``PaddleJob.v1.kubeflow.org`` among its trial resources.
Check the result with ``components.kube.check.check_manifests``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from components.core.artifacts import StepError

GROUP, VERSION, KIND, PLURAL = "kubeflow.org", "v1beta1", "Experiment", "experiments"
API_VERSION = f"{GROUP}/{VERSION}"
# pkg/metricscollector/v1beta1/common/const.go DefaultFilter (Go's \w is ASCII)
DEFAULT_FILTER = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"
ALGORITHMS = ("tpe", "random", "hyperband")
# gjson conditions on the trial's status (pkg/apis/controller/experiments/v1beta1 examples)
_CONDITION = 'status.conditions.#(type=="{}")#|#(status=="True")#'
PADDLEJOB_PRIMARY_LABELS = {  # the operator's labels of worker 0's pod
    "training.kubeflow.org/replica-type": "worker",
    "training.kubeflow.org/replica-index": "0",
}
# what a trial container's arguments may hold, once Katib joins them into sh -c "..."
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_./=:@%+,${}()\[\]-]*")
_TRIAL_NAME = re.compile(r"[^A-Za-z0-9]+")


@dataclass(frozen=True)
class Objective:
    """What the search optimises: a metric the trial prints as ``name=value``."""

    metric: str
    direction: Literal["maximize", "minimize"] = "maximize"
    goal: float | None = None  # the search stops once a trial reaches it
    additional_metrics: tuple[str, ...] = ()


@dataclass(frozen=True)
class Algorithm:
    """The suggestion service (tpe, random or hyperband) and its settings (strings)."""

    name: str = "tpe"
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EarlyStopping:
    """Katib's median stopping rule (``medianstop``): a trial whose objective is worse than
    the median of finished trials at the same step is stopped."""

    min_trials_required: int = 3
    start_step: int = 4


@dataclass(frozen=True)
class Budget:
    """Trials in all, at once, and the failures that fail the experiment."""

    max_trials: int
    parallel: int
    max_failed: int


def _settings(settings: Mapping[str, Any]) -> list[dict[str, str]]:
    return [{"name": str(k), "value": str(v)} for k, v in settings.items()]


def trial_parameter_name(parameter: str) -> str:
    """The trial template's name of a parameter: its letters and digits, '_' between."""
    return _TRIAL_NAME.sub("_", parameter).strip("_") or "p"


def _primary(trial: Mapping[str, Any]) -> tuple[str, list[str], dict[str, Any]]:
    """The primary container's name, the path to its pod spec, and the template settings."""
    kind, api = trial.get("kind"), trial.get("apiVersion")
    if (kind, api) == ("PaddleJob", "kubeflow.org/v1"):
        return (
            "paddle",
            ["spec", "paddleReplicaSpecs", "Worker", "template", "spec"],
            {
                "successCondition": _CONDITION.format("Succeeded"),
                "failureCondition": _CONDITION.format("Failed"),
                "primaryPodLabels": dict(PADDLEJOB_PRIMARY_LABELS),
            },
        )
    if (kind, api) == ("Job", "batch/v1"):
        return (
            "trial",
            ["spec", "template", "spec"],
            {
                "successCondition": _CONDITION.format("Complete"),
                "failureCondition": _CONDITION.format("Failed"),
            },
        )
    raise StepError(
        f"trial template: {api}/{kind}: only a kubeflow.org/v1 PaddleJob or a batch/v1 Job"
    )


def _container(trial: dict[str, Any], path: list[str], name: str) -> dict[str, Any]:
    node: Any = trial
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    for container in (node or {}).get("containers") or []:
        if container.get("name") == name:
            return container
    where = ".".join(path)
    raise StepError(f"trial template: {where}.containers: no container named {name!r}")


def _check_shell_safe(args: Sequence[Any], parameters: Sequence[Mapping[str, Any]]) -> None:
    values = [str(a) for a in args]
    for p in parameters:
        values += [str(v) for v in (p.get("feasibleSpace") or {}).get("list") or []]
    for value in values:
        if not _SHELL_SAFE.fullmatch(value):
            raise StepError(
                f"trial template: {value!r}: Katib runs the trial as sh -c with the arguments "
                "joined by spaces: no whitespace, quotes or shell operators"
            )


def trial_template(
    trial: Mapping[str, Any], parameters: Sequence[Mapping[str, Any]], keys: Mapping[str, str]
) -> dict[str, Any]:
    """The ``trialTemplate`` of ``trial`` (module docstring): ``keys`` maps a parameter's
    name to the dotted params key its ``--set`` overrides (default: the name itself)."""
    spec = copy.deepcopy(dict(trial))
    name, pod_path, settings = _primary(spec)
    meta = spec.get("metadata") or {}
    meta.pop("name", None)
    meta.pop("namespace", None)
    if meta:
        spec["metadata"] = meta
    else:
        spec.pop("metadata", None)
    container = _container(spec, pod_path, name)
    trial_parameters, args = [], list(container.get("args") or [])
    for p in parameters:
        tp = trial_parameter_name(p["name"])
        key = keys.get(p["name"], p["name"])
        trial_parameters.append({"name": tp, "reference": p["name"], "description": key})
        args.append(f"--set={key}=${{trialParameters.{tp}}}")
    if len({t["name"] for t in trial_parameters}) != len(trial_parameters):
        raise StepError(f"trial template: parameter names collide as {trial_parameters}")
    _check_shell_safe(list(container.get("command") or []) + args, parameters)
    container["args"] = args
    return {
        "primaryContainerName": name,
        **settings,
        "trialParameters": trial_parameters,
        "trialSpec": spec,
    }


def render(
    *,
    name: str,
    namespace: str,
    objective: Objective,
    algorithm: Algorithm,
    early_stopping: EarlyStopping | None,
    budget: Budget,
    parameters: Sequence[Mapping[str, Any]],
    trial: Mapping[str, Any],
    keys: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Experiment (module docstring); ``trial`` is a PaddleJob or a batch/v1 Job."""
    if algorithm.name not in ALGORITHMS:
        raise StepError(f"katib: algorithm {algorithm.name!r} is not one of {ALGORITHMS}")
    spec_objective: dict[str, Any] = {
        "type": objective.direction,
        "objectiveMetricName": objective.metric,
        "metricStrategies": [
            {"name": m, "value": "max" if objective.direction == "maximize" else "min"}
            for m in (objective.metric, *objective.additional_metrics)
        ],
    }
    if objective.goal is not None:
        spec_objective["goal"] = float(objective.goal)
    if objective.additional_metrics:
        spec_objective["additionalMetricNames"] = list(objective.additional_metrics)
    spec: dict[str, Any] = {
        "objective": spec_objective,
        "algorithm": {"algorithmName": algorithm.name},
        "maxTrialCount": budget.max_trials,
        "parallelTrialCount": budget.parallel,
        "maxFailedTrialCount": budget.max_failed,
        "resumePolicy": "Never",
        "parameters": [copy.deepcopy(dict(p)) for p in parameters],
        "metricsCollectorSpec": {
            "collector": {"kind": "StdOut"},
            "source": {"filter": {"metricsFormat": [DEFAULT_FILTER]}},
        },
        "trialTemplate": trial_template(trial, parameters, keys or {}),
    }
    if algorithm.settings:
        spec["algorithm"]["algorithmSettings"] = _settings(algorithm.settings)
    if early_stopping is not None:
        spec["earlyStopping"] = {
            "algorithmName": "medianstop",
            "algorithmSettings": _settings(
                {
                    "min_trials_required": early_stopping.min_trials_required,
                    "start_step": early_stopping.start_step,
                }
            ),
        }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
