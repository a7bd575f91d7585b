"""A Katib ``Experiment`` (``kubeflow.org/v1beta1``) rendered for a search on a cluster.

Library layer: the caller gives the search (objective, algorithm, early stopping, counts, the
``parameters`` in Katib's form: name, parameterType, feasibleSpace with string values), the
``trialParameters`` and the trial command's arguments that use them (``--set=key=${trialParameters.
name}``, ``--set-if=...`` for a conditional key: the hpo step builds both from its space), the
metrics collector's filter (the trial's line format: the caller's, so the filter is defined
once, beside the code that prints the lines), and one trial's workload: a ``batch/v1`` Job
(:func:`job_trial`) or a PaddleJob (:func:`paddlejob_trial`, from the template
``k8s/paddlejob/paddlejob.yaml`` the PaddleJob launcher renders). :func:`render` makes it the
trial template:

* its ``metadata.name``/``namespace`` go (Katib names each trial);
* the primary container (``paddle`` in a PaddleJob, the webhook's name; ``trial`` in a Job)
  gets the arguments appended: the train CLI's own overrides, so a trial runs the same command
  as a local one;
* PaddleJob is not among Katib's Kubeflow job kinds, so Katib sets no defaults for it: the
  success/failure conditions (the operator's ``Succeeded``/``Failed`` conditions) and the
  primary pod labels (worker 0: there is no Master replica in collective mode, and rank 0
  prints the metrics) are set here; a Job's (``Complete``/``Failed``) are set explicitly too;
* the metrics collector reads the primary container's stdout (``StdOut``) with the given
  filter (Katib's default ``name=value`` one: ``pkg/metricscollector/v1beta1/common/const.go``).

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
from pathlib import Path
from typing import Any, Literal

from components.core.artifacts import StepError

GROUP, VERSION, KIND, PLURAL = "kubeflow.org", "v1beta1", "Experiment", "experiments"
API_VERSION = f"{GROUP}/{VERSION}"
ALGORITHMS = ("tpe", "random", "hyperband")
# gjson conditions on the trial's status (pkg/apis/controller/experiments/v1beta1 examples)
_CONDITION = 'status.conditions.#(type=="{}")#|#(status=="True")#'
PADDLEJOB_TEMPLATE = Path(__file__).resolve().parents[2] / "k8s" / "paddlejob" / "paddlejob.yaml"
PART_OF = {"app.kubernetes.io/part-of": "paddle-mlops"}
SHARED_VOLUME = "shared"  # the ReadWriteMany claim holding the trials' data view
PADDLEJOB_PRIMARY_LABELS = {  # the operator's labels of worker 0's pod
    "training.kubeflow.org/replica-type": "worker",
    "training.kubeflow.org/replica-index": "0",
}
# what a trial container's arguments may hold, once Katib joins them into sh -c "..."
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_./=:@%+,${}()\[\]-]*")


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
    trial: Mapping[str, Any],
    parameters: Sequence[Mapping[str, Any]],
    trial_parameters: Sequence[Mapping[str, str]],
    args: Sequence[str],
) -> dict[str, Any]:
    """The ``trialTemplate`` of ``trial`` (module docstring): ``args`` (which use
    ``${trialParameters.<name>}`` of ``trial_parameters``) appended to the primary container's."""
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
    names = [t["name"] for t in trial_parameters]
    if len(set(names)) != len(names):
        raise StepError(f"trial template: trial parameter names repeat: {names}")
    full = [*(container.get("args") or []), *args]
    _check_shell_safe(list(container.get("command") or []) + full, parameters)
    container["args"] = full
    return {
        "primaryContainerName": name,
        **settings,
        "trialParameters": [dict(t) for t in trial_parameters],
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
    trial_parameters: Sequence[Mapping[str, str]],
    args: Sequence[str],
    trial: Mapping[str, Any],
    metrics_format: str,
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
            "source": {"filter": {"metricsFormat": [metrics_format]}},
        },
        "trialTemplate": trial_template(trial, parameters, trial_parameters, args),
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


# --------------------------------------------------------------------------- trial workloads


@dataclass(frozen=True)
class Workload:
    """What every trial pod runs and mounts: the image (by digest), the command and its
    fixed arguments (the train CLI; the search's are appended by :func:`render`), cpu and
    memory, the shared volume (claim, mount path) the data view is read from."""

    image: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: Mapping[str, str]
    resources: Mapping[str, Mapping[str, str]]
    pvc: str
    mount_path: str
    deadline_s: int  # activeDeadlineSeconds of one trial


