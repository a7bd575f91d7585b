"""The KFP v2 DAG: compiled with the real KFP compiler, and run whole through ``kfp.local``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.tracking.registry import LINEAGE_TAGS
from tests.conftest import REPO, WIRING_LATENCY_BUDGET

STEPS = [
    "fingerprint-op",
    "ingest-op",
    "validate-op",
    "hpo-op",
    "train-op",
    "export-op",
    "qat-op",
    "package-op",
    "evaluate-op",
    "serving-image-op",
    "track-op",
    "register-op",
]


def _compile(tmp: Path, **kwargs) -> tuple[dict, dict]:
    from pipelines.training import compile_pipeline

    out = compile_pipeline(tmp / "training.yaml", **kwargs)
    spec, platform = yaml.safe_load_all(out.read_text())
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    return _compile(tmp_path_factory.mktemp("kfp"))[0]


def all_tasks(spec: dict) -> dict[str, dict]:
    """Tasks of the root DAG and of every sub-DAG (exit handler, conditions), by name."""
    tasks = dict(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        tasks.update(component.get("dag", {}).get("tasks", {}))
    return tasks


def test_a_task_setter_misused_while_building_still_names_itself():
    """While a pipeline is built, kfp's setters find their own name without walking the whole
    stack (pipelines/training.py: _cheap_setter_checks); their error still names the setter,
    and kfp gets the real ``inspect`` back afterwards."""
    import inspect

    from kfp.dsl import pipeline_task

    from pipelines.training import _cheap_setter_checks

    class NotAContainer:
        container_spec = None

    def set_cpu_limit() -> None:
        pipeline_task.PipelineTask._ensure_container_spec_exists(NotAContainer())

    with _cheap_setter_checks(), pytest.raises(ValueError, match="^set_cpu_limit can only"):
        set_cpu_limit()
    assert pipeline_task.inspect is inspect


def test_every_step_is_in_the_dag_with_its_dependencies(compiled):
    tasks = all_tasks(compiled)
    assert set(STEPS) <= set(tasks)
    deps = {name: set(t.get("dependentTasks", [])) for name, t in tasks.items()}
    # ingest and validate are map (a ParallelFor over unit / shard groups) + reduce
    loops = {
        name: set(_sub_dag(compiled, t)) for name, t in tasks.items() if name.startswith("for-loop")
    }
    ingest_loop = next(n for n, inner in loops.items() if inner == {"ingest-map-op"})
    validate_loop = next(n for n, inner in loops.items() if inner == {"validate-map-op"})
    assert deps["ingest-op"] == {ingest_loop, "fingerprint-op"}
    assert deps[ingest_loop] == {"ingest-plan-op", "fingerprint-op"}
    assert deps["validate-op"] == {"ingest-op", validate_loop}
    assert deps[validate_loop] == {"validate-plan-op", "ingest-op"}
    assert "validate-op" in deps["train-op"]  # no training on data that failed validation
    assert deps["export-op"] == {"ingest-op", "train-op"}
    assert {"train-op", "export-op"} <= deps["qat-op"]  # qat starts from the one fp32 export
    assert deps["package-op"] == {"export-op", "qat-op"}
    assert {"package-op"} <= deps["serving-image-op"] and {"package-op"} <= deps["evaluate-op"]
    assert {"evaluate-op", "serving-image-op", "qat-op", "package-op"} <= deps["track-op"]
    assert "track-op" in deps["register-op"]


def test_hpo_runs_on_validated_data_and_train_reads_its_overlay(compiled):
    """The search step (components/steps/hpo.py) between validate and train: it reads the
    snapshot after validation passed, and train's ``hpo`` input is its ``out`` artifact (the
    directory holding overlay.yaml), so train waits for it and reads the adopted params."""
    tasks = all_tasks(compiled)
    hpo, train = tasks["hpo-op"], tasks["train-op"]
    assert set(hpo["dependentTasks"]) == {"ingest-op", "validate-op"}
    assert {"hpo-op", "validate-op"} <= set(train["dependentTasks"])
    edges = {k: a["taskOutputArtifact"] for k, a in hpo["inputs"]["artifacts"].items()}
    assert edges == {
        "data": {"producerTask": "ingest-op", "outputArtifactKey": "data"},
        "validation": {"producerTask": "validate-op", "outputArtifactKey": "report"},
    }
    assert train["inputs"]["artifacts"]["hpo"]["taskOutputArtifact"] == {
        "producerTask": "hpo-op",
        "outputArtifactKey": "out",
    }
    # train's data is the same snapshot the search searched on
    assert train["inputs"]["artifacts"]["data"] == hpo["inputs"]["artifacts"]["data"]
    outputs = compiled["components"][hpo["componentRef"]["name"]]["outputDefinitions"]
    assert set(outputs["artifacts"]) == {"out", "study", "metrics"}
    assert outputs["artifacts"]["metrics"]["artifactType"]["schemaTitle"] == "system.Metrics"
    # keyed on what it reads: a change of `register` does not search again
    assert sections_read(hpo) == {"task", "train", "hpo"}
    readers = {n for n, t in tasks.items() if n.endswith("op") and "hpo" in sections_read(t)}
    assert readers <= {"hpo-op", "track-op"}


def _sub_dag(spec: dict, task: dict) -> dict:
    return spec["components"][task["componentRef"]["name"]]["dag"]["tasks"]


def sections_read(task: dict) -> set[str]:
    """The pipeline parameters (params.yaml sections) a task's inputs come from."""
    params = task.get("inputs", {}).get("parameters", {}).values()
    return {
        p["componentInputParameter"].removeprefix("pipelinechannel--")
        for p in params
        if "componentInputParameter" in p
    } - {"build_in_cluster", "retrain_reason"}


