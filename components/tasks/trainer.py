"""The trainer of the train step (``components/steps/train.py``): one epoch over a task.

The task owns the model, its objective (loss, optimizers, schedules, score) and its data; this
module runs them: :class:`Trainer` (the model, optimizers, schedules and AMP of a run, and one
epoch's training pass) and :class:`Inputs` (what a rank reads each epoch, streamed by
:mod:`components.tasks.stream`). The run around them (resume, the epochs, early stopping) is
:mod:`components.tasks.epochs`, its outputs :mod:`components.tasks.train_outputs`; the
task-independent parts (AMP, checkpoints, rank agreement) are
:mod:`components.ml.training.training`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from components.core.artifacts import StepError
from components.faults import failpoints
from components.ml.data import snapshot
from components.ml.training import training
from components.ml.training.distributed import Batching, EpochShare, World
from components.ml.training.training import AmpMode
from components.tasks import stream
from components.tasks.base import SoftTargets, Task, TrainSettings
from components.tasks.objective import Objective, StepContext
from components.tasks.stream import InputBatch, StreamSettings

log = logging.getLogger(__name__)
SINGLE = World()  # one process, no launch
# the train step's params (components.steps.train.TrainParams): seed, epochs, batch sizes,
# the schedule, early_stopping and the input pipeline's settings (.stream())
TrainParamsLike = Any


@dataclass
class Trainer:
    """The model, optimizer, schedule and AMP of one training run."""

    model: paddle.nn.Layer
    objective: Objective
    opts: dict[str, paddle.optimizer.Optimizer]
    schedulers: list[Any]
    amp: AmpMode
    scaler: Any
    per_batch: bool  # the schedule advances after every batch (else after every epoch)
    # what the batches go through: the model, or DataParallel around it (Objective.parallel)
    nets: Any = None
    # distillation: soft targets per training sample [N, K] (Task.soft_targets), their weight
    # and temperature, looked up by sample key; None: labels only
    soft: SoftTargets | None = None
    _soft_index: tuple[np.ndarray, np.ndarray] | None = None

    def set_soft(self, soft: SoftTargets | None, where: str) -> None:
        self.soft, self._soft_index = soft, None
        if soft is None:
            return
        if soft.keys is None or len(soft.keys) != len(soft.probabilities):
            raise StepError(f"{where}: soft targets need one sample key per row (keys)")
        keys = np.asarray(soft.keys, dtype=f"S{stream.KEY_BYTES}")
        order = np.argsort(keys, kind="stable")
        self._soft_index = (keys[order], order)

    def soft_rows(self, keys: np.ndarray) -> np.ndarray | None:
        """The soft targets of the samples with ``keys`` (``uint8 [n, 32]``)."""
        if self.soft is None or self._soft_index is None:
            return None
        sorted_keys, order = self._soft_index
        want = stream.key_strings(keys)
        pos = np.minimum(np.searchsorted(sorted_keys, want), len(sorted_keys) - 1)
        if not np.array_equal(sorted_keys[pos], want):
            raise StepError("the soft targets have no row for a training sample's key")
        return self.soft.probabilities[order[pos]]

    @property
    def scheduler(self) -> Any:
        """The first optimizer's schedule (its learning rate is the one logged)."""
        return self.schedulers[0]

    @classmethod
    def build(
        cls,
        params: TrainParamsLike,
        task: Task,
        num_classes: int,
        amp: AmpMode,
        steps_per_epoch: int,
        batching: Batching,
        device: str,
    ) -> Trainer:
        paddle.seed(params.seed)
        model = _sync_batch_norm(task.build_model(num_classes), batching, device)
        objective = task.objective()
        recipes = objective.optimizations(  # the task owns its optimizers and schedules
            task,
            model,
            TrainSettings(
                learning_rate=batching.learning_rate,
                weight_decay=params.weight_decay,
                epochs=params.epochs,
                steps_per_epoch=steps_per_epoch,
                lr_step_size=params.lr_step_size,
                lr_gamma=params.lr_gamma,
            ),
        )
        opts = {name: r.optimizer for name, r in recipes.items()}
        model, opts, scaler = _with_amp(model, opts, amp)
        per_batch = {r.per_batch for r in recipes.values()}
        if len(per_batch) > 1:
            raise StepError(
                f"task {task.name}: its schedules must all advance per batch or per epoch"
            )
        return cls(
            model,
            objective,
            opts,
            [r.scheduler for r in recipes.values()],
            amp,
            scaler,
            per_batch.pop(),
            nets=model,
        )

    def autocast(self) -> Any:
        amp = self.amp
        return paddle.amp.auto_cast(
            enable=amp.enabled,
            level=amp.level if amp.enabled else "O1",
            dtype=amp.dtype if amp.enabled else "float16",
        )

    def update(self, loss: paddle.Tensor, opt: paddle.optimizer.Optimizer) -> None:
        """Backward ``loss`` and step ``opt`` (with loss scaling under float16 AMP)."""
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(opt)
            self.scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.clear_grad()

    def epoch(
        self,
        task: Task,
        batches: Iterator[InputBatch],
        share: EpochShare,
        rng: np.random.Generator,
        world: World = SINGLE,
        number: int = 1,
    ) -> dict[str, float]:
        """One pass over this rank's run of the epoch: the objective's means (over all ranks).

        ``batches`` are this rank's (:func:`components.tasks.stream.shuffled_batches`): step
        ``i`` must hold ``share.batch(rank, i)`` samples, so every rank runs the same steps;
        each weights its loss by ``share.weight`` (the global batch's mean)."""
        self.model.train()
        ctx = StepContext(autocast=self.autocast, update=self.update)
        sums: dict[str, float] = {}
        step = -1
        for step, batch in enumerate(batches):
            if step == 1 and number == 2:  # a checkpoint exists, the epoch is under way
                failpoints.hit("train.mid_epoch", f"epoch {number}, rank {world.rank}")
            expected = share.batch(world.rank, step) if step < share.steps else 0
            if len(batch.labels) != expected:
                raise StepError(
                    f"task {task.name}: step {step + 1} of epoch {number} has "
                    f"{len(batch.labels)} samples on rank {world.rank}, the plan {expected} "
                    "(Task.batches must cut a block into batches of the batch size)"
                )
            arrays = task.collate(task.augment(batch.inputs, rng))
            got = self.objective.step(
                self.nets,
                self.opts,
                [paddle.to_tensor(x) for x in arrays],
                paddle.to_tensor(batch.labels),
                weight=share.weight(world.rank, step),
                ctx=ctx,
                soft=self.soft_rows(batch.keys),
                soft_targets=self.soft,
            )
            if self.per_batch:
                for scheduler in self.schedulers:
                    scheduler.step()
            for key, value in got.items():
                sums[key] = sums.get(key, 0.0) + value
        if step + 1 != share.steps:
            raise StepError(
                f"task {task.name}: epoch {number} ran {step + 1} steps on rank {world.rank}, "
                f"the plan {share.steps}"
            )
        keys = list(sums)  # the objective's order (the same on every rank)
        totals = world.all_sum([sums[k] for k in keys])
        return {k: v / share.used for k, v in zip(keys, totals, strict=True)}


