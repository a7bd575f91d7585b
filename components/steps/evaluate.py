"""evaluate: score the exported model on the test split with Paddle Inference.

The task judges the outputs (``Task.score``) and names the metrics: a classifier writes
``accuracy``, ``macro_f1``, ``worst_class_recall``, a generator ``class_agreement``, ``fid``
with its floor and ceiling (``components.tasks.gan``). ``metrics/evaluate.json`` adds
``latency_ms_b1``, ``latency_ms_b64``; for a task with a baseline (``Task.baseline``, e.g.
TF-IDF + logistic regression for sentiment) also ``baseline_accuracy``, ``baseline_macro_f1``
and ``accuracy_minus_baseline``: the baseline trained on the training split (all of it up to
``evaluate.baseline_max_samples``, else a seeded uniform sample of that many, drawn as the
split streams by) and scored on the same samples as the model. The split is scored as a
stream, batch by batch (``components.tasks.scoring``): memory stays flat as the data grows. The
per-sample outcomes give a confusion matrix as PNG and as a DVC plot (one row per sample:
``actual``, ``predicted``; for a conditional generator the requested class and the judge's),
the task's own figures (a generator's sample grid) and ``report.json`` beside them. The same
function re-scores any exported model on any data set, which is how a challenger is later
compared with the champion."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from components.core.artifacts import atomic_path, write_json, write_manifest, write_text
from components.core.config import params_model
from components.kernel.step import BUNDLE, DATA, Out, Step
from components.ml.data import dataset
from components.ml.decisions import evaluation
from components.tasks import Task, baseline
from components.tasks.base import Scores
from components.tasks.scoring import score_model

log = logging.getLogger(__name__)


@params_model
class LatencyParams:
    batch_sizes: list[int] = field(default_factory=lambda: [1, 64])
    warmup: int = 5
    repeats: int = 30
    threads: int = 1


@params_model
class EvaluateParams:
    split: str = "test"
    batch_size: Annotated[int, Field(ge=1)] = 256
    latency: LatencyParams = field(default_factory=LatencyParams)
    # the task baseline (Task.baseline) is fitted on at most this many training samples: a
    # seeded uniform sample (reservoir) of the training split when it is larger
    baseline_max_samples: Annotated[int, Field(ge=1)] = 50000
    # a smoke / benchmark bound (None: the whole split): score only the split's first
    # max_steps batches of batch_size (the metrics are then of those, "samples" says how many)
    max_steps: Annotated[int, Field(ge=1)] | None = None


@dataclass(frozen=True)
class EvaluateResult:
    metrics: dict[str, Any]
    report: dict[str, Any]


def run(
    params: EvaluateParams,
    task: Task,
    model_dir: str | Path,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    metrics_file: str | Path | None = None,
    plots_file: str | Path | None = None,
    figures_dir: str | Path | None = None,
) -> EvaluateResult:
    model_dir, data_dir, out_dir = Path(model_dir), Path(data_dir), Path(out_dir)
    metrics_file = Path(metrics_file) if metrics_file else out_dir / "metrics.json"
    plots_file = Path(plots_file) if plots_file else out_dir / "confusion.csv"
    scores, predictor, inputs = score_model(  # inputs: the split's first batch
        model_dir,
        task,
        data_dir,
        params.split,
        params.batch_size,
        params.latency.threads,
        params.max_steps,
    )
    if params.max_steps is not None:
        log.warning(
            "evaluate.max_steps %d: scored the first %d samples of %s only",
            params.max_steps,
            len(scores.y_true),
            params.split,
        )
    report, names = scores.report, dataset.read_label_names(data_dir)
    if max(params.latency.batch_sizes, default=0) > inputs[0].shape[0]:
        # the first batch is smaller: read as many as timed
        inputs, _ = task.eval_head(data_dir, params.split, max(params.latency.batch_sizes))
    latency = evaluation.latency(predictor, inputs, params.latency)
    metrics = {  # the task's metrics (Task.score), then latency
        **scores.metrics,
        **latency,
        "samples": int(len(scores.y_true)),
        "latency_threads": params.latency.threads,
    }
    found = baseline.score_baseline(
        task, data_dir, params.split, scores.y_true, names, params.baseline_max_samples
    )
    baseline.add_baseline(found, report, metrics, params.split)
    log.info("%s: %s %s", params.split, scores.metrics, latency)
    figures = _write_report(params, task, scores, names, latency, model_dir, data_dir, out_dir)
    if figures_dir is not None:  # the images again, where `dvc plots show` finds them
        evaluation.copy_figures(out_dir, Path(figures_dir), ["confusion_matrix.png", *figures])
    write_json(metrics_file, metrics)
    write_text(plots_file, evaluation.confusion_csv(scores.y_true, scores.y_pred, names))
    return EvaluateResult(metrics=metrics, report=report)


def _write_report(
    params: EvaluateParams,
    task: Task,
    scores: Scores,
    names: list[str],
    latency: dict[str, float],
    model_dir: Path,
    data_dir: Path,
    out_dir: Path,
) -> list[str]:
    """``report.json``, the confusion matrix and the task's figures in ``out_dir``
    (atomically); the figures' names."""
    report = scores.report
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        write_json(tmp / "report.json", {**report, **latency, "split": params.split})
        evaluation.confusion_png(
            tmp / "confusion_matrix.png",
            report["confusion_matrix"],
            names,
            f"{params.split}: {task.outcome} {report['accuracy']:.4f}",
        )
        figures = [  # e.g. a generator's sample grid
            f.relative_to(tmp).as_posix() for f in task.figures(tmp, scores, names)
        ]
        write_manifest(
            tmp,
            "evaluate",
            inputs={
                "model": model_dir,
                **dataset.split_inputs(data_dir, params.split),
            },
            outputs={
                "report.json": tmp / "report.json",
                **{name: tmp / name for name in figures},
            },
            params=asdict(params),
        )
    return figures


STEP = Step(
    name="evaluate",
    doc=__doc__,
    params=EvaluateParams,
    sections=("task", "evaluate"),
    run=run,
    inputs=(
        BUNDLE,
        DATA,
    ),
    outputs=(
        Out("evaluation", "outputs/evaluate", "out_dir", help="report, confusion matrix"),
        Out("metrics", "metrics/evaluate.json", "metrics_file", kfp="Metrics", dvc="metrics"),
        Out(
            "confusion",
            "plots/confusion.csv",
            "plots_file",
            kfp="ClassificationMetrics",
            dvc="plots",
        ),
        Out(
            "figures",
            "plots/figures",
            "figures_dir",
            dvc="figures",
            help="confusion matrix and the task's images, for dvc plots show",
        ),
    ),
)
