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
  of ``train.shuffle_buffer`` samples; validation is scored batch by batch. Preprocessed pieces
  are kept on disk under the checkpoint directory (``pieces/``, up to ``train.cache_mb``), so
  preprocessing is paid once, not every epoch (augmentation still is). The task's fitting
  hooks (a vocabulary, a judge, pretraining, soft targets) get the split as streams too
  (``TrainingData``). Before training, the reader alone is timed over
  ``train.reader_probe_samples`` samples: ``metrics/train.json`` records its samples/s beside
  the train step's (``reader_samples_per_second``, ``samples_per_second``, ``reader_vs_train``).
- A checkpoint is written atomically after every epoch. A killed run restarted with the same
  params and data resumes from it and ends with the same weights as an uninterrupted run:
  every epoch's piece order, shuffle, batches, augmentations and dropout reseed from
  ``(seed, epoch)`` (and the rank), whatever the number of loader workers. A checkpoint from
  other params or data is ignored.
- Data parallel (``train.distributed``, :mod:`components.ml.training.distributed`): with ``nproc``
  > 1, or in a Kubeflow PaddleJob's pods (``PADDLE_MASTER``/``PADDLE_NNODES``), the step launches
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

import logging
from dataclasses import asdict, field
from pathlib import Path
from typing import Annotated, Any, Literal

import paddle
from pydantic import Field

from components.core.artifacts import (
    StepError,
)
from components.core.config import params_model
from components.kernel.step import DATA, VALIDATED, In, Out, Step
from components.ml.data import dataset
from components.ml.training import distributed, training
from components.ml.training.distributed import DistributedParams, World
from components.ml.training.training import TrainResult, resolve_amp, resolve_device
from components.tasks import Task, epochs, train_outputs
from components.tasks.stream import StreamSettings

log = logging.getLogger(__name__)


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
    cache_mb: AtLeast0 = 1024  # preprocessed pieces kept on disk (<checkpoints>/pieces); 0: off
    reader_probe_samples: AtLeast0 = 2048  # timed before training: the reader alone (0: off)
    # a smoke / benchmark bound on an epoch's work (None: the whole split): at most this many
    # optimizer steps per epoch (the first max_steps_per_epoch * global batch samples of the
    # epoch's order), and at most max_val_steps validation batches (of eval_batch_size) per
    # epoch, the split's first in manifest order
    max_steps_per_epoch: AtLeast1 | None = None
    max_val_steps: AtLeast1 | None = None

    def stream(self) -> StreamSettings:
        return StreamSettings(
            self.shuffle_buffer, self.piece_rows, self.loader_workers, cache_mb=self.cache_mb
        )


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
    paths = {"data_dir": data_dir, "out_dir": out_dir, "checkpoint_dir": ckpt_dir}
    paths |= {"metrics_file": metrics_file, "plots_file": plots_file}
    if launch_plan is not None:
        if task_params is None:  # the ranks rebuild the task from its params section
            raise StepError("data-parallel training needs task_params (params.yaml: task)")
        training.launch_ranks(
            launch_plan,
            lambda params_file: STEP.argv(params_file, {**paths, "hpo_dir": ""}),  # overlaid
            {"task": task_params, "train": asdict(params)},
            params.distributed.log_dir,
        )
        return training.written_result(out_dir, metrics_file)

    world = World.from_env()
    world.init()
    paddle.set_device(device)
    amp = resolve_amp(params.amp, params.amp_dtype, device)
    log_fn = log.warning if (params.amp != "off" and not amp.enabled) else log.info
    log_fn("AMP requested=%s effective=%s: %s", amp.requested, amp.level, amp.reason)
    batching = training.resolve_batching(
        params.distributed, params.batch_size, params.learning_rate, world
    )
    setup = epochs.Setup(device, amp, batching, world)
    fitted = epochs.train(
        params, task, data_dir, ckpt_dir, setup, task_params or {}, len(label_names)
    )
    if not world.main:
        log.info("rank %d done; rank 0 writes the outputs", world.rank)
        return None
    return train_outputs.write_results(
        fitted,
        paths,
        params=params,
        setup=setup,
        task=task,
        task_params=task_params or {},
        label_names=label_names,
    )


STEP = Step(
    name="train",
    doc=__doc__,
    params=TrainParams,
    sections=("task", "train"),
    run=run,
    inputs=(
        DATA,
        VALIDATED,
        # a search's outcome: the keys it adopted are set in the params before they are typed
        In(
            "hpo",
            "outputs/hpo",
            "hpo_dir",
            source="hpo.out",
            files=("overlay.yaml",),
            params_overlay=True,
            help="hpo's output directory: its overlay.yaml's adopted params",
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
