"""Katib Experiments (components.kube.katib): rendered for a PaddleJob and a Job trial, they pass
the vendored Experiment schema (Katib's OpenAPI, strict), the port of Katib's webhook and, for
the trialSpec, the PaddleJob CRD / Kubernetes schema and the hardening policy; each broken
Experiment gives one clear problem; an edited vendored Katib file is refused."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest

from components.core.artifacts import StepError
from components.kube import crds, katib
from components.kube.check import check_manifests, manifest_problems
from pipelines.paddlejob import spec as paddlejob_spec
from tests.conftest import REPO

IMAGE = "registry.example.com/paddle-mlops/components@sha256:" + "ab" * 32
PARAMETERS = [
    {
        "name": "train.learning_rate",
        "parameterType": "double",
        "feasibleSpace": {"min": "0.0001", "max": "0.01", "distribution": "logUniform"},
    },
    {
        "name": "train.batch_size",
        "parameterType": "categorical",
        "feasibleSpace": {"list": ["16", "32", "64"]},
    },
    {"name": "task.options.augment_shift", "parameterType": "int",
     "feasibleSpace": {"min": "0", "max": "4"}},
]  # fmt: skip
RESOURCES = {"cpu_request": "1", "cpu_limit": "2", "memory_request": "1Gi", "memory_limit": "4Gi"}


def _paddlejob() -> dict:
    """The PaddleJob the launcher renders from k8s/paddlejob/paddlejob.yaml."""
    params = paddlejob_spec.typed({})
    template = paddlejob_spec.load_template(REPO / "k8s" / "paddlejob" / "paddlejob.yaml")
    return paddlejob_spec.render(
        template,
        name="paddle-mlops-train-0123456789ab",
        params=params,
        topo=paddlejob_spec.Topology(nnodes=2, nproc=1),
        image=IMAGE,
        run_dir=Path("/mnt/shared/paddlejob-runs/${trialSpec.Name}"),
        worker_resources=RESOURCES,
        run="run-1",
    )


def _job() -> dict:
    security = {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {
        "name": "trial",
        "image": IMAGE,
        "command": ["python", "-m", "components", "train"],
        "args": ["--params=/data/params.yaml", "--data=/data/snapshot"],
        "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"cpu": "2", "memory": "4Gi"},
        },
        "securityContext": security,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "ignored", "labels": {"app.kubernetes.io/part-of": "paddle-mlops"}},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }


def _experiment(trial: dict | None = None, **overrides) -> dict:
    kwargs = {
        "name": "hpo-digits",
        "namespace": "paddle-mlops",
        "objective": katib.Objective("val_accuracy", "maximize", goal=0.99),
        "algorithm": katib.Algorithm("tpe", {"random_state": 7}),
        "early_stopping": katib.EarlyStopping(min_trials_required=3, start_step=2),
        "budget": katib.Budget(max_trials=16, parallel=2, max_failed=4),
        "parameters": PARAMETERS,
        "trial": trial if trial is not None else _paddlejob(),
    }
    return katib.render(**{**kwargs, **overrides})


def _one_problem(doc: dict) -> str:
    problems = manifest_problems([doc])
    assert len(problems) == 1, problems
    with pytest.raises(StepError, match=re.escape(problems[0])):
        check_manifests([doc])
    return problems[0]


def test_a_digits_experiment_with_paddlejob_trials_passes_the_strict_checks():
    doc = _experiment()
    check_manifests([doc], require_digest=True)
    template = doc["spec"]["trialTemplate"]
    assert template["primaryContainerName"] == "paddle"
    assert template["primaryPodLabels"] == katib.PADDLEJOB_PRIMARY_LABELS
    assert (
        template["successCondition"] == 'status.conditions.#(type=="Succeeded")#|#(status=="True")#'
    )
    assert "name" not in template["trialSpec"]["metadata"]
    assert "namespace" not in template["trialSpec"]["metadata"]
    worker = template["trialSpec"]["spec"]["paddleReplicaSpecs"]["Worker"]
    args = worker["template"]["spec"]["containers"][0]["args"]
    assert args[-3:] == [
        "--set=train.learning_rate=${trialParameters.train_learning_rate}",
        "--set=train.batch_size=${trialParameters.train_batch_size}",
        "--set=task.options.augment_shift=${trialParameters.task_options_augment_shift}",
    ]
    assert [t["reference"] for t in template["trialParameters"]] == [p["name"] for p in PARAMETERS]
    collector = doc["spec"]["metricsCollectorSpec"]
    assert collector["collector"] == {"kind": "StdOut"}
    assert collector["source"]["filter"]["metricsFormat"] == [katib.DEFAULT_FILTER]
    # the filter reads what a trial prints, as Katib's Go regexp does (ASCII \w)
    line = "2026-12-06T09:10:00.123456Z epoch=3 val_accuracy=0.912345 val_loss=3e-1"
    found = re.findall(katib.DEFAULT_FILTER, line, re.ASCII)
    assert [(m[0], float(m[1])) for m in found] == [
        ("epoch", 3.0),
        ("val_accuracy", 0.912345),
        ("val_loss", 0.3),
    ]
    assert doc["spec"]["earlyStopping"]["algorithmName"] == "medianstop"
    assert doc["spec"]["objective"]["metricStrategies"] == [
        {"name": "val_accuracy", "value": "max"}
    ]


def test_an_experiment_with_job_trials_passes_and_minimises():
    doc = _experiment(
        _job(),
        name="hpo-segmentation",
        objective=katib.Objective("val_loss", "minimize"),
        algorithm=katib.Algorithm("random"),
        early_stopping=None,
    )
    check_manifests([doc], require_digest=True)
    template = doc["spec"]["trialTemplate"]
    assert template["primaryContainerName"] == "trial"
    assert "primaryPodLabels" not in template
    assert (
        template["successCondition"] == 'status.conditions.#(type=="Complete")#|#(status=="True")#'
    )
    assert doc["spec"]["objective"]["metricStrategies"] == [{"name": "val_loss", "value": "min"}]
    assert "goal" not in doc["spec"]["objective"] and "earlyStopping" not in doc["spec"]


def test_the_trial_spec_is_checked_as_its_own_manifest():
    """The sample trial (placeholders replaced by typed samples) goes through the PaddleJob
    CRD, its webhook and the policy: a root container is refused there."""
    doc = _experiment()
    pod = doc["spec"]["trialTemplate"]["trialSpec"]["spec"]["paddleReplicaSpecs"]["Worker"]
    pod["template"]["spec"]["securityContext"]["runAsNonRoot"] = False
    assert _one_problem(doc) == (
        "Experiment/hpo-digits: spec.trialTemplate.trialSpec: PaddleJob/hpo-digits-trial000: "
        "spec.paddleReplicaSpecs.Worker.template.spec.containers[paddle].securityContext."
        "runAsNonRoot: must be true (on the container or its pod)"
    )


def _edit(doc: dict, edit) -> dict:
    doc = copy.deepcopy(doc)
    edit(doc["spec"])
    return doc


def test_each_broken_experiment_gives_one_clear_problem():
    doc = _experiment()
    where = "Experiment/hpo-digits: "
    unknown = _edit(doc, lambda s: s["objective"].update(goals=1.0))
    assert _one_problem(unknown) == (
        where + "spec.objective: Additional properties are not allowed ('goals' was unexpected)"
    )
    bad_type = _edit(doc, lambda s: s["parameters"][0].update(parameterType="float"))
    assert _one_problem(bad_type) == (
        where + "spec.parameters[train.learning_rate].parameterType: 'float' is not one of "
        "('int', 'double', 'categorical', 'discrete', 'unknown')"
    )
    min_max = _edit(doc, lambda s: s["parameters"][2]["feasibleSpace"].update(min="5"))
    assert _one_problem(min_max) == (
        where + "spec.parameters[task.options.augment_shift].feasibleSpace: min 5 is greater "
        "than max 4"
    )

    def unused(spec: dict) -> None:
        worker = spec["trialTemplate"]["trialSpec"]["spec"]["paddleReplicaSpecs"]["Worker"]
        worker["template"]["spec"]["containers"][0]["args"].pop()

    assert _one_problem(_edit(doc, unused)) == (
        where + "spec.trialTemplate.trialParameters[task_options_augment_shift]: unused: "
        "${trialParameters.task_options_augment_shift} is not in the trialSpec"
    )

    def undeclared(spec: dict) -> None:
        worker = spec["trialTemplate"]["trialSpec"]["spec"]["paddleReplicaSpecs"]["Worker"]
        worker["template"]["spec"]["containers"][0]["args"].append(
            "--set=train.epochs=${trialParameters.epochs}"
        )

    assert _one_problem(_edit(doc, undeclared)) == (
        where + "spec.trialTemplate.trialSpec: ${trialParameters.epochs} not declared in "
        "spec.trialTemplate.trialParameters"
    )
    one_group = _edit(
        doc,
        lambda s: s["metricsCollectorSpec"]["source"]["filter"].update(
            metricsFormat=[r"val_accuracy=([0-9.]+)"]
        ),
    )
    assert _one_problem(one_group) == (
        where + "spec.metricsCollectorSpec.source.filter.metricsFormat: 'val_accuracy=([0-9.]+)':"
        " two top subexpressions are required (the metric's name, then its value)"
    )
    long_name = _experiment(name="hpo-" + "d" * 37)
    assert _one_problem(long_name) == (
        f"Experiment/hpo-{'d' * 37}: metadata.name: 'hpo-{'d' * 37}': lowercase letters, "
        "digits and '-', starting with a letter and ending with a letter or digit, at most 40 "
        "characters (Katib)"
    )


def test_render_refuses_what_katib_could_not_run():
    with pytest.raises(StepError, match="algorithm 'grid' is not one of"):
        _experiment(algorithm=katib.Algorithm("grid"))
    spaced = copy.deepcopy(PARAMETERS)
    spaced[1]["feasibleSpace"]["list"] = ["16 32"]
    with pytest.raises(StepError, match="'16 32': Katib runs the trial as sh -c"):
        _experiment(parameters=spaced)
    job = _job()
    job["spec"]["template"]["spec"]["containers"][0]["name"] = "main"
    with pytest.raises(StepError, match="no container named 'trial'"):
        _experiment(job)


def test_the_katib_files_are_vendored_and_an_edited_copy_is_refused(tmp_path, monkeypatch):
    rows = {r["file"]: r for r in crds.sources()}
    swagger = rows["kubeflow.org_katib_v1beta1_swagger.json"]
    assert swagger["openapi_for"] == "kubeflow.org/v1beta1/Experiment"
    assert rows["kubeflow.org_experiments.yaml"]["commit"] == swagger["commit"]
    assert crds.kinds()[("kubeflow.org", "Experiment")] == (
        "kubeflow.org_experiments.yaml",
        "v1beta1",
    )
    edited = tmp_path / "crds"
    shutil.copytree(crds.CRD_DIR, edited)
    target = edited / "kubeflow.org_katib_v1beta1_swagger.json"
    target.write_bytes(target.read_bytes().replace(b'"int32"', b'"int64"', 1))
    monkeypatch.setattr(crds, "CRD_DIR", edited)
    crds._crd.cache_clear()
    crds._openapi.cache_clear()
    try:
        with pytest.raises(
            StepError,
            match=r"kubeflow.org_katib_v1beta1_swagger.json: sha256 .* is not the vendored "
            r".*katib v0.19.0 api/openapi-spec/swagger.json",
        ):
            crds.schema.__wrapped__("kubeflow.org", "Experiment")
    finally:
        crds._crd.cache_clear()
        crds._openapi.cache_clear()
