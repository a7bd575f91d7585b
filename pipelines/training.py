"""The training pipeline as a Kubeflow Pipelines v2 DAG over the same step functions.

Every component is a thin lightweight-Python wrapper: it imports a step from ``components``
and calls its ``run`` function with paths of KFP artifacts; no step logic lives here. The
same DAG compiles for a cluster (``base_image`` = the component image) and runs on this
machine through ``kfp.local.SubprocessRunner`` (see ``run_local``).

    python -m pipelines.training compile --out pipelines/compiled/training.yaml
    python -m pipelines.training local --params params.yaml      # kfp.local, this machine
"""

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kfp import compiler, dsl
from kfp.dsl import (
    HTML,
    Artifact,
    ClassificationMetrics,
    Dataset,
    Input,
    Metrics,
    Model,
    Output,
)

IMAGE = "registry.example.com/paddle-mlops/components:latest"
REPO = Path(__file__).resolve().parents[1]


def _component(fn):  # one image, no pip install of kfp at pod start
    return dsl.component(base_image=IMAGE, install_kfp_package=False)(fn)


@_component
def fingerprint_op(params: dict) -> str:
    """sha256 of the raw source, recomputed every run (uncached): ingest's cache key."""
    from components.config import section
    from components.ingest import IngestParams, source_fingerprint

    return source_fingerprint(section(params, "ingest", IngestParams))


@_component
def ingest_op(params: dict, source_sha256: str, data: Output[Dataset]):
    import json
    import shutil
    from pathlib import Path

    from components.artifacts import StepError, combined_sha256
    from components.config import section
    from components.ingest import IngestParams, run

    ingest = section(params, "ingest", IngestParams)
    run(ingest, data.path)
    manifest = json.loads((Path(data.path) / "manifest.json").read_text())
    if combined_sha256(manifest["input_sha256"]) != source_sha256:
        shutil.rmtree(data.path)
        raise StepError(f"{ingest.source} changed while the pipeline ran; run it again")


@_component
def validate_op(
    params: dict, data: Input[Dataset], report: Output[Artifact], data_docs: Output[HTML]
):
    import shutil
    from pathlib import Path

    from components.config import section
    from components.validate import ValidateParams, run

    run(section(params, "validate", ValidateParams), data.path, report.path)
    shutil.copy(Path(report.path) / "data_docs" / "index.html", data_docs.path)


@_component
def train_op(
    params: dict,
    data: Input[Dataset],
    gate: Input[Artifact],
    model: Output[Model],
    metrics: Output[Metrics],
):
    import json
    from pathlib import Path

    from components.cli import task_from_params
    from components.config import section
    from components.train import TrainParams, run

    out = Path(model.path)
    result = run(
        section(params, "train", TrainParams),
        task_from_params(params),
        data.path,
        out,
        checkpoint_dir=out.parent / "checkpoints",
        metrics_file=out / "metrics.json",
        plots_file=out / "curves.csv",
        task_params=params.get("task", {}),
    )
    for key, value in json.loads((out / "metrics.json").read_text()).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics.log_metric(key, value)
    metrics.log_metric("epochs_run", result.epochs_run)


@_component
def qat_op(
    params: dict,
    data: Input[Dataset],
    model: Input[Model],
    int8: Output[Model],
    metrics: Output[Metrics],
):
    import json
    from pathlib import Path

    from components.cli import task_from_params
    from components.config import section
    from components.qat import QatParams, run

    out = Path(int8.path)
    run(
        section(params, "qat", QatParams),
        task_from_params(params),
        model.path,
        data.path,
        out,
        metrics_file=out / "metrics.json",
    )
    for key, value in json.loads((out / "metrics.json").read_text()).items():
        metrics.log_metric(key, float(value))


@_component
def export_op(
    params: dict,
    data: Input[Dataset],
    model: Input[Model],
    int8: Input[Model],
    exported: Output[Model],
):
    from components.cli import task_from_params
    from components.config import section
    from components.export import ExportParams, run

    run(
        section(params, "export", ExportParams),
        task_from_params(params),
        model.path,
        data.path,
        exported.path,
        qat_dir=int8.path,
    )


