"""The training pipeline as a Kubeflow Pipelines v2 DAG over the same step declarations.

This module is the DAG only. Every step's component is generated from its ``STEP``
declaration (``components.kernel.kfp.kfp_component``): it receives only the params sections the step
reads (so its cache key changes only when they or its inputs do) and calls the same function
as the CLI and ``dvc repro``. The wiring follows each input port's ``source``. The same DAG
compiles for a cluster (``base_image`` = the component image) and runs on this machine
through ``kfp.local`` (see ``run_local``).

    python -m pipelines.training compile --out pipelines/compiled/training.yaml
    python -m pipelines.training local --params params.yaml      # kfp.local, this machine

Where training runs is chosen when the pipeline is compiled, from the params file it is
compiled with (``compile --params``, default ``params.yaml``; read like ``resources``):
``train.distributed.backend: paddlejob`` puts the PaddleJob launcher
(``pipelines/paddlejob.py``) in the train task's place. It has the train task's inputs and
outputs, so every later step is wired to it unchanged; it mounts the shared volume
(``paddlejob.pvc`` at ``paddlejob.mount_path``, also read at compile time) and the pipeline
gains the parameter ``paddlejob`` (``pipeline_params`` passes that section only then). Any
other backend keeps the train task, which trains in its own pod (``nproc`` ranks there). At
run time the launcher refuses a run whose params say another backend or volume than the
pipeline was compiled with. Not a run-time ``dsl.If``: the PVC mount, the task's image and
environment are compile-time properties of a task, and the choice stays visible in the DAG.

Ingest is a map over the source's units followed by a reduce (``components.steps.ingest``): the
plan task names ``ingest.workers`` unit groups, a ``dsl.ParallelFor`` ingests each group in
its own pod (its shards and a part file), and the ``ingest-op`` task reduces the collected
parts into the snapshot every later step reads, so a large ingest spreads over the nodes.
Validate does the same over the snapshot's shards (``validate.workers`` shard groups, then the
``validate-op`` reduce that runs the Great Expectations suites).
"""

import argparse
import contextlib
import functools
import inspect
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kfp import compiler, dsl, kubernetes
from kfp.dsl import HTML, Artifact, Dataset, Input, Output

from components.kernel.kfp import kfp_component
from components.kernel.step import AFTER_DEPLOY, Step, all_steps, load
from pipelines import paddlejob as pj

IMAGE = "registry.example.com/paddle-mlops/components:latest"
# components/Containerfile.gpu: Paddle's CUDA wheel, for the steps that train (compile --gpus N)
GPU_IMAGE = "registry.example.com/paddle-mlops/components-gpu:latest"
GPU_STEPS = ("train", "qat")
REPO = Path(__file__).resolve().parents[1]

STEPS: dict[str, Step] = {s.name: s for s in all_steps()}
# steps that run as a map (a ParallelFor over groups) and a reduce task in the step's place
FANOUT_STEPS = ("ingest", "validate")
# the pipeline's parameters: one per params.yaml section that some step reads
SECTIONS = tuple(dict.fromkeys(s for step in STEPS.values() for s in step.sections))
# the sections only the steps after deploy read (monitor, judge): params.yaml holds them, this
# pipeline does not take them
AFTER_DEPLOY_SECTIONS = frozenset(
    s for name in AFTER_DEPLOY for s in load(name).sections if s not in SECTIONS
)


def fingerprint_op(task: dict, ingest: dict) -> str:
    """sha256 of the raw source, recomputed every run (uncached): ingest's cache key."""
    from components.core.config import section
    from components.steps.ingest import source_fingerprint
    from components.tasks import task_from_params

    sections = {"task": task, "ingest": ingest}
    task_obj = task_from_params(sections)
    params = section(sections, "ingest", task_obj.data.ingest_params)
    return source_fingerprint(task_obj, params)


def ingest_plan_op(task: dict, ingest: dict) -> list:
    """The unit groups the ingest map runs over (``i/n``; ``ingest.workers`` of them)."""
    from components.core.config import section
    from components.kernel.cli import setup_logging
    from components.steps.ingest import plan_groups
    from components.tasks import task_from_params

    setup_logging()
    sections = {"task": task, "ingest": ingest}
    task_obj = task_from_params(sections)
    return plan_groups(section(sections, "ingest", task_obj.data.ingest_params), task_obj)


