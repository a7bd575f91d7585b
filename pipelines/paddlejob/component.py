"""The launcher as a KFP component: its body runs :func:`launch` on the artifacts' paths
(see the package's docstring)."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from pipelines.paddlejob.launcher import launch
from pipelines.paddlejob.spec import Outputs

# --------------------------------------------------------------------------- KFP


def kfp_main(args: Mapping[str, Any]) -> None:
    """Body of the KFP component: :func:`launch` on the artifacts' paths, then the metrics
    KFP shows (as the train task's ``Metrics`` output does)."""
    from components.kernel.cli import setup_logging
    from components.kernel.kfp import numeric

    setup_logging()
    result = launch(
        task=args["task"],
        train=args["train"],
        paddlejob=args["paddlejob"],
        worker_resources=args["worker_resources"],
        data_dir=args["data"].path,
        outputs=Outputs(
            model=Path(args["model"].path),
            checkpoints=Path(args["checkpoints"].path),
            metrics=Path(args["metrics"].path),
            plots=Path(args["plots"].path),
        ),
        run=args["run"],
        hpo_dir=args["hpo"].path,
    )
    for key, value in numeric(result.metrics).items():
        args["metrics"].log_metric(key, value)


def paddlejob_train_op(
    task: dict,
    train: dict,
    paddlejob: dict,
    worker_resources: dict,
    run: str,
    data: Input[Dataset],
    validation: Input[Artifact],
    hpo: Input[Artifact],
    model: Output[Model],
    checkpoints: Output[Artifact],
    metrics: Output[Metrics],
    plots: Output[Artifact],
):
    """train on a Kubeflow PaddleJob (train.distributed.nnodes pods on a shared volume);
    ``run``: the KFP run's id (dsl.PIPELINE_JOB_ID_PLACEHOLDER), the job's owner; ``hpo``:
    the hpo step's output, whose adopted overlay sets the staged params (as train's --hpo)."""
    from pipelines.paddlejob import kfp_main

    kfp_main(locals())


def paddlejob_component(image: str) -> Any:
    """The launcher's component in ``image`` (the component image, kfp preinstalled)."""
    return dsl.component(base_image=image, install_kfp_package=False)(paddlejob_train_op)