@_component
def evaluate_op(
    params: dict,
    data: Input[Dataset],
    exported: Input[Model],
    evaluation: Output[Artifact],
    metrics: Output[Metrics],
    confusion: Output[ClassificationMetrics],
):
    import json
    from pathlib import Path

    from components.cli import task_from_params
    from components.config import section
    from components.dataset import read_label_names
    from components.evaluate import EvaluateParams, run

    out = Path(evaluation.path)
    result = run(
        section(params, "evaluate", EvaluateParams),
        task_from_params(params),
        exported.path,
        data.path,
        out,
        metrics_file=out / "metrics.json",
        plots_file=out / "confusion.csv",
    )
    for key in ("accuracy", "macro_f1", "latency_ms_b1", "latency_ms_b64"):
        metrics.log_metric(key, float(result.metrics[key]))
    confusion.log_confusion_matrix(read_label_names(data.path), result.report["confusion_matrix"])
    json.dumps(result.metrics)


@_component
def serving_image_op(
    params: dict, data: Input[Dataset], exported: Input[Model], infra: Output[Artifact]
) -> str:
    from components.cli import task_from_params
    from components.config import section
    from components.serving_image import ServingImageParams, run

    result = run(
        section(params, "serving_image", ServingImageParams),
        task_from_params(params),
        exported.path,
        data.path,
        infra.path,
    )
    return result.image


@_component
def track_op(
    params: dict,
    experiment: str,
    data: Input[Dataset],
    report: Input[Artifact],
    model: Input[Model],
    int8: Input[Model],
    exported: Input[Model],
    evaluation: Input[Artifact],
    infra: Input[Artifact],
    run_info: Output[Artifact],
):
    import shutil
    import tempfile
    from pathlib import Path

    from components.config import section
    from components.track import StepOutputs, TrackParams, run

    with tempfile.TemporaryDirectory() as tmp:
        metrics_dir, plots_dir = Path(tmp) / "metrics", Path(tmp) / "plots"
        metrics_dir.mkdir()
        plots_dir.mkdir()
        shutil.copy(Path(model.path) / "metrics.json", metrics_dir / "train.json")
        shutil.copy(Path(int8.path) / "metrics.json", metrics_dir / "qat.json")
        shutil.copy(Path(evaluation.path) / "metrics.json", metrics_dir / "evaluate.json")
        shutil.copy(Path(model.path) / "curves.csv", plots_dir / "train.csv")
        shutil.copy(Path(evaluation.path) / "confusion.csv", plots_dir / "confusion.csv")
        outputs = StepOutputs(
            ingest=Path(data.path),
            validate=Path(report.path),
            train=Path(model.path),
            qat=Path(int8.path),
            export=Path(exported.path),
            evaluate=Path(evaluation.path),
            serving_image=Path(infra.path),
            metrics=metrics_dir,
            plots=plots_dir,
        )
        track = section(params, "track", TrackParams)
        track = TrackParams(experiment=experiment or track.experiment, run_name_prefix="kfp")
        run(track, params, outputs, run_info.path)


@_component
def register_op(
    params: dict, data: Input[Dataset], run_info: Input[Artifact], registration: Output[Artifact]
) -> bool:
    import dataclasses
    from pathlib import Path

    from components.cli import task_from_params
    from components.config import section
    from components.register import RegisterParams, run

    register = dataclasses.replace(
        section(params, "register", RegisterParams), auto_promote=False
    )  # promotion is the dsl.If branch
    result = run(
        register,
        task_from_params(params),
        Path(run_info.path) / "run.json",
        data.path,
        registration.path,
    )
    return result.blessing.blessed


