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
def fingerprint_op(ingest: dict) -> str:
    """sha256 of the raw source, recomputed every run (uncached): ingest's cache key."""
    from components.config import section
    from components.ingest import IngestParams, source_fingerprint

    return source_fingerprint(section({"ingest": ingest}, "ingest", IngestParams))


@_component
def ingest_op(ingest: dict, source_sha256: str, data: Output[Dataset]):
    import json
    import shutil
    from pathlib import Path

    from components.artifacts import StepError, combined_sha256
    from components.config import section
    from components.ingest import IngestParams, run

    params = section({"ingest": ingest}, "ingest", IngestParams)
    run(params, data.path)
    manifest = json.loads((Path(data.path) / "manifest.json").read_text())
    if combined_sha256(manifest["input_sha256"]) != source_sha256:
        shutil.rmtree(data.path)
        raise StepError(f"{params.source} changed while the pipeline ran; run it again")


@_component
def validate_op(
    validate: dict, data: Input[Dataset], report: Output[Artifact], data_docs: Output[HTML]
):
    import shutil
    from pathlib import Path

    from components.config import section
    from components.validate import ValidateParams, run

    run(section({"validate": validate}, "validate", ValidateParams), data.path, report.path)
    shutil.copy(Path(report.path) / "data_docs" / "index.html", data_docs.path)


@_component
def train_op(
    task: dict,
    train: dict,
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

    params = {"task": task, "train": train}
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
    task: dict,
    qat: dict,
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

    params = {"task": task, "qat": qat}
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
    task: dict,
    export: dict,
    data: Input[Dataset],
    model: Input[Model],
    int8: Input[Model],
    exported: Output[Model],
):
    from components.cli import task_from_params
    from components.config import section
    from components.export import ExportParams, run

    params = {"task": task, "export": export}
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
    task: dict,
    evaluate: dict,
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

    params = {"task": task, "evaluate": evaluate}
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
    for key, value in result.metrics.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics.log_metric(key, float(value))
    confusion.log_confusion_matrix(read_label_names(data.path), result.report["confusion_matrix"])
    json.dumps(result.metrics)


@_component
def serving_image_op(
    task: dict,
    serving_image: dict,
    data: Input[Dataset],
    exported: Input[Model],
    infra: Output[Artifact],
) -> str:
    from components.cli import task_from_params
    from components.config import section
    from components.serving_image import ServingImageParams, run

    params = {"task": task, "serving_image": serving_image}
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
    ingest: dict,
    validate: dict,
    task: dict,
    train: dict,
    qat: dict,
    export: dict,
    evaluate: dict,
    serving_image: dict,
    track: dict,
    register: dict,
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
        # the MLflow run records every section, as `dvc repro` does
        params = {
            "ingest": ingest,
            "validate": validate,
            "task": task,
            "train": train,
            "qat": qat,
            "export": export,
            "evaluate": evaluate,
            "serving_image": serving_image,
            "track": track,
            "register": register,
        }
        settings = section(params, "track", TrackParams)
        settings = TrackParams(experiment=experiment or settings.experiment, run_name_prefix="kfp")
        run(settings, params, outputs, run_info.path)


@_component
def register_op(
    task: dict,
    register: dict,
    data: Input[Dataset],
    run_info: Input[Artifact],
    registration: Output[Artifact],
) -> bool:
    import dataclasses
    from pathlib import Path

    from components.cli import task_from_params
    from components.config import section
    from components.register import RegisterParams, run

    params = {"task": task, "register": register}
    settings = dataclasses.replace(
        section(params, "register", RegisterParams), auto_promote=False
    )  # promotion is the dsl.If branch
    result = run(
        settings,
        task_from_params(params),
        Path(run_info.path) / "run.json",
        data.path,
        registration.path,
    )
    return result.blessing.blessed


