"""The training pipeline's tasks: each step's task wired to its inputs' sources, ingest and
validate as map and reduce, the PaddleJob launcher in the train task's place when compiled for
it, the exit handler, the blessed branch, and every task's settings (images, resources,
retries, caching, the cluster's env, secrets and accelerators)."""

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kfp import dsl, kubernetes

from components.kernel.kfp import kfp_component
from components.kernel.params_schema import Resources
from components.kernel.step import Step, all_steps
from pipelines import paddlejob as pj
from pipelines.training_cluster import (
    KANIKO_DOCKER_CONFIG,
    REGISTRY_PUSH_SECRET,
    task_resources,
    with_cluster_env,
    with_resources,
    with_signing_key,
    with_trusted_keys,
)
from pipelines.training_components import (
    fingerprint_op,
    ingest_fanout,
    ingest_map_op,
    ingest_op,
    ingest_plan_op,
    kaniko_build_op,
    record_failure_op,
    shard_fanout,
    validate_map_op,
    validate_op,
    validate_plan_op,
)

IMAGE = "registry.example.com/paddle-mlops/components:latest"
# components/Containerfile.gpu: Paddle's CUDA wheel, for the steps that train (compile --gpus N)
GPU_IMAGE = "registry.example.com/paddle-mlops/components-gpu:latest"
GPU_STEPS = ("train", "qat")
STEPS: dict[str, Step] = {s.name: s for s in all_steps()}
PIPELINE_RUN = dsl.PIPELINE_JOB_ID_PLACEHOLDER  # this run's id, resolved by the backend


def wire(
    op: Any, step: Step, sections: Mapping[str, Any], tasks: Mapping[str, Any], **values: Any
) -> dsl.PipelineTask:
    """The task of ``step``: its sections, and each input from the task of its source."""
    inputs = {}
    for port in step.inputs:
        producer, output = (port.source or "").split(".")
        inputs[port.name] = tasks[producer].outputs[output]
    return op(**{s: sections[s] for s in step.sections}, **inputs, **values)


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


