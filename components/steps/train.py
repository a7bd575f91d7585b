"""train: dynamic-graph training with AMP where the device has it, early stopping and resume.

- ``amp: auto|off|O1|O2`` + ``amp_dtype``: on CUDA, ``auto`` means O1 (``paddle.amp.auto_cast``
  + ``GradScaler`` for float16, loss computed in float32). The CPU wheel has no AMP kernels
  (``auto_cast`` there is a silent no-op), so on CPU training runs in float32, a warning is
  logged, and ``amp_effective`` records ``off`` — never what was merely requested.
- Early stopping on the task's validation score (``Objective.score``: accuracy for the
  classifiers, a generator's Frechet distance) with ``patience`` and ``min_delta``. The
  loss, the optimizers and the score are the task's (:mod:`components.tasks.objective`).
- The data is streamed, never loaded whole (:mod:`components.tasks.stream`): bounded pieces of
  the snapshot's shards, read and preprocessed by ``train.loader_workers`` processes of a
  ``paddle.io.DataLoader``, in an order drawn from ``(seed, epoch)``, through a shuffle buffer
  of ``train.shuffle_buffer`` samples; validation is scored batch by batch. The task's fitting
  hooks (a vocabulary, a judge, pretraining, soft targets) get the split as streams too
  (``TrainingData``). Before training, the reader alone is timed over
  ``train.reader_probe_samples`` samples: ``metrics/train.json`` records its samples/s beside
  the train step's (``reader_samples_per_second``, ``samples_per_second``, ``reader_vs_train``).
- A checkpoint is written atomically after every epoch. A killed run restarted with the same
  params and data resumes from it and ends with the same weights as an uninterrupted run:
  every epoch's piece order, shuffle, batches, augmentations and dropout reseed from
  ``(seed, epoch)`` (and the rank), whatever the number of loader workers. A checkpoint from
  other params or data is ignored.
- Data parallel (``train.distributed``, :mod:`components.ml.distributed`): with ``nproc`` > 1, or
  in a Kubeflow PaddleJob's pods (``PADDLE_MASTER``/``PADDLE_NNODES``), the step launches
  itself as ranks with ``paddle.distributed.launch``. Each epoch's samples, in its piece
  order, are cut into one contiguous run per rank (``EpochShare``): the ranks read disjoint
  samples and run the same number of steps; the at most ``world_size - 1`` samples that would
  leave a rank without a sample in the last step are not read in that epoch. Each rank
  weights its loss so that ``paddle.DataParallel``'s gradient average is the global batch's
  mean. Validation batches are shared out and the sums added over ranks, so early stopping
  decides the same everywhere. Only global rank 0 writes checkpoints, outputs and metrics; at
  the end the ranks compare parameter digests and the step fails if they differ.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import paddle
import yaml
from pydantic import Field
from tqdm import tqdm

from components.core.artifacts import (
    StepError,
    atomic_path,
    read_json,
    write_json,
    write_manifest,
    write_text,
)
from components.core.config import params_model, params_sha256
from components.faults import failpoints
from components.kernel.step import DATA, In, Out, Step
from components.ml import dataset, distributed, snapshot
from components.ml.distributed import Batching, DistributedParams, EpochShare, World
from components.tasks import Task, stream
from components.tasks.base import ASSETS_DIR, SoftTargets, TrainSettings
from components.tasks.data import check_format
from components.tasks.objective import Objective, StepContext
from components.tasks.stream import InputBatch, StreamSettings

log = logging.getLogger(__name__)
SINGLE = World()  # one process, no launch
# 2: named optimizers, the best epoch's "score"; 3: streamed epochs (older ones are ignored)
CHECKPOINT_FORMAT = 3
RANK_SEED_STRIDE = 7919  # paddle.seed offset per rank (a prime: no rank meets another's epoch)


AtLeast1 = Annotated[int, Field(ge=1)]
AtLeast0 = Annotated[int, Field(ge=0)]


@params_model
class EarlyStopping:
    patience: AtLeast1 = 10
    min_delta: float = 0.0


@params_model
class TrainParams:
    epochs: AtLeast1 = 40
    batch_size: AtLeast1 = 32
    learning_rate: Annotated[float, Field(gt=0)] = 1e-3
    lr_step_size: int = 15
    lr_gamma: float = 0.5
    weight_decay: float = 0.0
    seed: int = 42
    amp: Literal["auto", "off", "O1", "O2"] = "auto"
    amp_dtype: Literal["float16", "bfloat16"] = "float16"
    device: Literal["auto", "cpu", "gpu"] = "auto"
    eval_batch_size: AtLeast1 = 256
    early_stopping: EarlyStopping = field(default_factory=EarlyStopping)
    distributed: DistributedParams = field(default_factory=DistributedParams)
    # the input pipeline (components.tasks.stream; docs/distributed.md)
    shuffle_buffer: AtLeast1 = 2048  # preprocessed samples held for shuffling
    piece_rows: AtLeast1 = 256  # rows of a shard read at once (a piece)
    loader_workers: AtLeast0 = 1  # paddle.io.DataLoader processes reading pieces; 0: this process
    reader_probe_samples: AtLeast0 = 2048  # timed before training: the reader alone (0: off)

    def stream(self) -> StreamSettings:
        return StreamSettings(self.shuffle_buffer, self.piece_rows, self.loader_workers)


@dataclass(frozen=True)
class AmpMode:
    requested: str
    level: str  # "off", "O1" or "O2"
    dtype: str
    reason: str

    @property
    def enabled(self) -> bool:
        return self.level != "off"


@dataclass(frozen=True)
class TrainResult:
    model_path: Path
    best_score: float  # the task's validation score at the best epoch
    score_name: str  # e.g. "val_accuracy", "val_fid"
    best_epoch: int
    epochs_run: int
    samples_per_second: float
    amp_effective: str
    resumed_from_epoch: int | None
    reader_samples_per_second: float | None = None  # the reader alone (all ranks), if timed


def resolve_device(requested: str) -> str:
    has_gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if requested == "gpu" and not has_gpu:
        raise StepError(
            "train.device is 'gpu' but no CUDA device is visible (set train.device: auto or cpu)"
        )
    return "gpu" if (requested == "gpu" or (requested == "auto" and has_gpu)) else "cpu"


def resolve_amp(requested: str, dtype: str, device: str) -> AmpMode:
    """Decide which AMP mode really runs on ``device``."""
    if requested == "off":
        return AmpMode(requested, "off", "float32", "disabled in params")
    if device != "gpu":
        return AmpMode(
            requested,
            "off",
            "float32",
            "AMP is unavailable on CPU (the CPU wheel's auto_cast is a no-op); training fp32",
        )
    level = "O1" if requested == "auto" else requested
    return AmpMode(requested, level, dtype, f"{level} {dtype} on CUDA")


# --------------------------------------------------------------------------- checkpoints


def _fingerprint(
    params: TrainParams, task_params: dict[str, Any], data_sha: str, batching: Batching
) -> str:
    """What a checkpoint must have been made with to be resumed: the params, the task, the
    data and the global batch and learning rate (not how many ranks computed them: with
    ``distributed.batch: global`` a run may resume at another world size; nor how many
    loader workers read the pieces, which changes nothing)."""
    ignored = ("distributed", "loader_workers", "reader_probe_samples")
    train = {k: v for k, v in asdict(params).items() if k not in ignored}
    train["batching"] = {"global": batching.global_batch, "lr": batching.learning_rate}
    return params_sha256(
        {"train": train, "task": task_params, "data": data_sha, "format": CHECKPOINT_FORMAT}
    )


def _save_checkpoint(
    ckpt_dir: Path,
    model: paddle.nn.Layer,
    opts: dict[str, paddle.optimizer.Optimizer],
    best_state: dict[str, Any],
    state: dict[str, Any],
) -> None:
    with atomic_path(ckpt_dir / "last") as tmp:
        tmp.mkdir()
        paddle.save(model.state_dict(), str(tmp / "model.pdparams"))
        for name, opt in opts.items():
            paddle.save(opt.state_dict(), str(tmp / _opt_file(name, opts)))
        paddle.save(best_state, str(tmp / "best.pdparams"))
        write_json(tmp / "state.json", state)  # last: marks the checkpoint complete


def _opt_file(name: str, opts: dict[str, Any]) -> str:
    """The first optimizer's state is ``opt.pdopt``; another's ``opt-<name>.pdopt``."""
    return "opt.pdopt" if name == next(iter(opts)) else f"opt-{name}.pdopt"


def _load_checkpoint(ckpt_dir: Path, fingerprint: str) -> dict[str, Any] | None:
    state_file = ckpt_dir / "last" / "state.json"
    if not state_file.exists():
        return None
    state = read_json(state_file)
    if state.get("fingerprint") != fingerprint:
        log.info("ignoring checkpoint in %s: it was made with other params or data", ckpt_dir)
        return None
    return state


# --------------------------------------------------------------------------- loops


def _has_batch_norm(model: paddle.nn.Layer) -> bool:
    norms = (paddle.nn.BatchNorm, paddle.nn.BatchNorm1D, paddle.nn.BatchNorm2D)
    return any(isinstance(layer, norms) for layer in model.sublayers())


@dataclass
class _Trainer:
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
        params: TrainParams,
        task: Task,
        num_classes: int,
        amp: AmpMode,
        steps_per_epoch: int,
        batching: Batching,
        device: str,
    ) -> _Trainer:
        paddle.seed(params.seed)
        model = task.build_model(num_classes)
        if batching.world_size > 1 and _has_batch_norm(model):
            if device == "gpu":  # batch statistics over the global batch
                model = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(model)
            else:  # Paddle's CPU wheel has no sync_batch_norm kernel
                log.warning(
                    "data parallel on CPU: BatchNorm statistics are each rank's own "
                    "(%d samples), not the global batch's",
                    batching.per_rank_batch,
                )
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
        scaler = None
        if amp.enabled:
            if amp.level == "O2":
                model, decorated = paddle.amp.decorate(
                    models=model, optimizers=list(opts.values()), level="O2", dtype=amp.dtype
                )
                opts = dict(zip(opts, decorated, strict=True))
            if amp.dtype == "float16":
                scaler = paddle.amp.GradScaler(init_loss_scaling=2.0**15)
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


@dataclass(frozen=True)
class _Inputs:
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
    val_rows: int  # the whole validation split's

    @classmethod
    def build(
        cls,
        snap: snapshot.Snapshot,
        task: Task,
        params: TrainParams,
        share: EpochShare,
        world: World,
        objective: Objective,
    ) -> _Inputs:
        val = stream.piece_table(snap, "val", params.eval_batch_size)
        if objective.sharded_validation:
            mine = val[world.rank :: world.size]
        else:  # rank 0 scores the whole split
            mine = val if world.main else val[:0]
        return cls(
            snap,
            task,
            params.stream(),
            params.seed,
            share,
            world.rank,
            stream.piece_table(snap, "train", params.piece_rows),
            mine,
            snap.rows("val"),
        )

    def train(self, epoch: int) -> np.ndarray:
        """This rank's pieces of ``epoch``: its run of the epoch's order."""
        order = stream.epoch_order(self.train_pieces, (self.seed, epoch))
        return stream.cut(order, self.share.start(self.rank), self.share.rank_rows(self.rank))

    def reader(self, epochs: Sequence[int], val: bool = True) -> stream.Reader:
        plan = stream.Plan(tuple(epochs), self.train, self.val_pieces if val else _NO_PIECES)
        pieces = stream.PieceStream(self.snap, self.task.data, self.task.preprocess, plan)
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


def _resume(trainer: _Trainer, ckpt_dir: Path, state: dict[str, Any] | None) -> dict[str, Any]:
    """Training state from ``state``, the checkpoint made with these params and data
    (:func:`_load_checkpoint`), else fresh."""
    fresh = {
        "history": [],
        "best": {"score": -math.inf, "epoch": 0, "bad_epochs": 0},  # score: higher is better
        "best_state": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "train_seconds": 0.0,
        "samples_seen": 0,
        "epoch": 0,
        "stopped": False,
        "resumed_from": None,
        "pretrain": {},  # what Task.pretrain reported (kept in the checkpoint for a resume)
    }
    if state is None:
        return fresh
    trainer.model.set_state_dict(paddle.load(str(ckpt_dir / "last" / "model.pdparams")))
    for name, opt in trainer.opts.items():
        opt.set_state_dict(paddle.load(str(ckpt_dir / "last" / _opt_file(name, trainer.opts))))
    log.info("resuming from checkpoint after epoch %d", state["epoch"])
    return {
        **fresh,
        **{k: state[k] for k in ("history", "best", "train_seconds", "samples_seen", "epoch")},
        "best_state": paddle.load(str(ckpt_dir / "last" / "best.pdparams")),
        "stopped": state.get("stopped", False),
        "resumed_from": state["epoch"] + 1,
        "pretrain": state.get("pretrain", {}),
    }


def _fit(
    trainer: _Trainer,
    state: dict[str, Any],
    params: TrainParams,
    task: Task,
    inputs: _Inputs,
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
    trainer: _Trainer,
    state: dict[str, Any],
    params: TrainParams,
    task: Task,
    inputs: _Inputs,
    reader: stream.Reader | None,
    ckpt_dir: Path,
    fingerprint: str,
    world: World,
) -> None:
    history, best = state["history"], state["best"]
    epochs = tqdm(
        range(state["epoch"] + 1, params.epochs + 1),
        desc="train",
        unit="epoch",
        initial=state["epoch"],
        total=params.epochs,
        disable=not world.main,
    )
    for epoch in epochs:
        if state["stopped"] or reader is None:
            break
        # dropout: each rank its own masks (rank 0's seed is the single-process one)
        paddle.seed(params.seed * 1000 + epoch + RANK_SEED_STRIDE * world.rank)
        t0 = time.perf_counter()
        # the task's batches and augmentations (and a generator's latents): this rank's
        rng = np.random.default_rng([params.seed, epoch, world.rank])
        lr = trainer.scheduler.get_lr()  # at the epoch's start
        batches = inputs.batches(reader, epoch, rng)
        train = trainer.epoch(task, batches, inputs.share, rng, world, epoch)
        state["train_seconds"] += time.perf_counter() - t0
        state["samples_seen"] += inputs.share.used
        if not trainer.per_batch:
            for scheduler in trainer.schedulers:
                scheduler.step()
        world.average_buffers(trainer.model)  # BatchNorm statistics: the same on every rank

        objective = trainer.objective
        val_batches = reader.take(len(inputs.val_pieces))
        val = objective.validate(task, trainer.model, val_batches, inputs.val_rows, world)
        for _ in val_batches:  # the reader's sequence goes on with the next epoch
            pass
        row = {
            "epoch": epoch,
            **{f"train_{k}": v for k, v in train.items()},
            **{f"val_{k}": v for k, v in val.items()},
            "lr": lr,
        }
        history.append(row)
        # the best epoch: the score's best value (kept as "higher is better" inside)
        score = val[objective.score] if objective.higher_is_better else -val[objective.score]
        if score > best["score"] + params.early_stopping.min_delta:
            best.update(score=score, epoch=epoch, bad_epochs=0)
            state["best_state"] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        else:
            best["bad_epochs"] += 1
        state["stopped"] = best["bad_epochs"] >= params.early_stopping.patience
        epochs.set_postfix(
            loss=f"{next(iter(train.values())):.4f}",
            **{f"val_{objective.score}": f"{val[objective.score]:.4f}"},
        )
        log.debug("epoch %d: %s", epoch, row)
        if not world.main:  # the ranks hold the same state; rank 0 writes it
            continue
        _save_checkpoint(
            ckpt_dir,
            trainer.model,
            trainer.opts,
            state["best_state"],
            {
                "fingerprint": fingerprint,
                "epoch": epoch,
                "history": history,
                "best": best,
                "train_seconds": state["train_seconds"],
                "samples_seen": state["samples_seen"],
                "stopped": state["stopped"],
                "pretrain": state["pretrain"],
            },
        )
        log.info("checkpoint after epoch %d written to %s", epoch, ckpt_dir / "last")
        if state["stopped"]:
            log.info(
                "early stopping after epoch %d (best epoch %d, %s %.4f)",
                epoch,
                best["epoch"],
                _score_name(trainer.objective),
                _best_score(trainer.objective, best),
            )
    epochs.close()


def _score_name(objective: Objective) -> str:
    return f"val_{objective.score}"


def _best_score(objective: Objective, best: dict[str, Any]) -> float:
    """The best epoch's score as the objective states it (``best`` keeps higher-is-better)."""
    return float(best["score"] if objective.higher_is_better else -best["score"])