def _sync_batch_norm(model: paddle.nn.Layer, batching: Batching, device: str) -> paddle.nn.Layer:
    """Data parallel on GPU: BatchNorm statistics over the global batch (not on CPU)."""
    if batching.world_size > 1 and training.has_batch_norm(model):
        if device == "gpu":  # batch statistics over the global batch
            model = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        else:  # Paddle's CPU wheel has no sync_batch_norm kernel
            log.warning(
                "data parallel on CPU: BatchNorm statistics are each rank's own "
                "(%d samples), not the global batch's",
                batching.per_rank_batch,
            )
    return model


def _with_amp(
    model: paddle.nn.Layer, opts: dict[str, paddle.optimizer.Optimizer], amp: AmpMode
) -> tuple[paddle.nn.Layer, dict[str, paddle.optimizer.Optimizer], Any]:
    """The model and optimizers decorated for ``amp`` (O2), and the loss scaler (float16)."""
    scaler = None
    if amp.enabled:
        if amp.level == "O2":
            model, decorated = paddle.amp.decorate(
                models=model, optimizers=list(opts.values()), level="O2", dtype=amp.dtype
            )
            opts = dict(zip(opts, decorated, strict=True))
        if amp.dtype == "float16":
            scaler = paddle.amp.GradScaler(init_loss_scaling=2.0**15)
    return model, opts, scaler