@dataclass(frozen=True)
class TrainingDag:
    """The pipeline's body, called by kfp with the pipeline's parameters (one per params.yaml
    section; each step gets only its own): the tasks, their wiring and their settings."""

    gpus: int
    accelerator_type: str
    resources: Resources
    image: str
    backend: str
    paddlejob: pj.PaddleJobParams  # typed at compile time (its volume is mounted)
    retry: Mapping[str, Any]
    cpu_ops: Mapping[str, Any]

    def __call__(self, sections: dict[str, Any]) -> None:
        resources, retry, cpu_ops = self.resources, self.retry, self.cpu_ops
        task, ingest, track = sections["task"], sections["ingest"], sections["track"]
        # the run's id: on track's MLflow run, which the exit handler closes if the run fails
        exit_task = cpu_ops["record_failure_op"](track=track, pipeline_run=PIPELINE_RUN)
        with_resources(exit_task, resources, "record_failure")
        # a cache hit would record nothing: a failure with the same inputs is a new failure
        exit_task.set_retry(**retry).set_caching_options(False)
        with_cluster_env(exit_task)
        with dsl.ExitHandler(exit_task, name="record-failures"):
            # a moving source: the uncached fingerprint keys ingest's cache on the bytes
            fingerprint_t = cpu_ops["fingerprint_op"](task=task, ingest=ingest).set_caching_options(
                False
            )
            with_resources(fingerprint_t, resources, "fingerprint")
            tasks, fanout = self.step_tasks(sections, fingerprint_t)
            for t in (fingerprint_t, tasks["ingest"], *fanout):
                t.set_retry(**retry)  # http(s) and s3 sources
                with_cluster_env(t, s3=True)
            if self.gpus:  # train and qat on GPU nodes (compile --gpus N); a PaddleJob's
                # workers get theirs from paddlejob.gpus_per_worker, its launcher none
                for name in ("train", "qat") if self.backend == "step" else ("qat",):
                    tasks[name].set_accelerator_type(self.accelerator_type).set_accelerator_limit(
                        self.gpus
                    )
            for name in ("track", "register"):  # they talk to MLflow: retried, never cached
                tasks[name].set_retry(**retry).set_caching_options(False)
                with_cluster_env(tasks[name])
            self.blessed(sections, tasks)

    def step_tasks(
        self, sections: dict[str, Any], fingerprint_t: dsl.PipelineTask
    ) -> tuple[dict[str, Any], list[dsl.PipelineTask]]:
        """The task of every step but promote and deploy, in the steps' order; also the
        ingest map's own tasks (plan, map)."""
        tasks: dict[str, Any] = {}
        fanout: list[dsl.PipelineTask] = []
        for name in STEPS:
            if name in ("promote", "deploy"):
                continue  # only for a blessed model, below
            if name == "train" and self.backend == "paddlejob":
                tasks[name] = self.launcher_task(sections, tasks)  # later steps: unchanged
                continue
            if name == "ingest":  # map over unit groups, reduce into the snapshot
                tasks[name], fanout = ingest_fanout(self.cpu_ops, sections, fingerprint_t.output)
                for t in fanout:
                    with_resources(t, self.resources, "ingest")
                    t.set_env_variable("PADDLE_MLOPS_IMAGE", self.image)
                with_resources(tasks[name], self.resources, "ingest")
                tasks[name].set_env_variable("PADDLE_MLOPS_IMAGE", self.image)
                continue
            if name == "validate":  # map over shard groups, reduce and run the suites
                tasks[name], shards = shard_fanout(
                    self.cpu_ops, sections, tasks["ingest"].outputs["data"]
                )
                for t in (*shards, tasks[name]):
                    with_resources(t, self.resources, "validate")
                    t.set_env_variable("PADDLE_MLOPS_IMAGE", self.image)
                continue
            values = {}
            if name == "track":
                values = {
                    "pipeline_run": PIPELINE_RUN,
                    "retrain_reason": sections["retrain_reason"],
                }
            tasks[name] = self.step_task(name, sections, tasks, **values)
        return tasks, fanout

    def blessed(self, sections: dict[str, Any], tasks: dict[str, Any]) -> None:
        """Only a blessed model gets its image pushed (in the cluster, with kaniko) and the
        champion alias, then is deployed."""
        blessed = tasks["register"].outputs["Output"]
        build_in_cluster = sections["build_in_cluster"]
        with dsl.If(blessed == True, name="blessed"):  # noqa: E712
            with dsl.If(build_in_cluster == True, name="kaniko"):  # noqa: E712
                kaniko = kaniko_build_op(
                    context=tasks["serving_image"].outputs["infra"],
                    destination=tasks["serving_image"].outputs["Output"],
                )
                with_resources(kaniko, self.resources, "kaniko_build").set_retry(**self.retry)
                kubernetes.use_secret_as_volume(
                    kaniko, REGISTRY_PUSH_SECRET, mount_path=KANIKO_DOCKER_CONFIG
                )
                promoted = self.step_task(
                    "promote", sections, tasks, image_digest=kaniko.outputs["digest"]
                )
                deployed = self.step_task("deploy", sections, {**tasks, "promote": promoted})
            with dsl.Else(name="no-image-build"):  # kfp.local: validated, not pushed
                promoted_local = self.step_task("promote", sections, tasks)
                deployed_local = self.step_task(
                    "deploy", sections, {**tasks, "promote": promoted_local}
                )
            # the champion is deployed right after it moved (rendered only without a
            # pushed image); both talk to MLflow: retried, never cached
            for t in (promoted, promoted_local, deployed, deployed_local):
                t.set_retry(**self.retry).set_caching_options(False)
                with_cluster_env(t)
            # the cluster's branch: its env names mounted files kfp.local does not have
            with_signing_key(promoted)
            with_trusted_keys(deployed)

    def step_task(self, name: str, sections: Any, tasks: Any, **values: Any) -> dsl.PipelineTask:
        gpu = self.gpus and name in GPU_STEPS
        op = ops(GPU_IMAGE)[name] if gpu else self.cpu_ops[name]
        task = wire(op, STEPS[name], sections, tasks, **values)
        # the image the step runs in: lineage (track) and the fetch-model image (deploy)
        task.set_env_variable("PADDLE_MLOPS_IMAGE", GPU_IMAGE if gpu else self.image)
        return with_resources(task, self.resources, name)

    def launcher_task(self, sections: Any, tasks: Any) -> dsl.PipelineTask:
        """The PaddleJob launcher in the train task's place: same inputs and outputs."""
        resources = self.resources
        shared = self.paddlejob  # compile time: the volume this pod mounts
        task = wire(
            self.cpu_ops["paddlejob_train_op"],
            STEPS["train"],
            sections,
            tasks,
            paddlejob=sections["paddlejob"],
            # the workers' cpu/memory: params.yaml resources.train, as for the train task
            worker_resources=task_resources(resources, "train"),
            # the run's id: in the job's name and owner annotation (a retry within the run
            # finds its job, another run gets its own; the task is never a cache hit)
            run=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        )
        task.set_env_variable(pj.IMAGE_ENV, self.image)  # the workers' image...
        task.set_env_variable(pj.GPU_IMAGE_ENV, GPU_IMAGE)  # ...with paddlejob.gpus_per_worker
        task.set_env_variable(pj.PVC_ENV, shared.pvc)
        task.set_env_variable(pj.MOUNT_ENV, shared.mount_path)
        kubernetes.mount_pvc(task, pvc_name=shared.pvc, mount_path=shared.mount_path)
        return with_resources(task, resources, "paddlejob_train")