def run(
    params: TrainParams,
    task: Task,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    checkpoint_dir: str | Path,
    metrics_file: str | Path | None = None,
    plots_file: str | Path | None = None,
    task_params: dict[str, Any] | None = None,
) -> TrainResult | None:
    """Train ``task``'s model on ``data_dir``; write the best weights to ``out_dir``.

    With more than one rank (``train.distributed``, or a PaddleJob's environment) this
    launches the ranks, each running this step again, and returns what rank 0 wrote (None
    on a node whose ranks do not include rank 0)."""
    data_dir, out_dir, ckpt_dir = Path(data_dir), Path(out_dir), Path(checkpoint_dir)
    metrics_file = Path(metrics_file) if metrics_file else out_dir / "metrics.json"
    plots_file = Path(plots_file) if plots_file else out_dir / "curves.csv"
    label_names = dataset.read_label_names(data_dir)  # bad input fails here, before a launch
    device = resolve_device(params.device)
    launch_plan = distributed.plan(params.distributed, device)
    if launch_plan is not None:
        if task_params is None:  # the ranks rebuild the task from its params section
            raise StepError("data-parallel training needs task_params (params.yaml: task)")
        _launch_ranks(
            launch_plan,
            params,
            {
                "data_dir": data_dir,
                "out_dir": out_dir,
                "checkpoint_dir": ckpt_dir,
                "metrics_file": metrics_file,
                "plots_file": plots_file,
            },
            {"task": task_params, "train": asdict(params)},
        )
        return _written_result(out_dir, metrics_file)

    world = World.from_env()
    world.init()
    paddle.set_device(device)
    amp = resolve_amp(params.amp, params.amp_dtype, device)
    log_fn = log.warning if (params.amp != "off" and not amp.enabled) else log.info
    log_fn("AMP requested=%s effective=%s: %s", amp.requested, amp.level, amp.reason)
    batching = Batching.resolve(
        params.distributed, params.batch_size, params.learning_rate, world.size
    )
    if world.size > 1:
        log.info("rank %d of %d: %s", world.rank, world.size, batching.facts())
    if batching.global_batch < world.size:
        raise StepError(
            f"a global batch of {batching.global_batch} cannot be shared by {world.size} ranks "
            "(train.batch_size, train.distributed.batch)"
        )

    check_format(data_dir, task.data, task.name)
    snap = snapshot.load(data_dir)
    share = _share(snap, batching, world, data_dir)
    # a vocabulary, a judge: fitted on the training split only, streamed
    training_data = stream.SnapshotData(snap, task, params.stream())
    task.fit_preprocessing(training_data)

    data_sha = "".join(snap.split_sha256(s) for s in ("train", "val"))
    fingerprint = _fingerprint(params, task_params or {}, data_sha, batching)
    trainer = _Trainer.build(params, task, len(label_names), amp, share.steps, batching, device)
    found = _load_checkpoint(ckpt_dir, fingerprint)
    if world.size > 1:  # before any long work: a rank that resumes must not wait for others
        _same_start(world, found["epoch"] if found else 0, ckpt_dir)
    pretrain_facts: dict[str, Any] = {}
    if found is None:  # resuming: the checkpoint has it
        pretrain_facts = task.pretrain(trainer.model, training_data)
    trainer.set_soft(task.soft_targets(training_data, len(label_names)), f"task {task.name}")
    state = _resume(trainer, ckpt_dir, found)
    if state["resumed_from"] is None:
        state["pretrain"] = pretrain_facts
    trainer.nets = trainer.objective.parallel(trainer.model, world.size)
    pretrained = {**state["pretrain"], **(trainer.soft.facts if trainer.soft else {})}
    inputs = _Inputs.build(snap, task, params, share, world, trainer.objective)
    reader_rate = _probe(inputs, params.reader_probe_samples, world)
    _fit(trainer, state, params, task, inputs, ckpt_dir, fingerprint, world)
    history, best = state["history"], state["best"]
    digests = _rank_digests(world, trainer.model, state["best_state"])
    if not world.main:
        log.info("rank %d done; rank 0 writes the outputs", world.rank)
        return None

    seconds = state["train_seconds"]
    result = TrainResult(
        model_path=out_dir / "model.pdparams",
        best_score=_best_score(trainer.objective, best),
        score_name=_score_name(trainer.objective),
        best_epoch=int(best["epoch"]),
        epochs_run=len(history),
        samples_per_second=state["samples_seen"] / seconds if seconds else 0.0,
        amp_effective=amp.level,
        resumed_from_epoch=state["resumed_from"],
        reader_samples_per_second=reader_rate,
    )
    _write_outputs(
        out_dir,
        result,
        state["best_state"],
        history,
        params=params,
        amp=amp,
        device=device,
        fingerprint=fingerprint,
        meta={
            "task": task.name,
            "task_params": task_params or {},
            "num_classes": len(label_names),
            "label_names": label_names,
            "best_epoch": result.best_epoch,
            **({"pretrain": pretrained} if pretrained else {}),
        },
        inputs={
            k: v for s in ("train", "val") for k, v in dataset.split_inputs(data_dir, s).items()
        },
        task=task,
        parallel={**batching.facts(), **share.facts(), "rank_param_sha256": digests},
        input_pipeline={
            "shuffle_buffer": params.shuffle_buffer,
            "piece_rows": params.piece_rows,
            "loader_workers": params.loader_workers,
            "reader_samples_per_second": reader_rate,
        },
    )
    speeds = _speeds(result)
    write_json(
        metrics_file,
        {
            f"best_{result.score_name}": result.best_score,
            "best_epoch": result.best_epoch,
            "epochs_run": result.epochs_run,
            **speeds,
            "amp_effective": result.amp_effective,
            "amp_requested": params.amp,
            **batching.facts(),
            **{k: v for k, v in pretrained.items() if not isinstance(v, list | dict)},
        },
    )
    write_text(plots_file, _curves_csv(history))
    log.info(
        "best %s %.4f at epoch %d; %d epochs, %.0f samples/s, amp=%s",
        result.score_name,
        result.best_score,
        result.best_epoch,
        result.epochs_run,
        result.samples_per_second,
        result.amp_effective,
    )
    if reader_rate is not None:
        log.info(
            "input pipeline: reader %.0f samples/s vs train step %.0f samples/s (x%s)",
            reader_rate,
            result.samples_per_second,
            speeds.get("reader_vs_train"),
        )
    return result