@_component
def promote_op(params: dict, registration: Input[Artifact], image_digest: str):
    import json
    from pathlib import Path

    from components.cli import task_from_params
    from components.config import section
    from components.register import RegisterParams, Registry, _client, model_name

    register = section(params, "register", RegisterParams)
    info = json.loads((Path(registration.path) / "registration.json").read_text())
    blessing = json.loads((Path(registration.path) / "blessing.json").read_text())
    champion = blessing.get("champion")
    registry = Registry(_client(), model_name(register, task_from_params(params)), register)
    if image_digest:  # the pushed image's digest flows back into the version's lineage
        registry.client.set_model_version_tag(
            registry.name, str(info["version"]), "serving_image_digest", image_digest.strip()
        )
        registry.client.set_model_version_tag(
            registry.name, str(info["version"]), "serving_image_built", "true"
        )
    registry.promote(
        info["version"],
        reason="blessed by the KFP pipeline",
        expected_champion=champion["version"] if champion else None,
    )


RETRY = {"num_retries": 3, "backoff_duration": "30s", "backoff_factor": 2.0}
MLFLOW_CONFIG_MAP = "mlflow-client-env"  # k8s/mlflow/client-env.yaml
MLFLOW_AUTH_SECRET = "mlflow-auth"  # optional: basic auth of the tracking server
S3_SECRET = "pipeline-s3"  # optional: credentials of s3:// ingest sources


def _with_cluster_env(task: dsl.PipelineTask, *, s3: bool = False) -> dsl.PipelineTask:
    """Tracking URI from the ConfigMap, credentials from Secrets (never in the spec)."""
    from kfp import kubernetes

    kubernetes.use_config_map_as_env(
        task, MLFLOW_CONFIG_MAP, {"MLFLOW_TRACKING_URI": "MLFLOW_TRACKING_URI"}
    )
    kubernetes.use_secret_as_env(
        task,
        MLFLOW_AUTH_SECRET,
        {"username": "MLFLOW_TRACKING_USERNAME", "password": "MLFLOW_TRACKING_PASSWORD"},
        optional=True,
    )
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


@_component
def record_failure_op(params: dict, experiment: str, status: dsl.PipelineTaskFinalStatus):
    """Exit handler: a failed or cancelled run leaves an MLflow run saying so."""
    if status.state == "SUCCEEDED":
        return
    import mlflow

    from components.track import tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(experiment or params.get("track", {}).get("experiment", "default"))
    with mlflow.start_run(
        run_name="failed-pipeline-run",
        tags={
            "pipeline_state": str(status.state),
            "pipeline_job": str(status.pipeline_job_resource_name),
        },
    ):
        mlflow.log_text(str(status.error_message), "error.txt")
        mlflow.set_tag("mlflow.runStatus", "FAILED")
    client = mlflow.MlflowClient()
    last = client.search_runs(
        [
            mlflow.get_experiment_by_name(
                experiment or params.get("track", {}).get("experiment", "default")
            ).experiment_id
        ],
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )[0]
    client.set_terminated(last.info.run_id, status="FAILED")


KANIKO_IMAGE = "gcr.io/kaniko-project/executor:v1.23.2"


@dsl.container_component
def kaniko_build_op(context: Input[Artifact], destination: str, digest: dsl.OutputPath(str)):
    """Build and push the serving image from the context serving_image prepared."""
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


