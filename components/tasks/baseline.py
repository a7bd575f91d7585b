"""A task's baseline beside its model (the evaluate step, ``components/steps/evaluate.py``):
``Task.baseline`` fitted on a seeded sample of the training split and scored on the samples the
model was scored on (e.g. TF-IDF + logistic regression for sentiment)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import StepError
from components.ml.decisions.evaluation import reservoir_sample
from components.tasks.base import Task
from components.tasks.data import check_format, iter_split
from components.tasks.report import classification_report

log = logging.getLogger(__name__)


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


def add_baseline(
    baseline: dict[str, Any] | None,
    report: dict[str, Any],
    metrics: dict[str, Any],
    split: str,
) -> None:
    """Put the baseline (:func:`score_baseline`, None: none) in ``report`` and its numbers
    in ``metrics``; a model that does not beat it is a warning."""
    if baseline is None:
        return
    report["baseline"] = baseline
    metrics["baseline_accuracy"] = baseline["accuracy"]
    metrics["baseline_macro_f1"] = baseline["macro_f1"]
    # > 0: the model beats the baseline on the same samples
    metrics["accuracy_minus_baseline"] = round(report["accuracy"] - baseline["accuracy"], 6)
    log_fn = log.info if metrics["accuracy_minus_baseline"] > 0 else log.warning
    log_fn(
        "%s: model accuracy %.4f vs baseline (%s) %.4f",
        split,
        report["accuracy"],
        baseline["model"],
        baseline["accuracy"],
    )
