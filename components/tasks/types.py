"""Value types shared by a task, its objective and the train step (a leaf of ``tasks``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import paddle


@dataclass(frozen=True)
class TrainSettings:
    """The ``train`` params a task's recipe reads (the train step fills it)."""

    learning_rate: float
    weight_decay: float
    epochs: int
    steps_per_epoch: int
    lr_step_size: int  # the step-decay recipe's (image tasks)
    lr_gamma: float


@dataclass(frozen=True)
class SoftTargets:
    """A teacher's class probabilities for every training sample, for distillation: the
    loss becomes ``(1 - weight) * CE(labels) + weight * T^2 * KL(teacher || model)`` on
    logits softened by temperature ``T``."""

    probabilities: np.ndarray  # [N, K], rows sum to 1, one per key
    weight: float
    temperature: float
    facts: dict[str, Any]  # for the train metrics (e.g. the teacher's accuracy)
    # [N] |S32: the sample key of each row (the training stream is looked up by key)
    keys: np.ndarray | None = None


@dataclass(frozen=True)
class Optimization:
    """What a task trains with: the optimizer, its learning-rate schedule, and whether the
    schedule advances after every batch (warmup/decay recipes) or after every epoch."""

    optimizer: paddle.optimizer.Optimizer
    scheduler: paddle.optimizer.lr.LRScheduler
    per_batch: bool = False