def _share(snap: snapshot.Snapshot, batching: Batching, world: World, data_dir: Path) -> EpochShare:
    """How the ranks share an epoch; a split too small for them is one line."""
    share = EpochShare(snap.rows("train"), batching.global_batch, world.size)
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


def _probe(inputs: _Inputs, limit: int, world: World) -> float | None:
    """The reader's samples/s alone (every rank's, added up), or None when not timed."""
    if limit <= 0:
        return None
    rates = world.all_gather(inputs.probe(limit))
    total = float(sum(rates))
    log.info("reader alone: %.0f samples/s (%d rank(s))", total, world.size)
    return total


def _speeds(result: TrainResult) -> dict[str, float]:
    """samples/s of the train step and of the reader alone, and their ratio."""
    out = {"samples_per_second": round(result.samples_per_second, 2)}
    reader = result.reader_samples_per_second
    if reader is not None:
        out["reader_samples_per_second"] = round(reader, 2)
        if result.samples_per_second > 0:
            out["reader_vs_train"] = round(reader / result.samples_per_second, 3)
    return out


def _launch_ranks(
    plan: distributed.LaunchPlan,
    params: TrainParams,
    paths: dict[str, Path],
    sections: Mapping[str, Any],
) -> None:
    """Run this step as ``plan``'s ranks on this node, with these params and paths."""
    with tempfile.TemporaryDirectory(prefix="paddle-mlops-train-") as tmp:
        params_file = Path(tmp) / "params.yaml"  # what this process was given, for the ranks
        params_file.write_text(yaml.safe_dump(json.loads(json.dumps(dict(sections)))))
        distributed.launch(plan, STEP.argv(params_file, paths), params.distributed.log_dir)