def ingest_map_op(task: dict, ingest: dict, group: str, source_sha256: str, part: Output[Dataset]):
    """Ingest one group of units into a part (``source_sha256``, the source's fingerprint, is
    this task's cache key: a moving source maps again)."""
    from components.core.config import section
    from components.faults import failpoints
    from components.kernel.cli import setup_logging
    from components.steps.ingest import run_map
    from components.tasks import task_from_params

    setup_logging()
    failpoints.set_step("ingest")
    sections = {"task": task, "ingest": ingest}
    task_obj = task_from_params(sections)
    params = section(sections, "ingest", task_obj.data.ingest_params)
    run_map(params, task_obj, group, part.path)


def ingest_op(
    task: dict,
    ingest: dict,
    parts: Input[list[Dataset]],
    source_sha256: str,
    data: Output[Dataset],
):
    """Reduce the collected parts into the snapshot (``components.steps.ingest.run`` with
    ``parts``): what the ``ingest`` step writes, so every later task reads it unchanged."""
    from components.core.config import section
    from components.faults import failpoints
    from components.kernel.cli import setup_logging
    from components.steps.ingest import run
    from components.tasks import task_from_params

    setup_logging()
    failpoints.set_step("ingest")
    sections = {"task": task, "ingest": ingest}
    task_obj = task_from_params(sections)
    params = section(sections, "ingest", task_obj.data.ingest_params)
    run(
        params,
        task_obj,
        data.path,
        parts=[p.path for p in parts],
        expected_source_sha256=source_sha256,
    )


def ingest_fanout(
    made: Mapping[str, Any], sections: Mapping[str, Any], source_sha256: Any
) -> tuple[dsl.PipelineTask, list[dsl.PipelineTask]]:
    """Plan, map (a ParallelFor over the unit groups) and reduce: the reduce task stands
    where the ingest step's task would (its output ``data``); also returns the others."""
    task, ingest = sections["task"], sections["ingest"]
    plan = made["ingest_plan_op"](task=task, ingest=ingest)
    with dsl.ParallelFor(plan.output, name="ingest-groups") as group:
        mapped = made["ingest_map_op"](
            task=task, ingest=ingest, group=group, source_sha256=source_sha256
        )
    reduce = made["ingest_op"](
        task=task,
        ingest=ingest,
        parts=dsl.Collected(mapped.outputs["part"]),
        source_sha256=source_sha256,
    )
    return reduce, [plan, mapped]


def validate_plan_op(task: dict, validate: dict, data: Input[Dataset]) -> list:
    """The shard groups the validate map runs over (``validate.workers`` of them)."""
    from components.core.config import section
    from components.kernel.cli import setup_logging
    from components.steps.validate import plan_groups
    from components.tasks import task_from_params

    setup_logging()
    sections = {"task": task, "validate": validate}
    task_obj = task_from_params(sections)
    params = section(sections, "validate", task_obj.data.validate_params)
    return plan_groups(params, data.path)


def validate_map_op(
    task: dict, validate: dict, data: Input[Dataset], group: str, part: Output[Artifact]
):
    """The statistics of one group of shards (verified against their sha256)."""
    from components.core.config import section
    from components.faults import failpoints
    from components.kernel.cli import setup_logging
    from components.steps.validate import run_map
    from components.tasks import task_from_params

    setup_logging()
    failpoints.set_step("validate")
    sections = {"task": task, "validate": validate}
    task_obj = task_from_params(sections)
    params = section(sections, "validate", task_obj.data.validate_params)
    run_map(params, task_obj, data.path, group, part.path)


def validate_op(
    task: dict,
    validate: dict,
    data: Input[Dataset],
    parts: Input[list[Artifact]],
    report: Output[Artifact],
    data_docs: Output[HTML],
):
    """Reduce the parts and run the suites (``components.steps.validate.run`` with ``parts``):
    the validate step's outputs, so later tasks read them unchanged."""
    import shutil
    from pathlib import Path

    from components.core.config import section
    from components.faults import failpoints
    from components.kernel.cli import setup_logging
    from components.steps.validate import run
    from components.tasks import task_from_params

    setup_logging()
    failpoints.set_step("validate")
    sections = {"task": task, "validate": validate}
    task_obj = task_from_params(sections)
    params = section(sections, "validate", task_obj.data.validate_params)
    run(params, task_obj, data.path, report.path, parts=[p.path for p in parts])
    shutil.copy(Path(report.path) / "data_docs" / "index.html", data_docs.path)