def test_each_step_is_keyed_only_on_the_params_sections_it_reads(compiled):
    """KFP's cache key is a task's inputs: a step that does not get `register` is not
    re-run (train is not retrained) when a `register` param changes."""
    from pipelines.training import SECTIONS

    tasks = all_tasks(compiled)
    expected = {
        "fingerprint-op": {"task", "ingest"},
        "ingest-op": {"task", "ingest"},
        "validate-op": {"task", "validate"},
        "hpo-op": {"task", "train", "hpo"},
        "train-op": {"task", "train"},
        "export-op": {"task", "export"},
        "qat-op": {"task", "qat"},
        "package-op": {"package"},
        "evaluate-op": {"task", "evaluate"},
        "serving-image-op": {"task", "serving_image"},
        "register-op": {"task", "register", "registry"},
        "promote-op": {"promote", "registry"},
        "promote-op-2": {"promote", "registry"},
        "record-failure-op": {"track"},
        "track-op": set(SECTIONS),  # uncached: the MLflow run records every param
    }
    assert {name: sections_read(tasks[name]) for name in expected} == expected
    steps = {
        name: t
        for name, t in tasks.items()
        if "componentRef" in t and name.endswith(("op", "op-2"))
    }
    readers = {name for name, t in steps.items() if "register" in sections_read(t)}
    assert readers == {"register-op", "track-op"}
    assert set(compiled["root"]["inputDefinitions"]["parameters"]) == {
        *SECTIONS,
        "build_in_cluster",
        "retrain_reason",
    }
    # a monitor's alarm reaches the MLflow run through the track task alone
    readers = {n for n, t in steps.items() if "retrain_reason" in str(t.get("inputs"))}
    assert readers == {"track-op"}


def test_only_a_blessed_model_gets_an_image_and_the_champion_alias(compiled):
    tasks = all_tasks(compiled)
    blessed = [
        t
        for t in tasks.values()
        if "register-op-Output" in t.get("triggerPolicy", {}).get("condition", "")
    ]
    assert len(blessed) == 1
    assert blessed[0]["triggerPolicy"]["condition"].endswith("== true")
    (branches,) = _sub_dag(compiled, blessed[0]).values()
    cluster, local = _sub_dag(compiled, branches).values()
    assert "build_in_cluster'] == true" in cluster["triggerPolicy"]["condition"]
    assert local["triggerPolicy"]["condition"].startswith("!(")
    in_cluster = _sub_dag(compiled, cluster)
    assert set(in_cluster) == {"kaniko-build-op", "promote-op", "deploy-op"}
    # the champion is deployed after its promotion, in both branches
    assert in_cluster["deploy-op"]["dependentTasks"] == ["promote-op"]
    # the pushed image's digest flows into the promotion (and the version's tags)
    digest = in_cluster["promote-op"]["inputs"]["parameters"]["image_digest"]
    assert digest["taskOutputParameter"] == {
        "outputParameterKey": "digest",
        "producerTask": "kaniko-build-op",
    }
    kaniko = in_cluster["kaniko-build-op"]["inputs"]["artifacts"]["context"]
    assert kaniko["componentInputArtifact"].endswith("serving-image-op-infra")
    assert sorted(_sub_dag(compiled, local)) == ["deploy-op-2", "promote-op-2"]
    assert _sub_dag(compiled, local)["deploy-op-2"]["dependentTasks"] == ["promote-op-2"]
    container = compiled["deploymentSpec"]["executors"]["exec-kaniko-build-op"]["container"]
    assert container["image"].startswith("gcr.io/kaniko-project/executor")
    assert "--digest-file" in container["args"] and "--destination" in container["args"]


