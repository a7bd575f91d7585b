"""Scoring shared by the steps: an exported model on a split, judged by its task.

The split is read as a stream (:meth:`Task.eval_batches`): every batch is run through the
model and handed to the task's judge (:meth:`Task.scorer`), which keeps only per-sample
outcomes. Neither the split nor all of the model's outputs are ever in memory at once.

It lives with the tasks (it asks a :class:`Task` for the batches and the judge), above
``components.ml`` (the runtime it drives), so ``ml`` never imports a task. Imported by steps
(evaluate, register), imports no step.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from components.core.artifacts import StepError
from components.ml.data import dataset, snapshot
from components.ml.serving.runtime import BatchedPredictor, ModelFiles, PaddlePredictor
from components.tasks.base import Scores, Task


def _limited(
    batches: Iterator[tuple[list[np.ndarray], np.ndarray]], max_steps: int | None
) -> Iterator[tuple[list[np.ndarray], np.ndarray]]:
    """The first ``max_steps`` batches of a stream of (inputs, labels) batches (None: all)."""
    return batches if max_steps is None else itertools.islice(batches, max_steps)


def stream_scores(
    predictor: BatchedPredictor,
    task: Task,
    data_dir: str | Path,
    split: str,
    batch_size: int = 256,
    max_steps: int | None = None,
) -> tuple[Scores, list[np.ndarray]]:
    """Run ``predictor`` on ``split`` batch by batch (its first ``max_steps`` batches only,
    unless None) and let the task judge the outputs as they come; returns the scores (with
    :attr:`Scores.replay`: the outputs again, batch by batch) and the first batch's model
    inputs (for timing)."""
    scorer = task.scorer(data_dir, split, dataset.read_label_names(data_dir))
    first: list[np.ndarray] | None = None
    total = snapshot.load(data_dir).rows(split)
    total = total if max_steps is None else min(total, max_steps * batch_size)

    def batches() -> Iterator[tuple[list[np.ndarray], np.ndarray]]:
        return _limited(task.eval_batches(data_dir, split, batch_size), max_steps)

    with tqdm(total=total, desc=f"score {split}", unit="sample", leave=False) as bar:
        for inputs, labels in batches():
            if first is None:
                first = inputs
            scorer.add(predictor.predict(inputs, batch_size=batch_size), labels)
            bar.update(len(labels))
    if first is None:
        raise StepError(f"{data_dir}: split {split} holds no samples (run ingest)")
    scores = scorer.result()

    def replay() -> Iterator[np.ndarray]:
        for inputs, _ in batches():
            yield predictor.predict(inputs, batch_size=batch_size)

    if scores.replay is None:
        scores.replay = replay
    return scores, first


def score_model(
    model_dir: str | Path,
    task: Task,
    data_dir: str | Path,
    split: str = "test",
    batch_size: int = 256,
    threads: int = 1,
    max_steps: int | None = None,
) -> tuple[Scores, PaddlePredictor, list[np.ndarray]]:
    """Run an exported model on a split, streamed (:meth:`Task.eval_batches`; only its
    first ``max_steps`` batches unless None), and let the task judge the outputs batch by batch
    (:meth:`Task.scorer`); returns the scores, the predictor and the model inputs of the
    split's first batch (at most ``batch_size`` samples: what latency is timed on)."""
    predictor = PaddlePredictor(ModelFiles.in_dir(model_dir), threads=threads)
    task.load_assets(Path(model_dir))
    scores, first = stream_scores(predictor, task, data_dir, split, batch_size, max_steps)
    outputs = scores.replay
    if outputs is not None:  # replayed later, after other models' assets were loaded

        def replay() -> Iterator[np.ndarray]:
            task.load_assets(Path(model_dir))  # this model's preprocessing again
            yield from outputs()

        scores.replay = replay
    return scores, predictor, first