def shard_fanout(
    made: Mapping[str, Any], sections: Mapping[str, Any], data: Any
) -> tuple[dsl.PipelineTask, list[dsl.PipelineTask]]:
    """Validate as plan, map (a ParallelFor over shard groups) and reduce: the reduce task
    stands where the validate step's task would (outputs ``report``, ``data_docs``)."""
    task, validate = sections["task"], sections["validate"]
    plan = made["validate_plan_op"](task=task, validate=validate, data=data)
    with dsl.ParallelFor(plan.output, name="validate-groups") as group:
        mapped = made["validate_map_op"](task=task, validate=validate, data=data, group=group)
    reduce = made["validate_op"](
        task=task, validate=validate, data=data, parts=dsl.Collected(mapped.outputs["part"])
    )
    return reduce, [plan, mapped]


def wire(
    op: Any, step: Step, sections: Mapping[str, Any], tasks: Mapping[str, Any], **values: Any
) -> dsl.PipelineTask:
    """The task of ``step``: its sections, and each input from the task of its source."""
    inputs = {}
    for port in step.inputs:
        producer, output = (port.source or "").split(".")
        inputs[port.name] = tasks[producer].outputs[output]
    return op(**{s: sections[s] for s in step.sections}, **inputs, **values)


def with_resources(task: dsl.PipelineTask, resources: Mapping[str, Any], name: str) -> Any:
    """``resources.default`` then ``resources.<name>``: CPU and memory requests and limits, and
    ``node_selector`` ({label: value}) / ``tolerations`` ([{key, operator, value, effect}]) to
    put the step's pod on a node pool (``package`` on the serving pool: its serving-config
    search then measures the machine that will serve; docs/tuning.md)."""
    from kfp import kubernetes

    spec = {**resources.get("default", {}), **resources.get(name, {})}
    setters = {
        "cpu_request": task.set_cpu_request,
        "cpu_limit": task.set_cpu_limit,
        "memory_request": task.set_memory_request,
        "memory_limit": task.set_memory_limit,
    }
    placement = {"node_selector", "tolerations"}
    unknown = sorted(set(spec) - set(setters) - placement)
    if unknown:
        raise ValueError(f"params.yaml: resources.{name}: unknown keys {unknown}")
    for key, value in spec.items():
        if key in setters:
            setters[key](str(value))
    selector = spec.get("node_selector") or {}
    if not isinstance(selector, Mapping):
        raise ValueError(f"params.yaml: resources.{name}.node_selector: expected label: value")
    for label, value in selector.items():
        kubernetes.add_node_selector(task, label_key=str(label), label_value=str(value))
    for i, toleration in enumerate(spec.get("tolerations") or []):
        allowed = {"key", "operator", "value", "effect", "toleration_seconds"}
        if not isinstance(toleration, Mapping) or set(toleration) - allowed:
            raise ValueError(
                f"params.yaml: resources.{name}.tolerations[{i}]: a mapping of {sorted(allowed)}"
            )
        kubernetes.add_toleration(task, **toleration)
    return task


def load_resources(params_file: str | Path = REPO / "params.yaml") -> dict[str, Any]:
    return _load(params_file).get("resources") or {}