def _written_result(out_dir: Path, metrics_file: Path) -> TrainResult | None:
    """The result rank 0 wrote (None where this node's ranks did not write it)."""
    if not (out_dir / "manifest.json").exists() or not metrics_file.exists():
        log.info("this node's ranks finished; the outputs are rank 0's, on another node")
        return None
    metrics = read_json(metrics_file)
    (best_key,) = [k for k in metrics if k.startswith("best_val_")]
    return TrainResult(
        model_path=out_dir / "model.pdparams",
        best_score=float(metrics[best_key]),
        score_name=best_key.removeprefix("best_"),
        best_epoch=int(metrics["best_epoch"]),
        epochs_run=int(metrics["epochs_run"]),
        samples_per_second=float(metrics["samples_per_second"]),
        amp_effective=str(metrics["amp_effective"]),
        resumed_from_epoch=None,
        reader_samples_per_second=metrics.get("reader_samples_per_second"),
    )


def _same_start(world: World, epoch: int, ckpt_dir: Path) -> None:
    """Every rank resumes from the same epoch: else the checkpoint directory is not shared."""
    starts = world.all_gather(int(epoch))
    if len(set(starts)) > 1:
        raise StepError(
            f"ranks would resume from different epochs {starts} (rank order): the checkpoint "
            f"directory {ckpt_dir} must be one volume that every node shares"
        )