@dataclass(frozen=True)
class Inputs:
    """What this rank reads: its run of every epoch's training pieces, its validation
    pieces, and how (:mod:`components.tasks.stream`)."""

    snap: snapshot.Snapshot
    task: Task
    settings: StreamSettings
    seed: int
    share: EpochShare
    rank: int
    train_pieces: np.ndarray  # the split's, in manifest order
    val_pieces: np.ndarray  # this rank's
    val_rows: int  # what all ranks validate: the split's (up to train.max_val_steps batches)
    cache: stream.PieceCache | None = None  # preprocessed pieces (train.cache_mb)

    @classmethod
    def build(
        cls,
        snap: snapshot.Snapshot,
        task: Task,
        params: TrainParamsLike,
        share: EpochShare,
        world: World,
        objective: Objective,
        cache_dir: Path | None = None,
    ) -> Inputs:
        """``cache_dir``: where preprocessed pieces are kept (up to ``train.cache_mb``; the
        train step's ``<checkpoint_dir>/pieces``); None: no cache."""
        settings: StreamSettings = params.stream()
        cache = None
        if cache_dir is not None:
            cache = stream.PieceCache.open(cache_dir, task, settings.cache_mb)
        val = stream.piece_table(snap, "val", params.eval_batch_size)
        if params.max_val_steps is not None:  # a smoke/benchmark bound: the first batches
            val = val[: params.max_val_steps]
        if objective.sharded_validation:
            mine = val[world.rank :: world.size]
        else:  # rank 0 scores the whole split
            mine = val if world.main else val[:0]
        return cls(
            snap,
            task,
            settings,
            params.seed,
            share,
            world.rank,
            stream.piece_table(snap, "train", params.piece_rows),
            mine,
            stream.rows_of(val),
            cache,
        )

    def train(self, epoch: int) -> np.ndarray:
        """This rank's pieces of ``epoch``: its run of the epoch's order."""
        order = stream.epoch_order(self.train_pieces, (self.seed, epoch))
        return stream.cut(order, self.share.start(self.rank), self.share.rank_rows(self.rank))

    def reader(self, epochs: Sequence[int], val: bool = True) -> stream.Reader:
        plan = stream.Plan(tuple(epochs), self.train, self.val_pieces if val else _NO_PIECES)
        pieces = stream.PieceStream(
            self.snap, self.task.data, self.task.preprocess, plan, self.cache
        )
        return stream.Reader(pieces, self.settings.workers, self.settings.prefetch)

    def batches(
        self, reader: stream.Reader, epoch: int, rng: np.random.Generator
    ) -> Iterator[InputBatch]:
        """This rank's training batches of ``epoch`` from ``reader``."""
        return stream.shuffled_batches(
            reader.take(len(self.train(epoch))),
            self.task,
            self.share.batch(self.rank, 0),
            self.settings.shuffle_buffer,
            np.random.default_rng([self.seed, epoch, self.rank, stream.BUFFER]),
            rng,
            self.settings.piece_rows,
        )

    def probe(self, limit: int) -> float:
        """samples/s of this rank's reader alone over about ``limit`` samples (the pieces of
        epoch 0, an order no training epoch uses; start-up excluded where there are pieces
        enough)."""
        pieces = self.train(0)
        rows = (pieces[:, 3] - pieces[:, 2]).tolist()
        count = max(1, int(np.searchsorted(np.cumsum(rows), limit)) + 1)
        count = min(count, len(pieces))
        t0 = time.perf_counter()
        reader = self.reader([0], val=False)
        try:
            items = reader.take(count)
            if count > 1:
                next(items)
                t0, rows = time.perf_counter(), rows[1:]
            for _ in items:
                pass
            seconds = time.perf_counter() - t0
        finally:
            reader.close()
        return sum(rows[: count - (1 if count > 1 else 0)]) / seconds if seconds > 0 else 0.0


_NO_PIECES = np.zeros((0, 4), dtype=np.int64)