def test_a_failed_run_is_recorded_by_the_exit_handler(compiled):
    root = compiled["root"]["dag"]["tasks"]
    exit_task = root["record-failure-op"]
    assert exit_task["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert "exit-handler-1" in exit_task["dependentTasks"]


def test_retries_and_caching_are_explicit(compiled):
    tasks = all_tasks(compiled)
    for name in ("fingerprint-op", "ingest-op", "track-op", "register-op"):  # network
        policy = tasks[name]["retryPolicy"]
        assert policy["maxRetryCount"] == 3 and policy["backoffFactor"] == 2.0
    for name in ("fingerprint-op", "track-op", "register-op"):  # must run every time
        assert not tasks[name]["cachingOptions"].get("enableCache", False)
    # ingest is cached, keyed on the fingerprint of the source's bytes
    assert tasks["ingest-op"]["cachingOptions"]["enableCache"] is True
    key = tasks["ingest-op"]["inputs"]["parameters"]["source_sha256"]["taskOutputParameter"]
    assert key["producerTask"] == "fingerprint-op"
    assert tasks["train-op"]["cachingOptions"]["enableCache"] is True


def test_gpu_requests_only_when_asked(tmp_path):
    from pipelines.training import GPU_IMAGE, IMAGE

    cpu, _ = _compile(tmp_path / "cpu")
    gpu, _ = _compile(tmp_path / "gpu", gpus=1)
    for spec, expected in ((cpu, None), (gpu, "nvidia.com/gpu")):
        executors = spec["deploymentSpec"]["executors"]
        for name, executor in executors.items():
            acc = executor["container"].get("resources", {}).get("accelerator")
            image = executor["container"]["image"]
            if name in ("exec-train-op", "exec-qat-op") and expected:
                assert acc["resourceType"] == expected and acc["resourceCount"] == "1"
                assert image == GPU_IMAGE  # the CUDA wheel, for the GPU steps only
            else:
                assert acc is None, name
                assert image != GPU_IMAGE, name
        assert executors["exec-serving-image-op"]["container"]["image"] == IMAGE


def test_every_task_has_cpu_and_memory_requests_and_limits_from_params(compiled):
    import yaml as _yaml

    resources = _yaml.safe_load((REPO / "params.yaml").read_text())["resources"]
    executors = compiled["deploymentSpec"]["executors"]
    for name, executor in executors.items():
        got = executor["container"]["resources"]
        step = name.removeprefix("exec-").removesuffix("-op").replace("-", "_")
        want = {**resources["default"], **resources.get(step, {})}
        assert got["resourceCpuRequest"] == str(want["cpu_request"]), name
        assert got["resourceCpuLimit"] == str(want["cpu_limit"]), name
        assert got["resourceMemoryRequest"] == str(want["memory_request"]), name
        assert got["resourceMemoryLimit"] == str(want["memory_limit"]), name


def test_credentials_come_from_secrets_and_the_config_map(tmp_path):
    _, executors = _compile(tmp_path)
    for name in (
        "exec-ingest-op",
        "exec-track-op",
        "exec-register-op",
        "exec-promote-op",
        "exec-record-failure-op",
    ):
        config = executors[name]
        assert config["configMapAsEnv"][0]["configMapName"] == "mlflow-client-env"
        secrets = {s["secretName"] for s in config["secretAsEnv"]}
        assert "mlflow-auth" in secrets
    ingest_secrets = {s["secretName"]: s for s in executors["exec-ingest-op"]["secretAsEnv"]}
    keys = {k["envVar"] for k in ingest_secrets["pipeline-s3"]["keyToEnv"]}
    assert keys == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3"}


def test_components_use_one_image_without_pip_installs(compiled):
    from pipelines.training import IMAGE

    executors = compiled["deploymentSpec"]["executors"]
    python = {k: e for k, e in executors.items() if k != "exec-kaniko-build-op"}
    assert python and all(e["container"]["image"] == IMAGE for e in python.values())
    assert not any(
        "pip install" in " ".join(e["container"].get("command", [])) for e in executors.values()
    )


def tiny_params() -> dict:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["task"]["options"]["conv_channels"] = [6, 16]
    params["ingest"]["source"] = str(REPO / "data" / "raw" / "digits")
    if not Path(params["ingest"]["source"]).exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "components.steps.ingest",
                "materialize",
                "--out",
                params["ingest"]["source"],
            ],
            cwd=REPO,
            check=True,
        )
    params["train"]["epochs"] = 3
    params["qat"].update(
        epochs=1, max_accuracy_drop=5.0, max_class_drop=30.0, latency={"warmup": 1, "repeats": 3}
    )
    params["evaluate"]["latency"].update(warmup=1, repeats=3)
    params["register"]["min_accuracy"] = 0.5
    params["package"]["tune"]["budget_s"] = 0  # the search is tested in test_tuning
    params["serving_image"].update(golden_samples=32, latency_requests=10, **WIRING_LATENCY_BUDGET)
    params["track"]["experiment"] = "kfp-local"
    params["deploy"]["target"] = "none"  # no server left behind (tests/test_pipeline_dvc.py)
    # the search on, tiny: 2 trials of 1 epoch; the current learning rate is the better
    # choice, so the baseline wins and no adoption seeds run (adoption: test_hpo_step)
    params["hpo"].update(
        enabled=True,
        trial_epochs=1,
        budget={**params["hpo"]["budget"], "trials": 2, "cpus_per_trial": 1},
        sampler={"name": "random", "seed": 0},
        pruner={"name": "none"},
        adopt={**params["hpo"]["adopt"], "seeds": 2},
        space={"train.learning_rate": {"type": "categorical", "choices": [0.001, 1.0e-6]}},
    )
    return params


