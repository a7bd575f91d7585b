"""The train step's run over a task (``components/steps/train.py``): the epochs.

:func:`train` fits the task's preprocessing on the training split, builds the
:class:`~components.tasks.trainer.Trainer`, resumes the checkpoint made with the same params
and data (else pretrains), times the reader alone, then runs the remaining epochs: train,
validate, keep the best weights, checkpoint each epoch (rank 0), stop early after
``early_stopping.patience`` epochs without a gain of ``min_delta``. Every epoch reseeds from
``(seed, epoch)`` and the rank, so a resumed run ends with the weights of an uninterrupted one.
Rank 0 then writes the outputs, metrics and curves (:mod:`components.tasks.train_outputs`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from tqdm import tqdm

from components.core.artifacts import StepError
from components.ml.data import snapshot
from components.ml.training import training, trial_metrics
from components.ml.training.distributed import Batching, EpochShare, World
from components.ml.training.training import AmpMode, TrainResult
from components.ml.training.trial_metrics import TRIAL_ENV
from components.tasks import stream
from components.tasks.base import Task
from components.tasks.data import check_format
from components.tasks.objective import Objective
from components.tasks.stream import InputBatch
from components.tasks.trainer import Inputs, Trainer, TrainParamsLike

log = logging.getLogger(__name__)
PIECES = "pieces"  # under the checkpoint directory: the piece cache (train.cache_mb)
RANK_SEED_STRIDE = 7919  # paddle.seed offset per rank (a prime: no rank meets another's epoch)

# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Setup:
    """Where and how a rank trains: the device, the AMP mode, the batch and the ranks."""

    device: str
    amp: AmpMode
    batching: Batching
    world: World


@dataclass
class Fit:
    """A finished fit: the trainer, its state (history, best epoch and weights, timings),
    what was read and how, and what the ranks agreed on."""

    trainer: Trainer
    state: dict[str, Any]
    share: EpochShare
    fingerprint: str
    pretrained: dict[str, Any]  # Task.pretrain's and the soft targets' facts
    reader_rate: float | None  # the reader alone, samples/s (all ranks), if timed
    digests: list[str]  # each rank's parameters sha256

    @property
    def score_name(self) -> str:
        return score_name(self.trainer.objective)

    def result(self, out_dir: Path) -> TrainResult:
        """What the run reached (rank 0's outputs in ``out_dir``)."""
        state, best = self.state, self.state["best"]
        seconds = state["train_seconds"]
        return TrainResult(
            model_path=out_dir / "model.pdparams",
            best_score=best_score(self.trainer.objective, best),
            score_name=self.score_name,
            best_epoch=int(best["epoch"]),
            epochs_run=len(state["history"]),
            samples_per_second=state["samples_seen"] / seconds if seconds else 0.0,
            amp_effective=self.trainer.amp.level,
            resumed_from_epoch=state["resumed_from"],
            reader_samples_per_second=self.reader_rate,
        )


def score_name(objective: Objective) -> str:
    return f"val_{objective.score}"


def best_score(objective: Objective, best: dict[str, Any]) -> float:
    """The best epoch's score as the objective states it (``best`` keeps higher-is-better)."""
    return float(best["score"] if objective.higher_is_better else -best["score"])


def train(
    params: TrainParamsLike,
    task: Task,
    data_dir: Path,
    ckpt_dir: Path,
    setup: Setup,
    task_params: dict[str, Any],
    num_classes: int,
) -> Fit:
    """Train ``task``'s model on the snapshot in ``data_dir`` on this rank: fit the task's
    preprocessing on the training split, build the trainer, resume the checkpoint made with
    these params and data (else pretrain), then the remaining epochs (:func:`fit`)."""
    world, batching = setup.world, setup.batching
    check_format(data_dir, task.data, task.name)
    snap = snapshot.load(data_dir)
    share = epoch_share(snap, batching, world, data_dir, params.max_steps_per_epoch)
    # a vocabulary, a judge: fitted on the training split only, streamed
    training_data = stream.SnapshotData(snap, task, params.stream())
    task.fit_preprocessing(training_data)

    data_sha = "".join(snap.split_sha256(s) for s in ("train", "val"))
    key = training.fingerprint(asdict(params), task_params, data_sha, batching)
    trainer = Trainer.build(
        params, task, num_classes, setup.amp, share.steps, batching, setup.device
    )
    found = training.load_checkpoint(ckpt_dir, key)
    if world.size > 1:  # before any long work: a rank that resumes must not wait for others
        training.same_start(world, found["epoch"] if found else 0, ckpt_dir)
    pretrain_facts: dict[str, Any] = {}
    if found is None:  # resuming: the checkpoint has it
        pretrain_facts = task.pretrain(trainer.model, training_data)
    trainer.set_soft(task.soft_targets(training_data, num_classes), f"task {task.name}")
    state = training.resume(trainer.model, trainer.opts, ckpt_dir, found)
    if state["resumed_from"] is None:
        state["pretrain"] = pretrain_facts
    trainer.nets = trainer.objective.parallel(trainer.model, world.size)
    pretrained = {**state["pretrain"], **(trainer.soft.facts if trainer.soft else {})}
    # preprocessed pieces are kept beside the checkpoints (persisted, not DVC-cached)
    inputs = Inputs.build(snap, task, params, share, world, trainer.objective, ckpt_dir / PIECES)
    reader_rate = probe(inputs, params.reader_probe_samples, world)
    fit(trainer, state, params, task, inputs, ckpt_dir, key, world)
    digests = training.rank_digests(world, trainer.model, state["best_state"])
    return Fit(trainer, state, share, key, pretrained, reader_rate, digests)


def epoch_share(
    snap: snapshot.Snapshot,
    batching: Batching,
    world: World,
    data_dir: Path,
    max_steps: int | None = None,
) -> EpochShare:
    """How the ranks share an epoch: of the whole training split, or of the first
    ``max_steps`` global batches of each epoch's order (``train.max_steps_per_epoch``: every
    rank then takes ``max_steps`` steps); a split too small for the ranks is one line."""
    rows = snap.rows("train")
    if max_steps is not None and max_steps * batching.global_batch < rows:
        log.info(
            "train.max_steps_per_epoch %d: each epoch reads %d of the %d training samples "
            "(the first in its order)",
            max_steps,
            max_steps * batching.global_batch,
            rows,
        )
        rows = max_steps * batching.global_batch
    share = EpochShare(rows, batching.global_batch, world.size)
    if share.steps == 0:
        raise StepError(
            f"{data_dir}: the training split has {share.rows} samples, fewer than the "
            f"{world.size} ranks that would share it"
        )
    if snap.rows("val") == 0:
        raise StepError(f"{data_dir}: the validation split is empty (early stopping needs it)")
    if share.dropped:
        log.info(
            "%d ranks: each epoch leaves %d of %d training samples unread (the last in its "
            "order; fewer than the ranks, docs/distributed.md)",
            world.size,
            share.dropped,
            share.rows,
        )
    return share


def probe(inputs: Inputs, limit: int, world: World) -> float | None:
    """The reader's samples/s alone (every rank's, added up), or None when not timed."""
    if limit <= 0:
        return None
    rates = world.all_gather(inputs.probe(limit))
    total = float(sum(rates))
    log.info("reader alone: %.0f samples/s (%d rank(s))", total, world.size)
    return total


def fit(
    trainer: Trainer,
    state: dict[str, Any],
    params: TrainParamsLike,
    task: Task,
    inputs: Inputs,
    ckpt_dir: Path,
    fingerprint: str,
    world: World,
) -> None:
    """The epochs from ``state`` on: train, validate, keep the best weights, checkpoint each
    epoch (rank 0), stop early; ``state`` is updated in place. One reader streams every
    remaining epoch (its workers live as long as the run)."""
    todo = range(state["epoch"] + 1, params.epochs + 1)
    reader = inputs.reader(todo) if todo and not state["stopped"] else None
    try:
        _epochs(trainer, state, params, task, inputs, reader, ckpt_dir, fingerprint, world)
    finally:
        if reader is not None:
            reader.close()


def _epochs(
    trainer: Trainer,
    state: dict[str, Any],
    params: TrainParamsLike,
    task: Task,
    inputs: Inputs,
    reader: stream.Reader | None,
    ckpt_dir: Path,
    fingerprint: str,
    world: World,
) -> None:
    trial_mode = os.environ.get(TRIAL_ENV) == "1"
    bar = progress(state["epoch"], params.epochs, inputs.share.steps, world, trial_mode)
    for epoch in range(state["epoch"] + 1, params.epochs + 1):
        if state["stopped"] or reader is None:
            break
        bar.set_postfix(epoch=f"{epoch}/{params.epochs}")
        lr = trainer.scheduler.get_lr()  # at the epoch's start
        train = _train_epoch(trainer, state, params, task, inputs, reader, epoch, world, bar)
        objective = trainer.objective
        val_batches = reader.take(len(inputs.val_pieces))
        val = objective.validate(task, trainer.model, val_batches, inputs.val_rows, world)
        for _ in val_batches:  # the reader's sequence goes on with the next epoch
            pass
        _keep_best(trainer, state, params, {"epoch": epoch, "lr": lr}, train, val)
        bar.set_postfix(
            epoch=f"{epoch}/{params.epochs}",
            loss=f"{next(iter(train.values())):.4f}",
            **{f"val_{objective.score}": f"{val[objective.score]:.4f}"},
        )
        if trial_mode and world.main:
            row = state["history"][-1]
            metrics = {k: v for k, v in row.items() if k.startswith("val_")}
            line = trial_metrics.metric_line(epoch, metrics, datetime.now(UTC))
            sys.stdout.write(line + "\n")  # the protocol the search reads, not a log line
            sys.stdout.flush()
        log.debug("epoch %d: %s", epoch, state["history"][-1])
        if not world.main:  # the ranks hold the same state; rank 0 writes it
            continue
        _checkpoint(trainer, state, ckpt_dir, fingerprint, epoch)
    bar.close()


def progress(done_epochs: int, epochs: int, steps: int, world: World, trial_mode: bool) -> tqdm:
    """The run's progress bar on rank 0: one tick per optimizer step of every epoch (so a run
    of one epoch moves too), the epoch and its scores in the postfix; resumed runs start at
    the steps of the epochs done. Silent in a search's trial (``PADDLE_MLOPS_TRIAL=1``): it
    prints one metric line per epoch on stdout instead, and Katib's collector reads stderr
    merged into it, where a bar's line has no end."""
    return tqdm(
        desc="train",
        unit="step",
        initial=done_epochs * steps,
        total=epochs * steps,
        disable=not world.main or trial_mode,
    )


def _ticking(batches: Iterator[InputBatch], bar: tqdm) -> Iterator[InputBatch]:
    """``batches``, ticking ``bar`` once each has been trained on (when the next is asked)."""
    for batch in batches:
        yield batch
        bar.update()


def _train_epoch(
    trainer: Trainer,
    state: dict[str, Any],
    params: TrainParamsLike,
    task: Task,
    inputs: Inputs,
    reader: stream.Reader,
    epoch: int,
    world: World,
    bar: tqdm,
) -> dict[str, float]:
    """Epoch ``epoch``'s training pass, reseeded from ``(seed, epoch, rank)``; its means
    (``bar`` ticks at every step)."""
    # dropout: each rank its own masks (rank 0's seed is the single-process one)
    paddle.seed(params.seed * 1000 + epoch + RANK_SEED_STRIDE * world.rank)
    t0 = time.perf_counter()
    # the task's batches and augmentations (and a generator's latents): this rank's
    rng = np.random.default_rng([params.seed, epoch, world.rank])
    batches = _ticking(inputs.batches(reader, epoch, rng), bar)
    train = trainer.epoch(task, batches, inputs.share, rng, world, epoch)
    state["train_seconds"] += time.perf_counter() - t0
    state["samples_seen"] += inputs.share.used
    if not trainer.per_batch:
        for scheduler in trainer.schedulers:
            scheduler.step()
    world.average_buffers(trainer.model)  # BatchNorm statistics: the same on every rank
    return train


def _keep_best(
    trainer: Trainer,
    state: dict[str, Any],
    params: TrainParamsLike,
    at: dict[str, Any],
    train: dict[str, float],
    val: dict[str, float],
) -> None:
    """Record the epoch (``at``: its number and learning rate) in the history; keep its
    weights if it is the best; stop early."""
    objective, best, epoch = trainer.objective, state["best"], at["epoch"]
    state["history"].append(
        {
            "epoch": epoch,
            **{f"train_{k}": v for k, v in train.items()},
            **{f"val_{k}": v for k, v in val.items()},
            "lr": at["lr"],
        }
    )
    # the best epoch: the score's best value (kept as "higher is better" inside)
    score = val[objective.score] if objective.higher_is_better else -val[objective.score]
    if score > best["score"] + params.early_stopping.min_delta:
        best.update(score=score, epoch=epoch, bad_epochs=0)
        state["best_state"] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    else:
        best["bad_epochs"] += 1
    state["stopped"] = best["bad_epochs"] >= params.early_stopping.patience


def _checkpoint(
    trainer: Trainer, state: dict[str, Any], ckpt_dir: Path, fingerprint: str, epoch: int
) -> None:
    """The checkpoint after ``epoch`` (rank 0), and the early stop's line."""
    best = state["best"]
    training.save_checkpoint(
        ckpt_dir,
        trainer.model,
        trainer.opts,
        state["best_state"],
        training.checkpoint_state(fingerprint, epoch, state),
    )
    log.info("checkpoint after epoch %d written to %s", epoch, ckpt_dir / "last")
    if state["stopped"]:
        log.info(
            "early stopping after epoch %d (best epoch %d, %s %.4f)",
            epoch,
            best["epoch"],
            score_name(trainer.objective),
            best_score(trainer.objective, best),
        )
