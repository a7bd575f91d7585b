"""The training pipeline's own components (beside the steps', generated from their
declarations): the source fingerprint, ingest and validate as map and reduce, the exit
handler that records a failed run, and the in-cluster image build. Their bodies run in the
component image; kfp compiles each function's source into the pipeline."""

from collections.abc import Mapping
from typing import Any

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Output


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
