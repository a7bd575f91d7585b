"""evaluate: score the exported model on the test split with Paddle Inference.

The task judges the outputs (``Task.score``) and names the metrics: a classifier writes
``accuracy``, ``macro_f1``, ``worst_class_recall``, a generator ``class_agreement``, ``fid``
with its floor and ceiling (``components.tasks.gan``). ``metrics/evaluate.json`` adds
``latency_ms_b1``, ``latency_ms_b64``; for a task with a baseline (``Task.baseline``, e.g.
TF-IDF + logistic regression for sentiment) also ``baseline_accuracy``, ``baseline_macro_f1``
and ``accuracy_minus_baseline``: the baseline trained on the training split and scored on the
same samples as the model. The per-sample outcomes give a confusion matrix as PNG and as a DVC
plot (one row per sample: ``actual``, ``predicted``; for a conditional generator the requested
class and the judge's), the task's own figures (a generator's sample grid) and ``report.json``
beside them. The same function re-scores any exported model on any data set, which is how a
challenger is later compared with the champion."""

from __future__ import annotations

import logging
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components import dataset
from components.artifacts import StepError, atomic_path, write_json, write_manifest, write_text
from components.scoring import score_model
from components.step import BUNDLE, DATA, Out, Step
from components.tasks import Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LatencyParams:
    batch_sizes: list[int] = field(default_factory=lambda: [1, 64])
    warmup: int = 5
    repeats: int = 30
    threads: int = 1


@dataclass(frozen=True)
class EvaluateParams:
    split: str = "test"
    batch_size: int = 256
    latency: LatencyParams = field(default_factory=LatencyParams)


@dataclass(frozen=True)
class EvaluateResult:
    metrics: dict[str, Any]
    report: dict[str, Any]


def _confusion_png(dest: Path, matrix: list[list[int]], names: list[str], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cm = np.asarray(matrix)
    fig, ax = plt.subplots(figsize=(1 + 0.5 * len(names), 1 + 0.5 * len(names)), dpi=100)
    ax.imshow(cm, cmap="Blues")
    ax.set_xticks(range(len(names)), names, rotation=90 if len(names) > 12 else 0)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("actual")
    ax.set_title(title)
    for (i, j), v in np.ndenumerate(cm):
        if v:
            ax.text(
                j,
                i,
                str(v),
                ha="center",
                va="center",
                color="white" if v > cm.max() / 2 else "black",
                fontsize=8,
            )
    fig.tight_layout()
    with atomic_path(dest) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def score_baseline(
    task: Task, data_dir: Path, split: str, y_true: np.ndarray, names: list[str]
) -> dict[str, Any] | None:
    """The task's baseline (``Task.baseline``) trained on the training split and scored on
    ``split``, the same samples the model is scored on (None: the task has none)."""
    from components.tasks.report import classification_report

    estimator = task.baseline()
    if estimator is None:
        return None
    x_train, y_train = task.read_split(data_dir, "train")
    x_eval, y_eval = task.read_split(data_dir, split)
    if not np.array_equal(y_eval, y_true):
        raise StepError(f"{data_dir}: the {split} split changed while it was scored")
    estimator.fit(x_train.tolist(), y_train)
    report = classification_report(y_eval, np.asarray(estimator.predict(x_eval.tolist())), names)
    return {
        "model": " + ".join(type(s).__name__ for _, s in getattr(estimator, "steps", [])),
        "accuracy": report["accuracy"],
        "macro_f1": report["macro_f1"],
        "per_class": report["per_class"],
    }


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
    scores, predictor, inputs = score_model(
        model_dir, task, data_dir, params.split, params.batch_size, params.latency.threads
    )
    report, y_true, y_pred = scores.report, scores.y_true, scores.y_pred
    names = dataset.read_label_names(data_dir)

    latency: dict[str, float] = {}
    for bs in params.latency.batch_sizes:
        idx = np.arange(bs) % inputs[0].shape[0]  # repeat samples if the split is smaller
        latency[f"latency_ms_b{bs}"] = round(
            predictor.latency_ms(
                [x[idx] for x in inputs],
                warmup=params.latency.warmup,
                repeats=params.latency.repeats,
            ),
            4,
        )

    metrics = {  # the task's metrics (Task.score), then latency
        **scores.metrics,
        **latency,
        "samples": int(len(y_true)),
        "latency_threads": params.latency.threads,
    }
    baseline = score_baseline(task, data_dir, params.split, y_true, names)
    if baseline is not None:
        report["baseline"] = baseline
        metrics["baseline_accuracy"] = baseline["accuracy"]
        metrics["baseline_macro_f1"] = baseline["macro_f1"]
        # > 0: the model beats the baseline on the same samples
        metrics["accuracy_minus_baseline"] = round(report["accuracy"] - baseline["accuracy"], 6)
        log_fn = log.info if metrics["accuracy_minus_baseline"] > 0 else log.warning
        log_fn(
            "%s: model accuracy %.4f vs baseline (%s) %.4f",
            params.split,
            report["accuracy"],
            baseline["model"],
            baseline["accuracy"],
        )
    log.info("%s: %s %s", params.split, scores.metrics, latency)

    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        write_json(tmp / "report.json", {**report, **latency, "split": params.split})
        _confusion_png(
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
    if figures_dir is not None:  # the images again, where `dvc plots show` finds them
        with atomic_path(figures_dir) as tmp:
            tmp.mkdir(parents=True)
            for name in ["confusion_matrix.png", *figures]:
                shutil.copy2(out_dir / name, tmp / Path(name).name)
    write_json(metrics_file, metrics)
    rows = ["actual,predicted"] + [
        f"{names[a]},{names[p]}" for a, p in zip(y_true, y_pred, strict=True)
    ]
    write_text(plots_file, "\n".join(rows) + "\n")
    return EvaluateResult(metrics=metrics, report=report)


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

main = STEP.main

if __name__ == "__main__":
    sys.exit(main())
