"""evaluate: score the exported model on the test split with Paddle Inference.

The task judges the outputs (``Task.score``) and names the metrics: a classifier writes
``accuracy``, ``macro_f1``, ``worst_class_recall``, a generator ``class_agreement``, ``fid``
with its floor and ceiling (``components.tasks.gan``). ``metrics/evaluate.json`` adds
``latency_ms_b1``, ``latency_ms_b64``; for a task with a baseline (``Task.baseline``, e.g.
TF-IDF + logistic regression for sentiment) also ``baseline_accuracy``, ``baseline_macro_f1``
and ``accuracy_minus_baseline``: the baseline trained on the training split (all of it up to
``evaluate.baseline_max_samples``, else a seeded uniform sample of that many, drawn as the
split streams by) and scored on the same samples as the model. The split is scored as a
stream, batch by batch (``components.ml.scoring``): memory stays flat as the data grows. The
per-sample outcomes give a confusion matrix as PNG and as a DVC plot (one row per sample:
``actual``, ``predicted``; for a conditional generator the requested class and the judge's),
the task's own figures (a generator's sample grid) and ``report.json`` beside them. The same
function re-scores any exported model on any data set, which is how a challenger is later
compared with the champion."""

from __future__ import annotations

import logging
import shutil
import textwrap
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from components.core.artifacts import StepError, atomic_path, write_json, write_manifest, write_text
from components.core.config import params_model
from components.kernel.step import BUNDLE, DATA, Out, Step
from components.ml import dataset
from components.ml.scoring import score_model
from components.tasks import Task
from components.tasks.data import check_format, iter_split
from components.tasks.report import classification_report

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
    # > 0: score only the split's first max_samples samples (a smoke run or a memory
    # benchmark on a huge split; the metrics are then of those, "samples" says how many)
    max_samples: Annotated[int, Field(ge=0)] = 0


@dataclass(frozen=True)
class EvaluateResult:
    metrics: dict[str, Any]
    report: dict[str, Any]


FIGURE_MIN_INCHES = 4.0  # the confusion figure's smallest side (400 px at 100 dpi)


def _confusion_png(dest: Path, matrix: list[list[int]], names: list[str], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cm = np.asarray(matrix)
    side = max(FIGURE_MIN_INCHES, 1 + 0.5 * len(names))  # 2 classes: room for the title too
    fig, ax = plt.subplots(figsize=(side, side), dpi=100)
    ax.imshow(cm, cmap="Blues")
    ax.set_xticks(range(len(names)), names, rotation=90 if len(names) > 12 else 0)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("actual")
    ax.set_title(textwrap.fill(title, 40), fontsize=10)
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
        # the bounding box of what was drawn: no title or tick label is cut at the edge
        fig.savefig(tmp, format="png", bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)


BASELINE_SEED = 0  # of the reservoir sample the baseline is fitted on


def reservoir_sample(
    batches: Iterable[tuple[np.ndarray, np.ndarray]], size: int, seed: int = BASELINE_SEED
) -> tuple[np.ndarray, np.ndarray, int]:
    """A uniform sample of at most ``size`` samples of a stream of (samples, labels) batches
    (reservoir sampling, algorithm R, seeded), in stream order; all of them when the stream
    is no longer. Returns the samples, their labels and how many samples streamed by."""
    rng = np.random.default_rng(seed)
    kept: list[Any] = []
    labels: list[int] = []
    order: list[int] = []  # each kept sample's position in the stream
    seen = 0
    for samples, lbl in batches:
        n = len(lbl)
        # own copies of array samples: a view would keep its whole batch alive
        own = (lambda x: x) if samples.dtype == object else np.array
        fill = min(max(size - len(kept), 0), n)
        kept += [own(x) for x in samples[:fill]]
        labels += lbl[:fill].tolist()
        order += range(seen, seen + fill)
        if fill < n:  # the reservoir is full: sample i replaces a kept one with p = size/(i+1)
            positions = np.arange(seen + fill, seen + n)
            slots = rng.integers(0, positions + 1)
            for i in np.flatnonzero(slots < size):
                slot = int(slots[i])
                kept[slot], labels[slot] = own(samples[fill + i]), int(lbl[fill + i])
                order[slot] = int(positions[i])
        seen += n
    by_position = np.argsort(order, kind="stable")
    out = np.empty(len(kept), dtype=object) if kept and isinstance(kept[0], str) else None
    if out is not None:
        out[:] = [kept[i] for i in by_position]
    else:
        out = np.stack([kept[i] for i in by_position]) if kept else np.zeros(0)
    return out, np.asarray(labels, dtype=np.int64)[by_position], seen


def score_baseline(
    task: Task,
    data_dir: Path,
    split: str,
    y_true: np.ndarray,
    names: list[str],
    max_samples: int = 50000,
    batch_rows: int = 1024,
) -> dict[str, Any] | None:
    """The task's baseline (``Task.baseline``) fitted on the training split (a seeded sample
    of ``max_samples`` when it is larger, :func:`reservoir_sample`) and scored on ``split``,
    the same samples the model is scored on, batch by batch (None: the task has none)."""

    estimator = task.baseline()
    if estimator is None:
        return None
    check_format(data_dir, task.data, task.name)
    x_train, y_train, seen = reservoir_sample(
        iter_split(task.data, data_dir, "train", batch_rows), max_samples
    )
    estimator.fit(x_train.tolist(), y_train)
    predicted, labels, scored = [], [], 0
    for x_eval, y_eval in iter_split(task.data, data_dir, split, batch_rows):
        take = min(len(y_eval), len(y_true) - scored)  # the samples the model was scored on
        if take <= 0:
            break
        predicted.append(np.asarray(estimator.predict(x_eval[:take].tolist())))
        labels.append(y_eval[:take])
        scored += take
    y_eval = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
    if not np.array_equal(y_eval, y_true):
        raise StepError(f"{data_dir}: the {split} split changed while it was scored")
    report = classification_report(y_eval, np.concatenate(predicted), names)
    return {
        "model": " + ".join(type(s).__name__ for _, s in getattr(estimator, "steps", [])),
        "accuracy": report["accuracy"],
        "macro_f1": report["macro_f1"],
        "per_class": report["per_class"],
        "train_samples": int(len(y_train)),
        "train_split_samples": int(seen),
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
    scores, predictor, inputs = score_model(  # inputs: the split's first batch
        model_dir,
        task,
        data_dir,
        params.split,
        params.batch_size,
        params.latency.threads,
        params.max_samples,
    )
    if params.max_samples:
        log.warning(
            "evaluate.max_samples: scored the first %d samples of %s only",
            len(scores.y_true),
            params.split,
        )
    report, y_true, y_pred = scores.report, scores.y_true, scores.y_pred
    names = dataset.read_label_names(data_dir)

    latency: dict[str, float] = {}
    largest = max(params.latency.batch_sizes, default=0)
    if largest > inputs[0].shape[0]:  # the first batch is smaller: read as many as timed
        inputs, _ = task.eval_head(data_dir, params.split, largest)
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
    baseline = score_baseline(
        task, data_dir, params.split, y_true, names, params.baseline_max_samples
    )
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