def _rank_digests(world: World, model: paddle.nn.Layer, best: dict[str, Any]) -> list[str]:
    """sha256 of each rank's final and best parameters; the step fails if the ranks differ."""
    digest = hashlib.sha256()
    for weights in (model.state_dict(), best):
        for key in sorted(weights):
            digest.update(key.encode())
            digest.update(np.ascontiguousarray(weights[key].numpy()).tobytes())
    digests = world.all_gather(digest.hexdigest())
    if world.size > 1:
        log.info("rank %d of %d: parameters sha256 %s", world.rank, world.size, digests[world.rank])
    if len(set(digests)) > 1:
        raise StepError(f"data-parallel ranks ended with different parameters: {digests}")
    return digests


def _write_outputs(
    out_dir: Path,
    result: TrainResult,
    best_state: dict[str, Any],
    history: list[dict[str, Any]],
    *,
    params: TrainParams,
    amp: AmpMode,
    device: str,
    fingerprint: str,
    meta: dict[str, Any],
    inputs: dict[str, Path],
    task: Task,
    parallel: dict[str, Any],
    input_pipeline: dict[str, Any],
) -> None:
    """The best weights, their metadata, the task's fitted assets, the history and the
    manifest, atomically."""
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        paddle.save(best_state, str(tmp / "model.pdparams"))
        task.save_assets(tmp / ASSETS_DIR)
        write_json(tmp / "model_meta.json", meta)
        write_json(tmp / "history.json", history)
        write_manifest(
            tmp,
            "train",
            inputs=inputs,
            outputs={
                "model.pdparams": tmp / "model.pdparams",
                **{
                    p.relative_to(tmp).as_posix(): p
                    for p in sorted((tmp / ASSETS_DIR).rglob("*"))
                    if p.is_file()
                },
            },
            params=asdict(params),
            extra={
                "amp": asdict(amp),
                "device": device,
                "fingerprint": fingerprint,
                "distributed": parallel,
                "input_pipeline": input_pipeline,
            },
        )


def _curves_csv(history: list[dict[str, float]]) -> str:
    buf = io.StringIO()
    cols = list(history[0]) if history else ["epoch", "lr"]
    writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    writer.writeheader()
    for row in history:
        writer.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()})
    return buf.getvalue()


STEP = Step(
    name="train",
    doc=__doc__,
    params=TrainParams,
    sections=("task", "train"),
    run=run,
    inputs=(
        DATA,
        # trains only on data that passed validation
        In(
            "validation",
            "outputs/validate",
            "",
            source="validate.report",
            files=("summary.json",),
            order_only=True,
        ),
    ),
    outputs=(
        Out("model", "outputs/train", "out_dir", kfp="Model", help="best weights"),
        Out(
            "checkpoints",
            "checkpoints/train",
            "checkpoint_dir",
            dvc="persist",
            help="per-epoch state; a killed run resumes from it",
        ),
        Out("metrics", "metrics/train.json", "metrics_file", kfp="Metrics", dvc="metrics"),
        Out("plots", "plots/train.csv", "plots_file", dvc="plots", help="curves per epoch"),
    ),
)
