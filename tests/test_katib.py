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
from components.ml.training.trial_metrics import KATIB_DEFAULT_FILTER
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


TRIAL_PARAMETERS = [
    {"name": t, "reference": p["name"], "description": p["name"]}
    for t, p in zip(
        ("train_learning_rate", "train_batch_size", "task_options_augment_shift"),
        PARAMETERS,
        strict=True,
    )
]
ARGS = [
    f"--set={p['name']}=${{trialParameters.{t['name']}}}"
    for p, t in zip(PARAMETERS, TRIAL_PARAMETERS, strict=True)
]  # noqa: E501


def _experiment(trial: dict | None = None, **overrides) -> dict:
    kwargs = {
        "trial_parameters": TRIAL_PARAMETERS,
        "args": ARGS,
        "metrics_format": KATIB_DEFAULT_FILTER,
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
    assert collector["source"]["filter"]["metricsFormat"] == [KATIB_DEFAULT_FILTER]
    # the filter reads what a trial prints, as Katib's Go regexp does (ASCII \w)
    line = "2026-12-06T09:10:00.123456Z epoch=3 val_accuracy=0.912345 val_loss=3e-1"
    found = re.findall(KATIB_DEFAULT_FILTER, line, re.ASCII)
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
    with pytest.raises(StepError, match="'--set=train.seed=1;rm': Katib runs the trial as sh -c"):
        _experiment(args=[*ARGS, "--set=train.seed=1;rm"])
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


# --------------------------------------------------------------------------- the hpo step's


def _step_experiment(params_file: str, **katib_params) -> tuple[dict, dict]:
    """The Experiment the hpo step renders for ``params_file`` (its space, objective,
    budget, trial command), and the space's Katib name -> dotted key."""
    from components.core.config import load_params, section
    from components.core.overrides import override
    from components.kube import katib_search
    from components.ml.training import search_space
    from components.steps import hpo

    params = load_params(REPO / params_file)
    sets = {f"hpo.katib.{k}": v for k, v in katib_params.items() if k != "train"}
    params = override(params, {**sets, **katib_params.get("train", {})})
    hp = section(dict(params), "hpo", hpo.HpoParams)
    space = search_space.parse_space(params["hpo"]["space"], source=params_file)
    doc = katib_search.experiment(
        "hpo-test-0123456789ab",
        space,
        ("val_accuracy", "maximize"),
        kp=hp.katib,
        budget=hp.budget,
        sampler=hp.sampler,
        pruner=hp.pruner,
        epochs=2,
        distributed=params["train"].get("distributed") or {},
    )
    return doc, search_space.katib_keys(space)


def _trial_args(doc: dict) -> list[str]:
    spec = doc["spec"]["trialTemplate"]["trialSpec"]
    pod = spec["spec"]["template"] if spec["kind"] == "Job" else None
    if pod is None:
        pod = spec["spec"]["paddleReplicaSpecs"]["Worker"]["template"]
    return pod["spec"]["containers"][0]["args"]


def test_the_steps_digits_experiment_runs_the_train_cli_on_the_staged_view(monkeypatch):
    monkeypatch.setenv("PADDLE_MLOPS_IMAGE", IMAGE)
    doc, _ = _step_experiment("params.yaml")
    check_manifests([doc], require_digest=True)  # schema + webhook + the sample trial's Job
    run = "/mnt/shared/hpo-runs/hpo-test-0123456789ab"
    args = _trial_args(doc)
    assert args[:4] == ["train", f"--params={run}/params.yaml", f"--data={run}/data", "--hpo="]
    assert "--set=train.reader_probe_samples=0" in args and "--set=train.epochs=2" in args
    assert args[-1] == (
        "--set=task.options.augment_shift=${trialParameters.task-options-augment_shift}"
    )
    spec = doc["spec"]
    assert spec["algorithm"] == {
        "algorithmName": "tpe",
        "algorithmSettings": [{"name": "random_state", "value": "0"}],
    }
    assert spec["earlyStopping"]["algorithmSettings"] == [
        {"name": "min_trials_required", "value": "3"},
        {"name": "start_step", "value": "2"},
    ]
    assert (spec["maxTrialCount"], spec["parallelTrialCount"], spec["maxFailedTrialCount"]) == (
        16,
        1,
        8,
    )
    env = spec["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "PADDLE_MLOPS_TRIAL", "value": "1"} in env


def test_a_conditional_key_is_a_set_if_in_the_sentiment_experiment(monkeypatch):
    monkeypatch.setenv("PADDLE_MLOPS_IMAGE", IMAGE)
    doc, keys = _step_experiment("tasks/sentiment/params.yaml")
    check_manifests([doc], require_digest=True)
    args = _trial_args(doc)
    conditional = [a for a in args if a.startswith("--set-if=")]
    assert conditional == [
        "--set-if=task.options.pretrained=null:task.options.model.hidden_size="
        "${trialParameters.task-options-model-hidden_size}"
    ]
    assert keys["task-options-model-hidden_size"] == "task.options.model.hidden_size"
    # Katib has no conditionals: the key is still one of its parameters (always sampled)
    names = [p["name"] for p in doc["spec"]["parameters"]]
    assert "task-options-model-hidden_size" in names


def test_paddlejob_trials_need_the_paddlejob_backend_and_pass_its_crd(monkeypatch):
    monkeypatch.setenv("PADDLE_MLOPS_IMAGE", IMAGE)
    with pytest.raises(StepError, match="trial_kind paddlejob: train.distributed.backend is"):
        _step_experiment("params.yaml", trial_kind="paddlejob")
    train = {"train.distributed.backend": "paddlejob", "train.distributed.nnodes": 2}
    doc, _ = _step_experiment("params.yaml", trial_kind="paddlejob", train=train)
    check_manifests([doc], require_digest=True)  # the sample trial: PaddleJob CRD + webhook
    template = doc["spec"]["trialTemplate"]
    assert template["primaryContainerName"] == "paddle"
    worker = template["trialSpec"]["spec"]["paddleReplicaSpecs"]["Worker"]
    assert (worker["replicas"], worker["restartPolicy"]) == (2, "Never")
    assert _trial_args(doc)[0] == "train"
    monkeypatch.delenv("PADDLE_MLOPS_IMAGE")
    with pytest.raises(StepError, match=r"hpo.katib.image: not set and \$PADDLE_MLOPS_IMAGE"):
        _step_experiment("params.yaml")


def test_without_a_cluster_the_cli_writes_the_checked_experiment_then_exits_4(
    tmp_path, digits_data
):
    """One error line and exit code 4 (EXIT_NO_CLUSTER), after experiment.yaml is written and
    passes the strict checks: a user can kubectl apply it."""
    import os
    import subprocess
    import sys

    import yaml

    from components.kube.katib_run import EXIT_NO_CLUSTER

    env = {
        **os.environ,
        "KUBECONFIG": str(tmp_path / "no-kubeconfig"),
        "PADDLE_MLOPS_IMAGE": IMAGE,
        "HOME": str(tmp_path),
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    out = tmp_path / "hpo"
    argv = [sys.executable, "-m", "components", "hpo", "--params", "params.yaml"]
    argv += ["--data", str(digits_data), "--out", str(out), "--study", str(tmp_path / "s")]
    argv += ["--metrics", str(tmp_path / "hpo.json")]
    argv += ["--set=hpo.enabled=true", "--set=hpo.engine=katib"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == EXIT_NO_CLUSTER, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    manifest = out / "experiment.yaml"
    assert errors == [
        "error: hpo.engine katib: no cluster configured (no in-cluster service account, no "
        "usable kubeconfig: Invalid kube-config file. No configuration found.); the checked "
        f"Experiment is {manifest}: `kubectl apply -f {manifest}` submits it"
    ]
    doc = yaml.safe_load(manifest.read_text())
    check_manifests([doc], require_digest=True)
    assert doc["metadata"]["name"].startswith("hpo-digits-")


# --------------------------------------------------------------------------- the wait

KEYS = {"train-learning_rate": "train.learning_rate", "task-options-hidden": "task.options.hidden"}


def _status(*conditions: tuple[str, str], optimal: dict | None = None) -> dict:
    doc = {
        "metadata": {"name": "hpo-digits-0123", "namespace": "paddle-mlops"},
        "status": {
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": f"{t} message"}
                for t, r in conditions
            ],
            "trials": 16,
            "trialsSucceeded": 12,
            "trialsFailed": 1,
            "trialsEarlyStopped": 3,
        },
    }
    if optimal is not None:
        doc["status"]["currentOptimalTrial"] = optimal
    return doc


OPTIMAL = {
    "bestTrialName": "hpo-digits-0123-x7k2m9qd",
    "parameterAssignments": [
        {"name": "train-learning_rate", "value": "0.0012"},
        {"name": "task-options-hidden", "value": "[256,128]"},
    ],
    "observation": {
        "metrics": [{"name": "val_accuracy", "min": "0.5", "max": "0.973", "latest": "0.97"}]
    },
}


def test_a_succeeded_experiment_gives_its_optimal_trial_as_dotted_keys():
    from components.kube import katib_run

    running = _status(("Created", "ExperimentCreated"), ("Running", "ExperimentRunning"))
    assert katib_run.outcome(running, KEYS, "val_accuracy", "maximize") is None
    done = _status(
        ("Created", "ExperimentCreated"),
        ("Succeeded", "ExperimentMaxTrialsReached"),
        optimal=OPTIMAL,
    )
    found = katib_run.outcome(done, KEYS, "val_accuracy", "maximize")
    assert found is not None
    assert found.params == {"train.learning_rate": 0.0012, "task.options.hidden": [256, 128]}
    assert (found.trial, found.value, found.reason) == (
        "hpo-digits-0123-x7k2m9qd",
        0.973,
        "ExperimentMaxTrialsReached",
    )
    assert katib_run.outcome(done, KEYS, "val_accuracy", "minimize").value == 0.5
    unknown = copy.deepcopy(OPTIMAL)
    unknown["parameterAssignments"][0]["name"] = "train-lr"
    with pytest.raises(StepError, match="optimal trial assigns 'train-lr', not a searched"):
        katib_run.outcome(_status(("Succeeded", "x"), optimal=unknown), KEYS, "val_accuracy", "max")


def test_a_failed_experiment_is_one_line_with_the_conditions_message():
    from components.kube import katib_run

    failed = _status(("Running", "ExperimentRunning"), ("Failed", "ExperimentMaxFailedTrials"))
    with pytest.raises(StepError) as info:
        katib_run.outcome(failed, KEYS, "val_accuracy", "maximize")
    assert str(info.value) == (
        "Experiment paddle-mlops/hpo-digits-0123 failed: ExperimentMaxFailedTrials: Failed "
        "message (trials: trials 16, trialsSucceeded 12, trialsFailed 1, trialsEarlyStopped 3)"
    )
    no_best = _status(("Succeeded", "ExperimentGoalReached"))
    with pytest.raises(StepError, match="has no optimal trial: no trial reported val_accuracy"):
        katib_run.outcome(no_best, KEYS, "val_accuracy", "maximize")


class _FakeClock:
    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_wait_polls_on_the_params_backoff_until_the_deadline():
    from components.core.retry import BackoffParams, Clock
    from components.kube import katib_run

    fake = _FakeClock()
    clock = Clock(monotonic=fake.monotonic, sleep=fake.sleep)
    backoff = BackoffParams(first_s=10, max_s=60, factor=2).backoff(deadline_s=300)
    reads = []
    running = _status(("Running", "ExperimentRunning"))

    def read():
        reads.append(fake.now)
        return None if len(reads) == 2 else running  # a failed read: not finished yet

    with pytest.raises(StepError) as info:
        katib_run.wait(read, KEYS, "val_accuracy", "maximize", backoff, name="ns/x", clock=clock)
    # 10, 20, 40, 60, 60, 60, then 50 to land on the deadline: 8 reads, the last at 300 s
    assert fake.sleeps == [10, 20, 40, 60, 60, 60, 50]
    assert reads[-1] == 300 and len(reads) == 8
    assert str(info.value).startswith(
        "Experiment ns/x did not finish within 300 s (hpo.katib.poll.deadline_s); last "
        "condition: Running (ExperimentRunning: Running message)"
    )
    fake2 = _FakeClock()
    docs = iter([running, running, _status(("Succeeded", "r"), optimal=OPTIMAL)])
    found = katib_run.wait(
        lambda: next(docs), KEYS, "val_accuracy", "maximize", backoff, name="ns/x",
        clock=Clock(monotonic=fake2.monotonic, sleep=fake2.sleep),
    )  # fmt: skip
    assert found.trial == "hpo-digits-0123-x7k2m9qd" and fake2.sleeps == [10, 20]
