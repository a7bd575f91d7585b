"""How a task's model learns: its optimizers, one training step, and the validation score that
early stopping follows. The train step owns the loop (epochs, seeding, sharding over ranks,
checkpoints, resume, early stopping); the objective owns the math inside it.

:class:`Classification` is what the classifier tasks train with (cross-entropy, optional
distillation from soft targets, accuracy); a generative task brings its own
(``components.tasks.gan``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from components.tasks.types import Optimization, SoftTargets, TrainSettings

# paddle is imported where a model is run, not here: the steps that only read a task's data
# format or its objective's score (ingest, validate, hpo, register) never load it
if TYPE_CHECKING:
    import paddle

    from components.tasks.stream import InputBatch


class Task(Protocol):
    """What an objective asks of its task (:class:`components.tasks.base.Task` has it)."""

    def optimization(self, model: paddle.nn.Layer, settings: TrainSettings) -> Optimization: ...

    def collate(self, batch: list[np.ndarray]) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class StepContext:
    """What the train step lends an objective for one optimizer step: mixed precision and
    the update (loss scaling with float16 AMP, then ``step`` and ``clear_grad``)."""

    autocast: Callable[[], AbstractContextManager[Any]]
    update: Callable[[paddle.Tensor, paddle.optimizer.Optimizer], None]


class Objective(abc.ABC):
    """The learning problem of a task (see the module docstring)."""

    # the validation metric early stopping follows (a key of validate()'s result, without the
    # "val_" prefix), and whether higher is better
    score: str = "accuracy"
    higher_is_better: bool = True
    # validation: each rank scores its share of the split's batches (False: rank 0 gets them
    # all, the other ranks none)
    sharded_validation: bool = True

    def optimizations(
        self, task: Task, model: paddle.nn.Layer, settings: TrainSettings
    ) -> dict[str, Optimization]:
        """Named optimizers (the first one's learning rate is logged). Default: the task's one
        recipe (:meth:`Task.optimization`)."""
        return {"model": task.optimization(model, settings)}

    def parallel(self, model: paddle.nn.Layer, world_size: int) -> Any:
        """What the batches go through: the model itself in one process, else wrapped so
        gradients are averaged over ranks (``paddle.DataParallel`` broadcasts rank 0's
        parameters when it wraps)."""
        import paddle

        return paddle.DataParallel(model) if world_size > 1 else model

    def loss(self, logits: paddle.Tensor, targets: paddle.Tensor) -> paddle.Tensor:
        """The supervised loss of a batch (mean): cross-entropy over the class axis 1, which
        fits class logits ``[N, C]`` with labels ``[N]`` and per-pixel logits ``[N, C, H, W]``
        with masks ``[N, H, W]`` alike. QAT fine-tuning uses it."""
        import paddle.nn.functional as F

        return F.cross_entropy(logits.astype("float32"), targets, axis=1)

    def distillation(
        self, logits: paddle.Tensor, teacher: paddle.Tensor, temperature: float
    ) -> paddle.Tensor:
        """KL(teacher || model) of temperature-softened class distributions (axis 1), averaged
        over every position that has one (each sample of ``[N, C]``, each pixel of ``[N, C,
        H, W]``) and scaled by ``temperature**2``. QAT fine-tuning uses it."""
        import paddle.nn.functional as F

        t = temperature
        soft = F.softmax(teacher.astype("float32") / t, axis=1)
        kl = F.kl_div(F.log_softmax(logits.astype("float32") / t, axis=1), soft, reduction="sum")
        positions = max(1, int(np.prod(logits.shape)) // int(logits.shape[1]))
        return kl / positions * t * t

    @abc.abstractmethod
    def step(
        self,
        nets: Any,
        opts: dict[str, paddle.optimizer.Optimizer],
        batch: list[paddle.Tensor],
        labels: paddle.Tensor,
        *,
        weight: float,
        ctx: StepContext,
        soft: np.ndarray | None = None,
        soft_targets: SoftTargets | None = None,
    ) -> dict[str, float]:
        """One optimizer step on this rank's batch. Returns per-sample sums (a mean loss times
        the batch's size, a count of hits) that the loop adds over batches and ranks and
        divides by the samples of the epoch. ``weight``: this rank's share of the global batch
        times the world size (1 in one process); the loss is scaled by it before
        ``backward``. ``soft``: the batch's rows of ``soft_targets`` (distillation), if any."""

    @abc.abstractmethod
    def validate(
        self,
        task: Task,
        model: paddle.nn.Layer,
        batches: Iterable[InputBatch],
        rows: int,
        world: Any,  # components.ml.training.distributed.World
    ) -> dict[str, float]:
        """Validation metrics of ``model`` (means over the split's ``rows`` samples, the same
        on every rank); must contain :attr:`score`. ``batches``: this rank's preprocessed
        batches of the validation split, streamed (see :attr:`sharded_validation`); keep only
        per-sample results (they are small), never the inputs."""


class Classification(Objective):
    """Cross-entropy on the labels (plus KL towards a teacher's soft targets when the task
    distils); accuracy is the score."""

    def step(
        self,
        nets: Any,
        opts: dict[str, paddle.optimizer.Optimizer],
        batch: list[paddle.Tensor],
        labels: paddle.Tensor,
        *,
        weight: float,
        ctx: StepContext,
        soft: np.ndarray | None = None,
        soft_targets: SoftTargets | None = None,
    ) -> dict[str, float]:
        import paddle
        import paddle.nn.functional as F

        with ctx.autocast():
            logits = nets(*batch)
        logits = logits.astype("float32")  # the loss always in fp32
        loss = F.cross_entropy(logits, labels)
        if soft is not None and soft_targets is not None:
            # + KL(teacher || model) on temperature-softened logits
            t = soft_targets.temperature
            teacher = F.softmax(paddle.to_tensor(np.log(np.clip(soft, 1e-8, 1.0))) / t, axis=1)
            kl = F.kl_div(F.log_softmax(logits / t, axis=1), teacher, reduction="batchmean")
            loss = (1.0 - soft_targets.weight) * loss + soft_targets.weight * kl * t * t
        ctx.update(loss * weight if weight != 1.0 else loss, next(iter(opts.values())))
        n = int(labels.shape[0])
        hits = int((logits.argmax(axis=1) == labels).astype("int64").sum())
        return {"loss": float(loss) * n, "accuracy": float(hits)}

    def validate(
        self,
        task: Task,
        model: paddle.nn.Layer,
        batches: Iterable[InputBatch],
        rows: int,
        world: Any,  # components.ml.training.distributed.World
    ) -> dict[str, float]:
        """Mean loss and accuracy; each rank scores its batches, the sums are shared."""
        import paddle
        import paddle.nn.functional as F

        model.eval()
        total_loss, correct = 0.0, 0
        with paddle.no_grad():
            for batch in batches:
                arrays = task.collate(batch.inputs)
                y = paddle.to_tensor(batch.labels)
                logits = model(*[paddle.to_tensor(x) for x in arrays]).astype("float32")
                total_loss += float(F.cross_entropy(logits, y, reduction="sum"))
                correct += int((logits.argmax(axis=1) == y).astype("int64").sum())
        total_loss, correct = world.all_sum([total_loss, correct])
        return {"loss": total_loss / rows, "accuracy": correct / rows}