def make_pipeline(gpus: int = 0, accelerator_type: str = "nvidia.com/gpu") -> Any:
    """The pipeline; ``gpus`` > 0 makes train and qat request that many accelerators."""

    def _training_pipeline(params: dict, experiment: str = "", build_in_cluster: bool = False):
        exit_task = record_failure_op(params=params, experiment=experiment)
        _with_cluster_env(exit_task)
        with dsl.ExitHandler(exit_task, name="record-failures"):
            # a moving source: the uncached fingerprint keys ingest's cache on the bytes
            fingerprint = fingerprint_op(params=params).set_caching_options(False)
            ingest = ingest_op(params=params, source_sha256=fingerprint.output)
            for task in (fingerprint, ingest):
                task.set_retry(**RETRY)  # http(s) and s3 sources
                _with_cluster_env(task, s3=True)
            validate = validate_op(params=params, data=ingest.outputs["data"])
            train = train_op(
                params=params, data=ingest.outputs["data"], gate=validate.outputs["report"]
            )
            qat = qat_op(params=params, data=ingest.outputs["data"], model=train.outputs["model"])
            if gpus:  # train and qat on GPU nodes (compile --gpus N)
                for task in (train, qat):
                    task.set_accelerator_type(accelerator_type).set_accelerator_limit(gpus)
            export = export_op(
                params=params,
                data=ingest.outputs["data"],
                model=train.outputs["model"],
                int8=qat.outputs["int8"],
            )
            evaluate = evaluate_op(
                params=params, data=ingest.outputs["data"], exported=export.outputs["exported"]
            )
            serving = serving_image_op(
                params=params, data=ingest.outputs["data"], exported=export.outputs["exported"]
            )
            track = track_op(
                params=params,
                experiment=experiment,
                data=ingest.outputs["data"],
                report=validate.outputs["report"],
                model=train.outputs["model"],
                int8=qat.outputs["int8"],
                exported=export.outputs["exported"],
                evaluation=evaluate.outputs["evaluation"],
                infra=serving.outputs["infra"],
            )
            track.set_retry(**RETRY).set_caching_options(False)
            _with_cluster_env(track)
            register = register_op(
                params=params, data=ingest.outputs["data"], run_info=track.outputs["run_info"]
            )
            register.set_retry(**RETRY).set_caching_options(False)
            _with_cluster_env(register)
            # only a blessed model gets an image and the champion alias
            with dsl.If(register.outputs["Output"] == True, name="blessed"):  # noqa: E712
                with dsl.If(build_in_cluster == True, name="kaniko"):  # noqa: E712
                    kaniko = kaniko_build_op(
                        context=serving.outputs["infra"], destination=serving.outputs["Output"]
                    )
                    kaniko.set_retry(**RETRY)
                    promoted = promote_op(
                        params=params,
                        registration=register.outputs["registration"],
                        image_digest=kaniko.outputs["digest"],
                    )
                with dsl.Else(name="no-image-build"):  # kfp.local: validated, not pushed
                    promoted_local = promote_op(
                        params=params,
                        registration=register.outputs["registration"],
                        image_digest="",
                    )
                for promote in (promoted, promoted_local):
                    promote.set_retry(**RETRY).set_caching_options(False)
                    _with_cluster_env(promote)

    return dsl.pipeline(
        name="paddle-mlops-training",
        description="ingest → validate → train → qat → export → evaluate / serving image → "
        "track → register → (blessed) promote",
    )(_training_pipeline)


training_pipeline = make_pipeline()


def compile_pipeline(
    out: str | Path, gpus: int = 0, accelerator_type: str = "nvidia.com/gpu"
) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(make_pipeline(gpus, accelerator_type), str(out))
    return out


def pipeline_params(params: dict[str, Any]) -> dict[str, Any]:
    """params.yaml as a KFP parameter: nulls dropped (the step's default applies)."""
    if isinstance(params, dict):
        return {k: pipeline_params(v) for k, v in params.items() if v is not None}
    if isinstance(params, list):
        return [pipeline_params(v) for v in params]
    return params


def run_local(params: dict[str, Any], pipeline_root: str | Path) -> Any:
    """The whole DAG on this machine: kfp.local, a subprocess per component, this venv."""
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root))
    return make_pipeline()(
        params=pipeline_params(params), experiment=params.get("track", {}).get("experiment", "")
    )


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    from components.config import load_params

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
    p_local = sub.add_parser("local")
    p_local.add_argument("--params", default="params.yaml")
    p_local.add_argument("--pipeline-root", default="outputs/kfp-local")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, force=True)
    if args.command == "compile":
        logging.info("compiled %s", compile_pipeline(args.out, args.gpus, args.accelerator_type))
    else:
        params = load_params(args.params)
        ingest = params.get("ingest", {})
        if ingest.get("kind") != "builtin" and "://" not in ingest.get("source", ""):
            ingest["source"] = str(Path(ingest["source"]).resolve())  # subprocess cwd differs
        run_local(json.loads(json.dumps(params)), Path(args.pipeline_root).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
