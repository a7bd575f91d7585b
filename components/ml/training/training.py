"""The task-independent parts of a training run (the train step, ``components/steps/train.py``).

- Device and AMP choice (:func:`resolve_device`, :func:`resolve_amp`): on CUDA, ``auto`` means
  O1; the CPU wheel has no AMP kernels, so on CPU training runs in float32 and the effective
  mode says ``off``.
- Checkpoints (:func:`fingerprint`, :func:`save_checkpoint`, :func:`load_checkpoint`,
  :func:`resume`): written atomically after every epoch, resumed only when made with the
  same params and data.
- What the ranks must agree on (:func:`same_start`, :func:`rank_digests`), and what a run
  reports (:class:`TrainResult`, :func:`speeds`, :func:`curves_csv`,
  :func:`written_result`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import yaml

from components.core.artifacts import StepError, atomic_path, read_json, write_json
from components.core.config import params_sha256
from components.ml.training import distributed
from components.ml.training.distributed import Batching, World

log = logging.getLogger(__name__)
# 2: named optimizers, the best epoch's "score"; 3: streamed epochs (older ones are ignored)
CHECKPOINT_FORMAT = 3
# train params a checkpoint does not depend on (how many ranks or loader workers compute it)
FINGERPRINT_IGNORES = ("distributed", "loader_workers", "reader_probe_samples", "cache_mb")


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


def resolve_batching(
    params: distributed.DistributedParams,
    batch_size: int,
    learning_rate: float,
    world: World,
) -> Batching:
    """The global and per-rank batch and the learning rate; a global batch too small for the
    ranks is one line."""
    batching = Batching.resolve(params, batch_size, learning_rate, world.size)
    if world.size > 1:
        log.info("rank %d of %d: %s", world.rank, world.size, batching.facts())
    if batching.global_batch < world.size:
        raise StepError(
            f"a global batch of {batching.global_batch} cannot be shared by {world.size} ranks "
            "(train.batch_size, train.distributed.batch)"
        )
    return batching


# --------------------------------------------------------------------------- checkpoints


def fingerprint(
    train: Mapping[str, Any], task_params: dict[str, Any], data_sha: str, batching: Batching
) -> str:
    """What a checkpoint must have been made with to be resumed: the ``train`` params, the
    task, the data and the global batch and learning rate (not how many ranks computed them:
    with ``distributed.batch: global`` a run may resume at another world size; nor how many
    loader workers read the pieces, which changes nothing)."""
    kept = {k: v for k, v in train.items() if k not in FINGERPRINT_IGNORES}
    kept["batching"] = {"global": batching.global_batch, "lr": batching.learning_rate}
    return params_sha256(
        {"train": kept, "task": task_params, "data": data_sha, "format": CHECKPOINT_FORMAT}
    )


def save_checkpoint(
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
            paddle.save(opt.state_dict(), str(tmp / opt_file(name, opts)))
        paddle.save(best_state, str(tmp / "best.pdparams"))
        write_json(tmp / "state.json", state)  # last: marks the checkpoint complete


def opt_file(name: str, opts: dict[str, Any]) -> str:
    """The first optimizer's state is ``opt.pdopt``; another's ``opt-<name>.pdopt``."""
    return "opt.pdopt" if name == next(iter(opts)) else f"opt-{name}.pdopt"


def load_checkpoint(ckpt_dir: Path, fingerprint: str) -> dict[str, Any] | None:
    state_file = ckpt_dir / "last" / "state.json"
    if not state_file.exists():
        return None
    state = read_json(state_file)
    if state.get("fingerprint") != fingerprint:
        log.info("ignoring checkpoint in %s: it was made with other params or data", ckpt_dir)
        return None
    return state


def resume(
    model: paddle.nn.Layer,
    opts: dict[str, paddle.optimizer.Optimizer],
    ckpt_dir: Path,
    state: dict[str, Any] | None,
) -> dict[str, Any]:
    """Training state from ``state``, the checkpoint made with these params and data
    (:func:`load_checkpoint`), loaded into ``model`` and ``opts``; else fresh."""
    fresh = {
        "history": [],
        "best": {"score": -math.inf, "epoch": 0, "bad_epochs": 0},  # score: higher is better
        "best_state": {k: v.clone() for k, v in model.state_dict().items()},
        "train_seconds": 0.0,
        "samples_seen": 0,
        "epoch": 0,
        "stopped": False,
        "resumed_from": None,
        "pretrain": {},  # what Task.pretrain reported (kept in the checkpoint for a resume)
    }
    if state is None:
        return fresh
    model.set_state_dict(paddle.load(str(ckpt_dir / "last" / "model.pdparams")))
    for name, opt in opts.items():
        opt.set_state_dict(paddle.load(str(ckpt_dir / "last" / opt_file(name, opts))))
    log.info("resuming from checkpoint after epoch %d", state["epoch"])
    return {
        **fresh,
        **{k: state[k] for k in ("history", "best", "train_seconds", "samples_seen", "epoch")},
        "best_state": paddle.load(str(ckpt_dir / "last" / "best.pdparams")),
        "stopped": state.get("stopped", False),
        "resumed_from": state["epoch"] + 1,
        "pretrain": state.get("pretrain", {}),
    }


def checkpoint_state(fingerprint: str, epoch: int, state: dict[str, Any]) -> dict[str, Any]:
    """The ``state.json`` of the checkpoint after ``epoch``."""
    return {
        "fingerprint": fingerprint,
        "epoch": epoch,
        "history": state["history"],
        "best": state["best"],
        "train_seconds": state["train_seconds"],
        "samples_seen": state["samples_seen"],
        "stopped": state["stopped"],
        "pretrain": state["pretrain"],
    }


# --------------------------------------------------------------------------- ranks


def launch_ranks(
    plan: distributed.LaunchPlan,
    argv: Callable[[Path], Sequence[str]],
    sections: Mapping[str, Any],
    log_dir: Path,
) -> None:
    """Run the step as ``plan``'s ranks on this node: ``argv(params_file)`` is a rank's
    command line, ``sections`` the params this process was given (written for the ranks)."""
    with tempfile.TemporaryDirectory(prefix="paddle-mlops-train-") as tmp:
        params_file = Path(tmp) / "params.yaml"  # what this process was given, for the ranks
        params_file.write_text(yaml.safe_dump(json.loads(json.dumps(dict(sections)))))
        distributed.launch(plan, list(argv(params_file)), log_dir)


def written_result(out_dir: Path, metrics_file: Path) -> TrainResult | None:
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


def same_start(world: World, epoch: int, ckpt_dir: Path) -> None:
    """Every rank resumes from the same epoch: else the checkpoint directory is not shared."""
    starts = world.all_gather(int(epoch))
    if len(set(starts)) > 1:
        raise StepError(
            f"ranks would resume from different epochs {starts} (rank order): the checkpoint "
            f"directory {ckpt_dir} must be one volume that every node shares"
        )


def rank_digests(world: World, model: paddle.nn.Layer, best: dict[str, Any]) -> list[str]:
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


# --------------------------------------------------------------------------- reports


def speeds(result: TrainResult) -> dict[str, float]:
    """samples/s of the train step and of the reader alone, and their ratio."""
    out = {"samples_per_second": round(result.samples_per_second, 2)}
    reader = result.reader_samples_per_second
    if reader is not None:
        out["reader_samples_per_second"] = round(reader, 2)
        if result.samples_per_second > 0:
            out["reader_vs_train"] = round(reader / result.samples_per_second, 3)
    return out


def log_result(result: TrainResult, reader_vs_train: float | None) -> None:
    """The run's one-line summary, and the reader's speed beside the train step's."""
    log.info(
        "best %s %.4f at epoch %d; %d epochs, %.0f samples/s, amp=%s",
        result.score_name,
        result.best_score,
        result.best_epoch,
        result.epochs_run,
        result.samples_per_second,
        result.amp_effective,
    )
    if result.reader_samples_per_second is not None:
        log.info(
            "input pipeline: reader %.0f samples/s vs train step %.0f samples/s (x%s)",
            result.reader_samples_per_second,
            result.samples_per_second,
            reader_vs_train,
        )


def curves_csv(history: list[dict[str, float]]) -> str:
    buf = io.StringIO()
    cols = list(history[0]) if history else ["epoch", "lr"]
    writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    writer.writeheader()
    for row in history:
        writer.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()})
    return buf.getvalue()


def has_batch_norm(model: paddle.nn.Layer) -> bool:
    norms = (paddle.nn.BatchNorm, paddle.nn.BatchNorm1D, paddle.nn.BatchNorm2D)
    return any(isinstance(layer, norms) for layer in model.sublayers())