def _load(params_file: str | Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(Path(params_file).read_text()) or {}


TRAIN_BACKENDS = ("step", "paddlejob")


def train_backend(params: Mapping[str, Any]) -> str:
    """Where the train task trains: ``paddlejob`` when ``train.distributed.backend`` says so
    (a Kubeflow PaddleJob, started by the launcher task), else ``step`` (in the task's pod)."""
    distributed = (params.get("train") or {}).get("distributed") or {}
    return "paddlejob" if distributed.get("backend") == "paddlejob" else "step"


def pipeline_sections(backend: str) -> tuple[str, ...]:
    """The pipeline's dict parameters: the steps' sections, + ``paddlejob`` for the launcher."""
    return (*SECTIONS, "paddlejob") if backend == "paddlejob" else SECTIONS


PIPELINE_RUN = dsl.PIPELINE_JOB_ID_PLACEHOLDER  # this run's id, resolved by the backend
RETRY = {"num_retries": 3, "backoff_duration": "30s", "backoff_factor": 2.0}


def retry_policy(backoff_s: float | None = None) -> dict[str, Any]:
    """:data:`RETRY`, with a first backoff of ``backoff_s`` seconds when given."""
    return RETRY if backoff_s is None else {**RETRY, "backoff_duration": f"{backoff_s:g}s"}


MLFLOW_CONFIG_MAP = "mlflow-client-env"  # k8s/mlflow/client-env.yaml
MLFLOW_AUTH_SECRET = "mlflow-auth"  # the pipeline user of the tracking server (basic auth)
MLFLOW_CLIENT_LABEL = "paddle-mlops/mlflow-client"  # admitted by the MLflow NetworkPolicy
S3_SECRET = "pipeline-s3"  # optional: credentials of s3:// ingest sources


def _with_cluster_env(task: dsl.PipelineTask, *, s3: bool = False) -> dsl.PipelineTask:
    """Tracking URI from the ConfigMap, credentials from Secrets (never in the spec), and the
    label the MLflow NetworkPolicy admits (k8s/mlflow/networkpolicy.yaml)."""
    kubernetes.use_config_map_as_env(
        task, MLFLOW_CONFIG_MAP, {"MLFLOW_TRACKING_URI": "MLFLOW_TRACKING_URI"}
    )
    # the server runs basic-auth: without the pipeline user's Secret the pod does not start
    kubernetes.use_secret_as_env(
        task,
        MLFLOW_AUTH_SECRET,
        {"username": "MLFLOW_TRACKING_USERNAME", "password": "MLFLOW_TRACKING_PASSWORD"},
        optional=False,
    )
    kubernetes.add_pod_label(task, MLFLOW_CLIENT_LABEL, "true")
    if s3:
        kubernetes.use_secret_as_env(
            task,
            S3_SECRET,
            {
                "access_key_id": "AWS_ACCESS_KEY_ID",
                "secret_access_key": "AWS_SECRET_ACCESS_KEY",
                "endpoint_url": "AWS_ENDPOINT_URL_S3",
            },
            optional=True,
        )
    return task


# provenance (docs/provenance.md): promote alone holds the private key (a Secret mounted as a
# file, never a parameter) and the registry credentials it writes signatures with; deploy gets
# the trusted public keys (a ConfigMap) and reads the registry with the same credentials
SIGNING_SECRET = "paddle-mlops-signing-key"  # key: signing.key
SIGNING_MOUNT = "/var/run/secrets/paddle-mlops/signing"
TRUST_CONFIG_MAP = "paddle-mlops-trusted-keys"  # key: trusted.pub
REGISTRY_AUTH_MOUNT = "/var/run/secrets/paddle-mlops/registry"


def _with_registry_auth(task: dsl.PipelineTask) -> dsl.PipelineTask:
    kubernetes.use_secret_as_volume(task, REGISTRY_PUSH_SECRET, mount_path=REGISTRY_AUTH_MOUNT)
    return task.set_env_variable("REGISTRY_AUTH_FILE", f"{REGISTRY_AUTH_MOUNT}/config.json")


def _with_signing_key(task: dsl.PipelineTask) -> dsl.PipelineTask:
    kubernetes.use_secret_as_volume(task, SIGNING_SECRET, mount_path=SIGNING_MOUNT)
    task.set_env_variable("PADDLE_MLOPS_SIGNING_KEY", f"{SIGNING_MOUNT}/signing.key")
    return _with_registry_auth(task)


def _with_trusted_keys(task: dsl.PipelineTask) -> dsl.PipelineTask:
    kubernetes.use_config_map_as_env(
        task, TRUST_CONFIG_MAP, {"trusted.pub": "PADDLE_MLOPS_TRUSTED_KEYS"}
    )
    return _with_registry_auth(task)


def record_failure_op(track: dict, status: dsl.PipelineTaskFinalStatus, pipeline_run: str = ""):
    """Exit handler: a failed or cancelled pipeline run ends its MLflow run FAILED, with
    ``failure_reason``. Once track has run, that is track's parent run (found by its tag
    ``pipeline_run_id``; it ended FINISHED when track itself succeeded, but the pipeline
    execution it records did not); before, a run of its own says so."""
    if status.state == "SUCCEEDED":
        return
    import mlflow

    from components.tracking.liveness import FAILURE_TAG, PIPELINE_RUN_TAG
    from components.tracking.pipeline_run import fail_pipeline_runs
    from components.tracking.registry import tracking_uri, use_experiment

    mlflow.set_tracking_uri(tracking_uri())
    experiment = use_experiment(track.get("experiment", "default"))
    job = pipeline_run or str(status.pipeline_job_resource_name)
    error = " ".join(str(status.error_message).split())
    reason = f"pipeline run {job} ended {status.state}: {error}"[:500]
    client = mlflow.MlflowClient()
    if fail_pipeline_runs(client, experiment.experiment_id, pipeline_run, reason):
        return
    mlflow.start_run(
        run_name="failed-pipeline-run",
        tags={
            "pipeline_state": str(status.state),
            "pipeline_job": str(status.pipeline_job_resource_name),
            FAILURE_TAG: reason,
            **({PIPELINE_RUN_TAG: pipeline_run} if pipeline_run else {}),
        },
    )
    mlflow.log_text(str(status.error_message), "error.txt")
    mlflow.end_run(status="FAILED")  # this run, not whichever ran last in the experiment


# the last gcr.io release, pinned by digest (the multi-arch index of v1.23.2)
KANIKO_IMAGE = (
    "gcr.io/kaniko-project/executor:v1.23.2"
    "@sha256:9e69fd4330ec887829c780f5126dd80edc663df6def362cd22e79bcdf00ac53f"
)
# Push credentials of the kaniko task: a Secret of type kubernetes.io/dockerconfigjson whose
# docker config JSON is under `.dockerconfigjson` (what the type requires) and, the same
# bytes, under `config.json`: mounted at KANIKO_DOCKER_CONFIG it is the file kaniko reads,
# /kaniko/.docker/config.json (kfp-kubernetes mounts a whole Secret, it cannot rename a key).
# Create it with the command at the end of k8s/pipelines/secrets.template.yaml.
REGISTRY_PUSH_SECRET = "registry-push"
KANIKO_DOCKER_CONFIG = "/kaniko/.docker"


@dsl.container_component
def kaniko_build_op(context: Input[Artifact], destination: str, digest: dsl.OutputPath(str)):
    """Build and push the serving image from the context serving_image prepared.

    ``destination`` is the serving_image step's image ref, ``params.yaml:
    serving_image.image_repository`` + ``:tag``: set the repository with its registry host
    (``registry.example.com/team/digits-server``); one without a host means Docker Hub.
    Kaniko checks it may push there before building, with the credentials of the
    ``REGISTRY_PUSH_SECRET`` the pipeline mounts at ``/kaniko/.docker/config.json``.
    """
    return dsl.ContainerSpec(
        image=KANIKO_IMAGE,
        command=["/kaniko/executor"],
        args=[
            "--context",
            f"dir://{context.path}/context",
            "--dockerfile",
            "Dockerfile",
            "--destination",
            destination,
            "--digest-file",
            digest,
        ],
    )


@functools.cache
def ops(image: str) -> dict[str, Any]:
    """Every component in ``image``: the steps (from their declarations) and the pipeline's
    own two (the source fingerprint, the exit handler)."""
    made = {name: kfp_component(step, image) for name, step in STEPS.items()}
    for fn in (
        fingerprint_op,
        record_failure_op,
        ingest_plan_op,
        ingest_map_op,
        ingest_op,
        validate_plan_op,
        validate_map_op,
        validate_op,
    ):
        made[fn.__name__] = dsl.component(base_image=image, install_kfp_package=False)(fn)
    made["paddlejob_train_op"] = pj.paddlejob_component(image)
    return made


def _pipeline_function(names: Sequence[str], dag: Callable[[dict[str, Any]], None]) -> Any:
    """A function whose parameters KFP reads as the pipeline's (one ``dict`` per params.yaml
    section in ``names``, then ``build_in_cluster`` and ``retrain_reason``: why this run
    retrains, set by ``python -m pipelines.schedule trigger`` from a monitor's alarm); it calls
    ``dag`` with them by name."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    signature = inspect.Signature(
        [inspect.Parameter(n, kind, annotation=dict) for n in names]
        + [inspect.Parameter("build_in_cluster", kind, annotation=bool, default=False)]
        + [inspect.Parameter("retrain_reason", kind, annotation=str, default="")]
    )

    def training_pipeline(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        dag(dict(bound.arguments))

    training_pipeline.__signature__ = signature  # type: ignore[attr-defined]
    return training_pipeline


class _CallerNameOnly:
    """``inspect`` as kfp's ``pipeline_task`` module sees it while a pipeline is built: its
    ``stack()`` holds the two frames kfp reads (the caller's name, for an error message)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(inspect, name)

    @staticmethod
    def stack(context: int = 1) -> list[tuple[Any, ...]]:
        frames = [sys._getframe(1), sys._getframe(2)]  # the setter's check, the setter
        return [(f, f.f_code.co_filename, f.f_lineno, f.f_code.co_name, None, None) for f in frames]


@contextlib.contextmanager
def _cheap_setter_checks() -> Iterator[None]:
    """kfp's PipelineTask setters (``set_cpu_limit``, ``set_env_variable``, ``set_retry`` ...)
    each call ``inspect.stack()`` only to name themselves in an error. That walks the whole
    stack and, for every frame without a source file (``python -m``'s ``<frozen runpy>``, an
    import's ``<frozen importlib>``), scans all of ``sys.modules``: with Paddle loaded (4,400
    modules) about 1.7 s of CPU per pipeline built under ``python -m`` (measured, AMD EPYC).
    While a pipeline is built, kfp's module gets an ``inspect`` whose ``stack()`` returns those
    two frames alone; anything else in kfp keeps the real module."""
    from kfp.dsl import pipeline_task

    if getattr(pipeline_task, "inspect", None) is not inspect:  # another kfp: leave it be
        yield
        return
    pipeline_task.inspect = _CallerNameOnly()  # type: ignore[assignment]
    try:
        yield
    finally:
        pipeline_task.inspect = inspect  # type: ignore[attr-defined]


def make_pipeline(
    gpus: int = 0,
    accelerator_type: str = "nvidia.com/gpu",
    resources: Mapping[str, Any] | None = None,
    image: str = IMAGE,
    backend: str | None = None,
    paddlejob: Mapping[str, Any] | None = None,
    params_file: str | Path = REPO / "params.yaml",
    retry: Mapping[str, Any] | None = None,
) -> Any:
    """The pipeline in ``image``; ``gpus`` > 0 runs train and qat in the GPU image with that
    many accelerators; ``resources`` (default: ``params.yaml: resources``) sizes every task;
    ``retry`` is the retry policy of the tasks that talk to the network (:data:`RETRY`).
    ``backend`` (default: :func:`train_backend` of ``params_file``) ``paddlejob`` puts the
    PaddleJob launcher where the train task is, mounting the shared volume of ``paddlejob``
    (default: ``params_file``'s section) at its ``mount_path``."""
    retry = RETRY if retry is None else retry
    compile_params = _load(params_file) if None in (resources, backend, paddlejob) else {}
    if resources is None:
        resources = compile_params.get("resources") or {}
    backend = train_backend(compile_params) if backend is None else backend
    if backend not in TRAIN_BACKENDS:
        raise ValueError(f"train backend {backend!r}: one of {TRAIN_BACKENDS}")
    if paddlejob is None:
        paddlejob = compile_params.get("paddlejob") or {}
    cpu_ops = ops(image)

    def step_task(name: str, sections: Any, tasks: Any, **values: Any) -> dsl.PipelineTask:
        gpu = gpus and name in GPU_STEPS
        op = ops(GPU_IMAGE)[name] if gpu else cpu_ops[name]
        task = wire(op, STEPS[name], sections, tasks, **values)
        # the image the step runs in: lineage (track) and the fetch-model image (deploy)
        task.set_env_variable("PADDLE_MLOPS_IMAGE", GPU_IMAGE if gpu else image)
        return with_resources(task, resources, name)

    def launcher_task(sections: Any, tasks: Any) -> dsl.PipelineTask:
        """The PaddleJob launcher in the train task's place: same inputs and outputs."""
        shared = pj.typed(paddlejob)  # compile time: the volume this pod mounts
        task = wire(
            cpu_ops["paddlejob_train_op"],
            STEPS["train"],
            sections,
            tasks,
            paddlejob=sections["paddlejob"],
            # the workers' cpu/memory: params.yaml resources.train, as for the train task
            worker_resources={**resources.get("default", {}), **resources.get("train", {})},
            # the run's id: in the job's name and owner annotation (a retry within the run
            # finds its job, another run gets its own; the task is never a cache hit)
            run=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        )
        task.set_env_variable(pj.IMAGE_ENV, image)  # the workers' image...
        task.set_env_variable(pj.GPU_IMAGE_ENV, GPU_IMAGE)  # ...with paddlejob.gpus_per_worker
        task.set_env_variable(pj.PVC_ENV, shared.pvc)
        task.set_env_variable(pj.MOUNT_ENV, shared.mount_path)
        kubernetes.mount_pvc(task, pvc_name=shared.pvc, mount_path=shared.mount_path)
        return with_resources(task, resources, "paddlejob_train")

    def _dag(sections: dict[str, Any]) -> None:
        # one pipeline parameter per params.yaml section; each step gets only its own
        task, ingest, track = sections["task"], sections["ingest"], sections["track"]
        build_in_cluster = sections["build_in_cluster"]
        # the run's id: on track's MLflow run, which the exit handler closes if the run fails
        exit_task = cpu_ops["record_failure_op"](track=track, pipeline_run=PIPELINE_RUN)
        with_resources(exit_task, resources, "record_failure")
        # a cache hit would record nothing: a failure with the same inputs is a new failure
        exit_task.set_retry(**retry).set_caching_options(False)
        _with_cluster_env(exit_task)
        with dsl.ExitHandler(exit_task, name="record-failures"):
            # a moving source: the uncached fingerprint keys ingest's cache on the bytes
            fingerprint_t = cpu_ops["fingerprint_op"](task=task, ingest=ingest).set_caching_options(
                False
            )
            with_resources(fingerprint_t, resources, "fingerprint")
            tasks: dict[str, Any] = {}
            for name in STEPS:
                if name in ("promote", "deploy"):
                    continue  # only for a blessed model, below
                if name == "train" and backend == "paddlejob":
                    tasks[name] = launcher_task(sections, tasks)  # later steps: unchanged
                    continue
                if name == "ingest":  # map over unit groups, reduce into the snapshot
                    tasks[name], fanout = ingest_fanout(cpu_ops, sections, fingerprint_t.output)
                    for t in fanout:
                        with_resources(t, resources, "ingest")
                        t.set_env_variable("PADDLE_MLOPS_IMAGE", image)
                    with_resources(tasks[name], resources, "ingest")
                    tasks[name].set_env_variable("PADDLE_MLOPS_IMAGE", image)
                    continue
                if name == "validate":  # map over shard groups, reduce and run the suites
                    tasks[name], shards = shard_fanout(
                        cpu_ops, sections, tasks["ingest"].outputs["data"]
                    )
                    for t in (*shards, tasks[name]):
                        with_resources(t, resources, "validate")
                        t.set_env_variable("PADDLE_MLOPS_IMAGE", image)
                    continue
                values = {}
                if name == "track":
                    values = {
                        "pipeline_run": PIPELINE_RUN,
                        "retrain_reason": sections["retrain_reason"],
                    }
                tasks[name] = step_task(name, sections, tasks, **values)
            for t in (fingerprint_t, tasks["ingest"], *fanout):
                t.set_retry(**retry)  # http(s) and s3 sources
                _with_cluster_env(t, s3=True)
            if gpus:  # train and qat on GPU nodes (compile --gpus N); a PaddleJob's
                # workers get theirs from paddlejob.gpus_per_worker, its launcher none
                for name in ("train", "qat") if backend == "step" else ("qat",):
                    tasks[name].set_accelerator_type(accelerator_type).set_accelerator_limit(gpus)
            for name in ("track", "register"):  # they talk to MLflow: retried, never cached
                tasks[name].set_retry(**retry).set_caching_options(False)
                _with_cluster_env(tasks[name])
            # only a blessed model gets its image pushed and the champion alias
            blessed = tasks["register"].outputs["Output"]
            with dsl.If(blessed == True, name="blessed"):  # noqa: E712
                with dsl.If(build_in_cluster == True, name="kaniko"):  # noqa: E712
                    kaniko = kaniko_build_op(
                        context=tasks["serving_image"].outputs["infra"],
                        destination=tasks["serving_image"].outputs["Output"],
                    )
                    with_resources(kaniko, resources, "kaniko_build").set_retry(**retry)
                    kubernetes.use_secret_as_volume(
                        kaniko, REGISTRY_PUSH_SECRET, mount_path=KANIKO_DOCKER_CONFIG
                    )
                    promoted = step_task(
                        "promote", sections, tasks, image_digest=kaniko.outputs["digest"]
                    )
                    deployed = step_task("deploy", sections, {**tasks, "promote": promoted})
                with dsl.Else(name="no-image-build"):  # kfp.local: validated, not pushed
                    promoted_local = step_task("promote", sections, tasks)
                    deployed_local = step_task(
                        "deploy", sections, {**tasks, "promote": promoted_local}
                    )
                # the champion is deployed right after it moved (rendered only without a
                # pushed image); both talk to MLflow: retried, never cached
                for t in (promoted, promoted_local, deployed, deployed_local):
                    t.set_retry(**retry).set_caching_options(False)
                    _with_cluster_env(t)
                # the cluster's branch: its env names mounted files kfp.local does not have
                _with_signing_key(promoted)
                _with_trusted_keys(deployed)

    on = " (train: a Kubeflow PaddleJob)" if backend == "paddlejob" else ""
    with _cheap_setter_checks():
        return dsl.pipeline(
            name="paddle-mlops-training",
            description=" → ".join(STEPS) + " (promote, deploy: blessed models only)" + on,
        )(_pipeline_function(pipeline_sections(backend), _dag))


def compile_pipeline(
    out: str | Path,
    gpus: int = 0,
    accelerator_type: str = "nvidia.com/gpu",
    image: str = IMAGE,
    params_file: str | Path = REPO / "params.yaml",
    backend: str | None = None,
) -> Path:
    """Compile the pipeline; resources, the train backend and the PaddleJob volume come from
    ``params_file`` (``backend`` overrides its ``train.distributed.backend``)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pipeline = make_pipeline(
        gpus, accelerator_type, image=image, backend=backend, params_file=params_file
    )
    compiler.Compiler().compile(pipeline, str(out))
    return out


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def pipeline_params(params: dict[str, Any], backend: str | None = None) -> dict[str, Any]:
    """params.yaml as the pipeline's arguments: one dict per section, nulls dropped (the
    step's default applies). ``paddlejob`` is an argument of a pipeline compiled for that
    backend (``backend``, default: :func:`train_backend` of ``params``), else not passed."""
    backend = train_backend(params) if backend is None else backend
    # resources: compile time; paddlejob: the launcher's, when compiled in
    unknown = sorted(
        set(params) - set(SECTIONS) - AFTER_DEPLOY_SECTIONS - {"resources", "paddlejob"}
    )
    if unknown:
        raise ValueError(f"params sections {unknown} are not parameters of the pipeline")
    return {s: _drop_nulls(params.get(s) or {}) for s in pipeline_sections(backend)}


def run_local(
    params: dict[str, Any],
    pipeline_root: str | Path,
    *,
    cache: bool = True,
    retry_backoff_s: float | None = None,
) -> Any:
    """The whole DAG on this machine: kfp.local, a subprocess per component, this venv.

    ``cache`` (default on, as on a KFP backend): a task whose inputs are those of an earlier
    successful task under the same ``pipeline_root`` reuses its outputs (the tasks marked
    uncached always run). ``retry_backoff_s`` replaces the first retry backoff (30 s)."""
    from kfp import local

    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(pipeline_root),
        enable_caching=cache,
    )
    backend = train_backend(params)
    pipeline = make_pipeline(
        backend=backend,
        paddlejob=params.get("paddlejob") or {},
        retry=retry_policy(retry_backoff_s),
    )
    return pipeline(**pipeline_params(params, backend))


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    from components.core.config import load_params

    parser = argparse.ArgumentParser(
        prog="python -m pipelines.training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_compile = sub.add_parser("compile")
    p_compile.add_argument("--out", default="pipelines/compiled/training.yaml")
    p_compile.add_argument("--gpus", type=int, default=0, help="accelerators for train and qat")
    p_compile.add_argument("--accelerator-type", default="nvidia.com/gpu")
    p_compile.add_argument(
        "--params",
        default=str(REPO / "params.yaml"),
        help="read at compile time: resources, train.distributed.backend (paddlejob: the "
        "PaddleJob launcher trains) and the paddlejob volume",
    )
    p_compile.add_argument(
        "--image",
        default=IMAGE,
        help="the component image every CPU task runs in; pin it by digest "
        "(REPO@sha256:...): deploy renders it as the fetch-model image",
    )
    p_local = sub.add_parser("local")
    p_local.add_argument("--params", default="params.yaml")
    p_local.add_argument("--pipeline-root", default="outputs/kfp-local")
    p_local.add_argument(
        "--no-cache",
        action="store_true",
        help="run every task (default: reuse the outputs of a task run before with the same "
        "inputs under --pipeline-root, as a KFP backend does)",
    )
    p_local.add_argument(
        "--retry-backoff-s",
        type=float,
        default=None,
        help="first backoff of the network tasks' retries (default: 30)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, force=True)
    if args.command == "compile":
        out = compile_pipeline(
            args.out, args.gpus, args.accelerator_type, args.image, params_file=args.params
        )
        logging.info("compiled %s", out)
    else:
        params = load_params(args.params)
        ingest = params.get("ingest", {})
        if ingest.get("kind") != "builtin" and "://" not in ingest.get("source", ""):
            ingest["source"] = str(Path(ingest["source"]).resolve())  # subprocess cwd differs
        run_local(
            json.loads(json.dumps(params)),
            Path(args.pipeline_root).resolve(),
            cache=not args.no_cache,
            retry_backoff_s=args.retry_backoff_s,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
