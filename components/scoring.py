"""Scoring shared by the steps: an exported model on a split, judged by its task.

Library layer: imported by steps (evaluate, qat, register), imports no step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from components import dataset
from components.runtime import ModelFiles, PaddlePredictor
from components.tasks import Task
from components.tasks.base import Scores


def score_model(
    model_dir: str | Path,
    task: Task,
    data_dir: str | Path,
    split: str = "test",
    batch_size: int = 256,
    threads: int = 1,
) -> tuple[Scores, PaddlePredictor, list[np.ndarray]]:
    """Run an exported model on a split's inputs (:meth:`Task.eval_inputs`) and let the task
    judge the outputs (:meth:`Task.score`); returns the scores, the predictor and the inputs."""
    predictor = PaddlePredictor(ModelFiles.in_dir(model_dir), threads=threads)
    task.load_assets(Path(model_dir))
    inputs, labels = task.eval_inputs(data_dir, split)
    outputs = predictor.predict(inputs, batch_size=batch_size)
    scores = task.score(outputs, labels, data_dir, split, dataset.read_label_names(data_dir))
    return scores, predictor, inputs
