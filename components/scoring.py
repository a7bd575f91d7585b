"""Scoring shared by the steps: a classification report, an exported model on a split.

Library layer: imported by steps (evaluate, qat, register), imports no step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from components import dataset
from components.runtime import ModelFiles, PaddlePredictor
from components.tasks import Task


def classification_report(
    y_true: np.ndarray, y_pred: np.ndarray, label_names: list[str]
) -> dict[str, Any]:
    from sklearn.metrics import (
        accuracy_score,
        confusion_matrix,
        f1_score,
        precision_recall_fscore_support,
    )

    labels = list(range(len(label_names)))
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=labels, zero_division=0
    )
    return {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(
            f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)
        ),
        "per_class": {
            name: {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": int(support[i]),
            }
            for i, name in enumerate(label_names)
        },
        "confusion_matrix": confusion_matrix(y_true, y_pred, labels=labels).tolist(),
    }


def score_model(
    model_dir: str | Path,
    task: Task,
    data_dir: str | Path,
    split: str = "test",
    batch_size: int = 256,
    threads: int = 1,
) -> tuple[dict[str, Any], np.ndarray, np.ndarray, PaddlePredictor, list[np.ndarray]]:
    """Run an exported model on a split; returns the report, labels, predictions, predictor."""
    predictor = PaddlePredictor(ModelFiles.in_dir(model_dir), threads=threads)
    task.load_assets(Path(model_dir))
    raw, y_true = task.read_split(data_dir, split)
    inputs = task.preprocess(raw)
    y_pred = predictor.predict(inputs, batch_size=batch_size).argmax(axis=1)
    report = classification_report(y_true, y_pred, dataset.read_label_names(data_dir))
    return report, y_true, y_pred, predictor, inputs