_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
_POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _env(env: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in env.items()]


def job_trial(work: Workload) -> dict[str, Any]:
    """A ``batch/v1`` Job running the trial command once (no retry: a failed trial is
    Katib's to count), hardened like every pod of the project; the shared volume read-only,
    ``/tmp`` (the trial's outputs, which nothing reads) and ``/work`` (HOME) as emptyDirs."""
    container = {
        "name": "trial",
        "image": work.image,
        "command": list(work.command),
        "args": list(work.args),
        "env": _env(work.env),
        "resources": {k: dict(v) for k, v in work.resources.items()},
        "securityContext": copy.deepcopy(_SECURITY),
        "volumeMounts": [
            {"name": SHARED_VOLUME, "mountPath": work.mount_path, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "home", "mountPath": "/work"},
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"labels": dict(PART_OF)},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": work.deadline_s,
            "template": {
                "metadata": {"labels": dict(PART_OF)},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": copy.deepcopy(_POD_SECURITY),
                    "containers": [container],
                    "volumes": [
                        {
                            "name": SHARED_VOLUME,
                            "persistentVolumeClaim": {"claimName": work.pvc, "readOnly": True},
                        },
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "home", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def _named(items: list[dict[str, Any]], name: str, where: str) -> dict[str, Any]:
    for item in items:
        if item.get("name") == name:
            return item
    raise StepError(f"{where}: no entry named {name!r}")


def paddlejob_trial(
    work: Workload, *, nnodes: int, template: Mapping[str, Any], source: str
) -> dict[str, Any]:
    """A PaddleJob of ``nnodes`` Worker replicas (collective mode, as the PaddleJob launcher
    runs training) from ``template`` (``k8s/paddlejob/paddlejob.yaml``): its hardened pod,
    with the image, the trial command, resources, the claim and its mount set, restart
    ``Never`` (a restarted rank hangs the job) and a runPolicy that leaves nothing behind."""
    doc = copy.deepcopy(dict(template))
    if (doc.get("apiVersion"), doc.get("kind")) != ("kubeflow.org/v1", "PaddleJob"):
        raise StepError(f"{source}: not a kubeflow.org/v1 PaddleJob")
    doc["metadata"] = {"labels": dict((doc.get("metadata") or {}).get("labels") or PART_OF)}
    spec = doc["spec"]
    spec["runPolicy"] = {
        "cleanPodPolicy": "All",
        "backoffLimit": 0,
        "activeDeadlineSeconds": work.deadline_s,
        "ttlSecondsAfterFinished": 3600,
    }
    worker = (spec.get("paddleReplicaSpecs") or {}).get("Worker")
    if not isinstance(worker, dict):
        raise StepError(f"{source}: spec.paddleReplicaSpecs.Worker: missing")
    worker["replicas"] = nnodes
    worker["restartPolicy"] = "Never"
    pod = worker["template"]["spec"]
    where = f"{source}: spec.paddleReplicaSpecs.Worker.template.spec"
    container = _named(pod.get("containers") or [], "paddle", f"{where}.containers")
    container["image"] = work.image
    container["command"] = list(work.command)
    container["args"] = list(work.args)
    kept = [e for e in container.get("env") or [] if e.get("name") not in work.env]
    container["env"] = kept + _env(work.env)
    container["resources"] = {k: dict(v) for k, v in work.resources.items()}
    mount = _named(container.get("volumeMounts") or [], SHARED_VOLUME, f"{where}.volumeMounts")
    mount["mountPath"] = work.mount_path
    volume = _named(pod.get("volumes") or [], SHARED_VOLUME, f"{where}.volumes")
    volume["persistentVolumeClaim"] = {"claimName": work.pvc}
    return doc


def load_paddlejob_template(path: str | Path | None = None) -> dict[str, Any]:
    """The PaddleJob template (default: the repository's, as the launcher reads it)."""
    import yaml

    file = Path(path) if path else PADDLEJOB_TEMPLATE
    try:
        doc = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise StepError(f"{file}: cannot read the PaddleJob template: {exc}") from None
    if not isinstance(doc, dict):
        raise StepError(f"{file}: not a YAML mapping")
    return doc