def run_kfp_local(tmp_path: Path, params: dict) -> tuple[subprocess.CompletedProcess, dict]:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }
    env.pop("MLFLOW_REGISTRY_URI", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.training",
            "local",
            "--params",
            str(tmp_path / "params.yaml"),
            "--pipeline-root",
            str(tmp_path / "root"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return proc, env


def test_kfp_local_runs_the_whole_dag_and_leaves_a_champion(tmp_path, server_binary):
    proc, env = run_kfp_local(tmp_path, tiny_params())
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    for step in STEPS + ["promote-op-2", "record-failure-op"]:
        assert f"Task '{step}' finished with status SUCCESS" in log, step
    assert "FAILURE" not in log

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    model = client.get_registered_model("digits-classifier")
    assert int(model.aliases["champion"]) == 1
    tags = client.get_model_version("digits-classifier", "1").tags
    for key in (*LINEAGE_TAGS, "blessed"):
        assert tags[key], key
    assert tags["infra_validated"] == "true" and tags["blessed"] == "true"
    # the same metric files as dvc repro's metrics/*.json, as each task's Metrics artifact
    metrics = {
        p.parent.name: json.loads(p.read_text())
        for p in (tmp_path / "root").rglob("metrics")
        if p.is_file()
    }
    assert {"train-op", "qat-op", "evaluate-op"} <= set(metrics), sorted(metrics)
    assert metrics["evaluate-op"]["accuracy"] > 0.5 and metrics["qat-op"]["gate_passed"] is True
    assert metrics["train-op"]["epochs_run"] == 3
    # the search ran in the DAG: its trials were real train runs, and train read its overlay
    hpo = metrics["hpo-op"]
    assert hpo["enabled"] is True and (hpo["trials"], hpo["complete"], hpo["fail"]) == (2, 2, 0)
    assert hpo["adopted"] is False and hpo["baseline_value"] == hpo["best_value"]
    assert "hpo: kept current params: the best trial" in log  # the hpo op's one line
    assert "overlay.yaml sets nothing (decision.yaml beside it says why)" in log  # train's


def test_a_failing_run_is_recorded_in_mlflow_by_the_exit_handler(tmp_path, server_binary):
    params = tiny_params()
    params["validate"]["class_fraction_max"] = 0.05  # the data cannot pass this
    proc, env = run_kfp_local(tmp_path, params)
    log = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    assert proc.returncode != 0
    assert "Task 'validate-op' finished with status FAILURE" in log
    assert "Task 'train-op'" not in log  # nothing downstream ran
    assert "Task 'record-failure-op' finished with status SUCCESS" in log

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("kfp-local")
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]
    assert runs[0].data.tags["pipeline_state"] == "FAILED"


def test_kaniko_pushes_with_the_registry_secret_mounted_as_its_docker_config(tmp_path):
    """The push credentials: Secret REGISTRY_PUSH_SECRET (type dockerconfigjson, with a
    config.json key) mounted at /kaniko/.docker, i.e. /kaniko/.docker/config.json; the
    destination is the serving_image step's ref (params.yaml serving_image.image_repository)."""
    from pipelines.training_cluster import KANIKO_DOCKER_CONFIG, REGISTRY_PUSH_SECRET
    from pipelines.training_components import KANIKO_IMAGE

    spec, executors = _compile(tmp_path)
    (volume,) = executors["exec-kaniko-build-op"]["secretAsVolume"]
    assert volume["secretName"] == REGISTRY_PUSH_SECRET == "registry-push"
    assert volume["mountPath"] == KANIKO_DOCKER_CONFIG == "/kaniko/.docker"
    assert volume["optional"] is False  # no credentials: no build
    mounted = {k for k, e in executors.items() if "secretAsVolume" in e and "kaniko" not in k}
    # besides kaniko, the registry credentials go only where signatures are written or read
    assert {k.rsplit("-op", 1)[0] for k in mounted} == {"exec-promote", "exec-deploy"}
    container = spec["deploymentSpec"]["executors"]["exec-kaniko-build-op"]["container"]
    assert container["image"] == KANIKO_IMAGE and "@sha256:" in KANIKO_IMAGE
    destination = container["args"][container["args"].index("--destination") + 1]
    assert destination == "{{$.inputs.parameters['destination']}}"
    task = next(t for t in all_tasks(spec).values() if t["taskInfo"]["name"] == "kaniko-build-op")
    # (inside the condition's sub-DAG: the serving_image task's output, passed down)
    source = task["inputs"]["parameters"]["destination"]["componentInputParameter"]
    assert source == "pipelinechannel--serving-image-op-Output"


def test_only_promote_holds_the_signing_key_and_deploy_trusts_the_configmap(tmp_path):
    """Provenance in the cluster (docs/provenance.md): the private key is Secret
    SIGNING_SECRET mounted into the promote pod of the cluster branch only, named by
    PADDLE_MLOPS_SIGNING_KEY (a path, never a parameter); deploy gets the trusted keys from
    ConfigMap TRUST_CONFIG_MAP; both read the registry credentials from a mounted file."""
    from pipelines.training_cluster import SIGNING_MOUNT, SIGNING_SECRET, TRUST_CONFIG_MAP

    spec, executors = _compile(tmp_path)
    containers = {k: e["container"] for k, e in spec["deploymentSpec"]["executors"].items()}

    def env(executor: str) -> dict[str, str]:
        return {e["name"]: e["value"] for e in containers[executor].get("env", [])}

    holders = {
        k
        for k, e in executors.items()
        for v in e.get("secretAsVolume", [])
        if v["secretName"] == SIGNING_SECRET
    }
    assert len(holders) == 1 and next(iter(holders)).startswith("exec-promote-op")
    (holder,) = holders
    assert env(holder)["PADDLE_MLOPS_SIGNING_KEY"] == f"{SIGNING_MOUNT}/signing.key"
    assert env(holder)["REGISTRY_AUTH_FILE"].endswith("/config.json")
    others = [k for k in containers if k != holder]
    assert not any("PADDLE_MLOPS_SIGNING_KEY" in env(k) for k in others)
    trusting = {
        k
        for k, e in executors.items()
        for c in e.get("configMapAsEnv", [])
        if c["configMapName"] == TRUST_CONFIG_MAP
    }
    assert len(trusting) == 1 and next(iter(trusting)).startswith("exec-deploy-op")
    (deployer,) = trusting
    (entry,) = [
        c for c in executors[deployer]["configMapAsEnv"] if c["configMapName"] == TRUST_CONFIG_MAP
    ]
    assert entry["keyToEnv"] == [
        {"configMapKey": "trusted.pub", "envVar": "PADDLE_MLOPS_TRUSTED_KEYS"}
    ]


def test_ingest_fans_out_over_unit_groups_under_kfp_local(tmp_path):
    """The KFP ingest: a ParallelFor of map tasks over unit groups, then the reduce, writes
    the snapshot a local ingest writes (same shards, byte for byte)."""
    import numpy as np
    from kfp import dsl, local
    from PIL import Image

    from components.core.config import section
    from components.ml.data import snapshot
    from components.steps.ingest import run as ingest
    from components.tasks import task_from_params
    from pipelines.training import IMAGE, ops
    from pipelines.training_components import ingest_fanout

    root = tmp_path / "folder"
    rng = np.random.default_rng(3)
    for cls in ("a", "b", "c"):
        (root / cls).mkdir(parents=True)
        for i in range(24):
            Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(
                root / cls / f"{i:02d}.png"
            )
    sections = {
        "task": {"name": "digits"},
        "ingest": {"source": str(root), "kind": "image_folder", "unit_files": 6, "workers": 2},
    }

    def body(task, ingest):
        reduce, _ = ingest_fanout(ops(IMAGE), {"task": task, "ingest": ingest}, "")
        return reduce.outputs["data"]

    # real types for KFP (this module's annotations are strings)
    body.__annotations__ = {"task": dict, "ingest": dict, "return": dsl.Dataset}
    fanout = dsl.pipeline(name="ingest-fanout")(body)

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"))
    result = fanout(**sections)
    kfp_dir = Path(result.outputs["Output"].path)
    maps = sorted((tmp_path / "kfp").glob("*/for-loop-*-iteration-*/ingest-map-op"))
    assert len(maps) == 2, maps  # ingest.workers groups, one task each

    task = task_from_params(sections)
    local_result = ingest(
        section(sections, "ingest", task.data.ingest_params), task, tmp_path / "o"
    )
    kfp_snap, local_snap = snapshot.load(kfp_dir), snapshot.load(tmp_path / "o")
    assert len(kfp_snap.doc["units"]) > 3  # several units per group
    assert {s.path: s.sha256 for s in kfp_snap.shards} == {
        s.path: s.sha256 for s in local_snap.shards
    }
    assert kfp_snap.doc["totals"] == local_snap.doc["totals"]
    assert sum(local_result.counts[s][c] for s in snapshot.SPLITS for c in ("a", "b", "c")) == 72
    snapshot.verify(kfp_snap)


def test_the_package_step_can_be_placed_on_the_serving_node_pool(tmp_path):
    """resources.package.node_selector / tolerations: the serving-config search measures the
    node type that will serve (docs/tuning.md)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["resources"]["package"].update(
        node_selector={"node.kubernetes.io/instance-type": "c7i.large"},
        tolerations=[
            {"key": "dedicated", "operator": "Equal", "value": "serving", "effect": "NoSchedule"}
        ],
    )
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _, executors = _compile(tmp_path, params_file=tmp_path / "params.yaml")
    package = executors["exec-package-op"]
    assert package["nodeSelector"]["labels"] == {"node.kubernetes.io/instance-type": "c7i.large"}
    (toleration,) = package["tolerations"]
    assert toleration["key"] == "dedicated" and toleration["effect"] == "NoSchedule"
    assert "nodeSelector" not in executors.get("exec-train-op", {})  # only where asked

    params["resources"]["package"]["node_selector"] = ["not", "a", "mapping"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with pytest.raises(ValueError, match=r"resources\.package\.node_selector: expected"):
        _compile(tmp_path, params_file=tmp_path / "params.yaml")


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (
            lambda p: p["train"]["distributed"].update(backnd="paddlejob"),
            r"train\.distributed: unknown field\(s\) \['backnd'\]; did you mean 'backend'\?",
        ),
        (lambda p: p["resources"].update(train=4), r"resources\.train: "),
        (
            lambda p: (
                p["train"]["distributed"].update(backend="paddlejob")
                or p.update(paddlejob={"pcv": "team"})
            ),
            r"paddlejob: unknown field\(s\) \['pcv'\]; did you mean 'pvc'\?",
        ),
    ],
    ids=["train", "resources", "paddlejob"],
)
def test_the_sections_read_at_compile_time_are_typed(tmp_path, change, error):
    """The compile reads train.distributed.backend, resources and paddlejob by their params
    models: a typo is the loader's one line naming the file and the field, not a silent
    default (a misspelt backend used to compile the in-pod train task)."""
    from components.core.artifacts import StepError

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    change(params)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with pytest.raises(StepError, match=re.escape(str(tmp_path / "params.yaml")) + ": " + error):
        _compile(tmp_path, params_file=tmp_path / "params.yaml")