@_component
def promote_op(task: dict, register: dict, registration: Input[Artifact], image_digest: str):
    import json
    from pathlib import Path

    from components.cli import task_from_params
    from components.config import section
    from components.register import RegisterParams, model_name
    from components.registry import Registry, client

    params = {"task": task, "register": register}
    settings = section(params, "register", RegisterParams)
    info = json.loads((Path(registration.path) / "registration.json").read_text())
    blessing = json.loads((Path(registration.path) / "blessing.json").read_text())
    champion = blessing.get("champion")
    registry = Registry(client(), model_name(settings, task_from_params(params)), settings)
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
def record_failure_op(track: dict, experiment: str, status: dsl.PipelineTaskFinalStatus):
    """Exit handler: a failed or cancelled run leaves an MLflow run saying so."""
    if status.state == "SUCCEEDED":
        return
    import mlflow

    from components.registry import tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(experiment or track.get("experiment", "default"))
    mlflow.start_run(
        run_name="failed-pipeline-run",
        tags={
            "pipeline_state": str(status.state),
            "pipeline_job": str(status.pipeline_job_resource_name),
        },
    )
    mlflow.log_text(str(status.error_message), "error.txt")
    mlflow.end_run(status="FAILED")  # this run, not whichever ran last in the experiment


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

    def _training_pipeline(
        ingest: dict,
        validate: dict,
        task: dict,
        train: dict,
        qat: dict,
        export: dict,
        evaluate: dict,
        serving_image: dict,
        track: dict,
        register: dict,
        experiment: str = "",
        build_in_cluster: bool = False,
    ):
        # one pipeline parameter per params.yaml section; each step gets only the sections it
        # reads, so its cache key changes only when they do
        exit_task = record_failure_op(track=track, experiment=experiment)
        _with_cluster_env(exit_task)
        with dsl.ExitHandler(exit_task, name="record-failures"):
            # a moving source: the uncached fingerprint keys ingest's cache on the bytes
            fingerprint_t = fingerprint_op(ingest=ingest).set_caching_options(False)
            ingest_t = ingest_op(ingest=ingest, source_sha256=fingerprint_t.output)
            for t in (fingerprint_t, ingest_t):
                t.set_retry(**RETRY)  # http(s) and s3 sources
                _with_cluster_env(t, s3=True)
            data = ingest_t.outputs["data"]
            validate_t = validate_op(validate=validate, data=data)
            train_t = train_op(task=task, train=train, data=data, gate=validate_t.outputs["report"])
            qat_t = qat_op(task=task, qat=qat, data=data, model=train_t.outputs["model"])
            if gpus:  # train and qat on GPU nodes (compile --gpus N)
                for t in (train_t, qat_t):
                    t.set_accelerator_type(accelerator_type).set_accelerator_limit(gpus)
            export_t = export_op(
                task=task,
                export=export,
                data=data,
                model=train_t.outputs["model"],
                int8=qat_t.outputs["int8"],
            )
            exported = export_t.outputs["exported"]
            evaluate_t = evaluate_op(task=task, evaluate=evaluate, data=data, exported=exported)
            serving_t = serving_image_op(
                task=task, serving_image=serving_image, data=data, exported=exported
            )
            track_t = track_op(
                ingest=ingest,
                validate=validate,
                task=task,
                train=train,
                qat=qat,
                export=export,
                evaluate=evaluate,
                serving_image=serving_image,
                track=track,
                register=register,
                experiment=experiment,
                data=data,
                report=validate_t.outputs["report"],
                model=train_t.outputs["model"],
                int8=qat_t.outputs["int8"],
                exported=exported,
                evaluation=evaluate_t.outputs["evaluation"],
                infra=serving_t.outputs["infra"],
            )
            track_t.set_retry(**RETRY).set_caching_options(False)
            _with_cluster_env(track_t)
            register_t = register_op(
                task=task, register=register, data=data, run_info=track_t.outputs["run_info"]
            )
            register_t.set_retry(**RETRY).set_caching_options(False)
            _with_cluster_env(register_t)
            # only a blessed model gets an image and the champion alias
            with dsl.If(register_t.outputs["Output"] == True, name="blessed"):  # noqa: E712
                with dsl.If(build_in_cluster == True, name="kaniko"):  # noqa: E712
                    kaniko = kaniko_build_op(
                        context=serving_t.outputs["infra"], destination=serving_t.outputs["Output"]
                    )
                    kaniko.set_retry(**RETRY)
                    promoted = promote_op(
                        task=task,
                        register=register,
                        registration=register_t.outputs["registration"],
                        image_digest=kaniko.outputs["digest"],
                    )
                with dsl.Else(name="no-image-build"):  # kfp.local: validated, not pushed
                    promoted_local = promote_op(
                        task=task,
                        register=register,
                        registration=register_t.outputs["registration"],
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


SECTIONS = (
    "ingest",
    "validate",
    "task",
    "train",
    "qat",
    "export",
    "evaluate",
    "serving_image",
    "track",
    "register",
)  # the pipeline's parameters: one per params.yaml section


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def pipeline_params(params: dict[str, Any]) -> dict[str, Any]:
    """params.yaml as the pipeline's arguments: one dict per section, nulls dropped (the
    step's default applies)."""
    unknown = sorted(set(params) - set(SECTIONS))
    if unknown:
        raise ValueError(f"params sections {unknown} are not parameters of the pipeline")
    return {s: _drop_nulls(params.get(s) or {}) for s in SECTIONS}


def run_local(params: dict[str, Any], pipeline_root: str | Path) -> Any:
    """The whole DAG on this machine: kfp.local, a subprocess per component, this venv."""
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root))
    return make_pipeline()(
        **pipeline_params(params), experiment=params.get("track", {}).get("experiment", "")
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
