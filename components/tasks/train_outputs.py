"""The train step's outputs over a task (``components/steps/train.py``), written by rank 0.

:func:`write_results` writes what :func:`components.tasks.epochs.train` fitted: the best
weights, their metadata, the task's fitted assets, the history and the manifest in the output
directory (:func:`write_outputs`, atomically), the metrics and the curves per epoch, and logs
the run's summary.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import paddle

from components.core.artifacts import atomic_path, write_json, write_manifest, write_text
from components.ml.data import dataset
from components.ml.training import training
from components.ml.training.training import TrainResult
from components.tasks.base import ASSETS_DIR, Task
from components.tasks.epochs import Fit, Setup
from components.tasks.trainer import TrainParamsLike


def write_outputs(
    out_dir: Path,
    result: TrainResult,
    fitted: Fit,
    *,
    params: TrainParamsLike,
    setup: Setup,
    meta: dict[str, Any],
    data_dir: Path,
    task: Task,
) -> None:
    """The best weights, their metadata, the task's fitted assets, the history and the
    manifest, atomically."""
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        paddle.save(fitted.state["best_state"], str(tmp / "model.pdparams"))
        task.save_assets(tmp / ASSETS_DIR)
        write_json(tmp / "model_meta.json", meta)
        write_json(tmp / "history.json", fitted.state["history"])
        write_manifest(
            tmp,
            "train",
            inputs={
                k: v for s in ("train", "val") for k, v in dataset.split_inputs(data_dir, s).items()
            },
            outputs={
                "model.pdparams": tmp / "model.pdparams",
                **{
                    p.relative_to(tmp).as_posix(): p
                    for p in sorted((tmp / ASSETS_DIR).rglob("*"))
                    if p.is_file()
                },
            },
            params=asdict(params),
            extra={
                "amp": asdict(setup.amp),
                "device": setup.device,
                "fingerprint": fitted.fingerprint,
                "distributed": {
                    **setup.batching.facts(),
                    **fitted.share.facts(),
                    "rank_param_sha256": fitted.digests,
                },
                "input_pipeline": {
                    "shuffle_buffer": params.shuffle_buffer,
                    "piece_rows": params.piece_rows,
                    "loader_workers": params.loader_workers,
                    "reader_samples_per_second": result.reader_samples_per_second,
                },
            },
        )


def write_results(
    fitted: Fit,
    files: dict[str, Path],
    *,
    params: TrainParamsLike,
    setup: Setup,
    task: Task,
    task_params: dict[str, Any],
    label_names: list[str],
) -> TrainResult:
    """Rank 0's outputs: the weights and their metadata in ``files["out_dir"]``
    (:func:`write_outputs`), the metrics (``files["metrics_file"]``) and the curves per epoch
    (``files["plots_file"]``); logs the run's summary."""
    result = fitted.result(files["out_dir"])
    meta = {
        "task": task.name,
        "task_params": task_params,
        "num_classes": len(label_names),
        "label_names": label_names,
        "best_epoch": result.best_epoch,
        **({"pretrain": fitted.pretrained} if fitted.pretrained else {}),
    }
    write_outputs(
        files["out_dir"],
        result,
        fitted,
        params=params,
        setup=setup,
        meta=meta,
        data_dir=files["data_dir"],
        task=task,
    )
    speeds = training.speeds(result)
    write_json(
        files["metrics_file"],
        {
            f"best_{result.score_name}": result.best_score,
            "best_epoch": result.best_epoch,
            "epochs_run": result.epochs_run,
            **speeds,
            "amp_effective": result.amp_effective,
            "amp_requested": params.amp,
            **setup.batching.facts(),
            **{k: v for k, v in fitted.pretrained.items() if not isinstance(v, list | dict)},
        },
    )
    write_text(files["plots_file"], training.curves_csv(fitted.state["history"]))
    training.log_result(result, speeds.get("reader_vs_train"))
    return result
