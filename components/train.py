"""train: dynamic-graph training with AMP where the device has it, early stopping and resume.

- ``amp: auto|off|O1|O2`` + ``amp_dtype``: on CUDA, ``auto`` means O1 (``paddle.amp.auto_cast``
  + ``GradScaler`` for float16, loss computed in float32). The CPU wheel has no AMP kernels
  (``auto_cast`` there is a silent no-op), so on CPU training runs in float32, a warning is
  logged, and ``amp_effective`` records ``off`` — never what was merely requested.
- Early stopping on validation accuracy with ``patience`` and ``min_delta``.
- A checkpoint is written atomically after every epoch. A killed run restarted with the same
  params and data resumes from it and ends with the same weights as an uninterrupted run:
  every epoch reseeds from ``(seed, epoch)``. A checkpoint from other params or data is ignored.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import paddle
import paddle.nn.functional as F
from tqdm import tqdm

from components import dataset
from components.artifacts import (
    StepError,
    atomic_path,
    read_json,
    sha256_file,
    write_json,
    write_manifest,
    write_text,
)
from components.cli import output_dir, run_cli, step_params, step_parser, task_from_params
from components.config import params_sha256
from components.tasks import Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EarlyStopping:
    patience: int = 10
    min_delta: float = 0.0

    def check(self) -> None:
        if self.patience < 1:
            raise ValueError("early_stopping.patience must be >= 1")


@dataclass(frozen=True)
class TrainParams:
    epochs: int = 40
    batch_size: int = 32
    learning_rate: float = 1e-3
    lr_step_size: int = 15
    lr_gamma: float = 0.5
    weight_decay: float = 0.0
    seed: int = 42
    amp: Literal["auto", "off", "O1", "O2"] = "auto"
    amp_dtype: Literal["float16", "bfloat16"] = "float16"
    device: Literal["auto", "cpu", "gpu"] = "auto"
    eval_batch_size: int = 256
    early_stopping: EarlyStopping = field(default_factory=EarlyStopping)

    def check(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("epochs, batch_size and eval_batch_size must be >= 1")
        if not self.learning_rate > 0:
            raise ValueError("learning_rate must be > 0")


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
    best_val_accuracy: float
    best_epoch: int
    epochs_run: int
    samples_per_second: float
    amp_effective: str
    resumed_from_epoch: int | None


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


def _fingerprint(params: TrainParams, task_params: dict[str, Any], data_sha: str) -> str:
    return params_sha256({"train": asdict(params), "task": task_params, "data": data_sha})


def _save_checkpoint(
    ckpt_dir: Path,
    model: paddle.nn.Layer,
    opt: paddle.optimizer.Optimizer,
    best_state: dict[str, Any],
    state: dict[str, Any],
) -> None:
    with atomic_path(ckpt_dir / "last") as tmp:
        tmp.mkdir()
        paddle.save(model.state_dict(), str(tmp / "model.pdparams"))
        paddle.save(opt.state_dict(), str(tmp / "opt.pdopt"))
        paddle.save(best_state, str(tmp / "best.pdparams"))
        write_json(tmp / "state.json", state)  # last: marks the checkpoint complete


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


def _evaluate(
    model: paddle.nn.Layer, inputs: list[np.ndarray], labels: np.ndarray, batch_size: int
) -> tuple[float, float]:
    model.eval()
    total_loss, correct = 0.0, 0
    with paddle.no_grad():
        for start in range(0, len(labels), batch_size):
            batch = [paddle.to_tensor(x[start : start + batch_size]) for x in inputs]
            y = paddle.to_tensor(labels[start : start + batch_size])
            logits = model(*batch).astype("float32")
            total_loss += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(axis=1) == y).astype("int64").sum())
    return total_loss / len(labels), correct / len(labels)


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
) -> TrainResult:
    """Train ``task``'s model on ``data_dir``; write the best weights to ``out_dir``."""
    data_dir, out_dir, ckpt_dir = Path(data_dir), Path(out_dir), Path(checkpoint_dir)
    metrics_file = Path(metrics_file) if metrics_file else out_dir / "metrics.json"
    plots_file = Path(plots_file) if plots_file else out_dir / "curves.csv"
    label_names = dataset.read_label_names(data_dir)
    num_classes = len(label_names)

    device = resolve_device(params.device)
    paddle.set_device(device)
    amp = resolve_amp(params.amp, params.amp_dtype, device)
    log_fn = log.warning if (params.amp != "off" and not amp.enabled) else log.info
    log_fn("AMP requested=%s effective=%s: %s", amp.requested, amp.level, amp.reason)

    x_train_raw, y_train = task.read_split(data_dir, "train")
    x_val_raw, y_val = task.read_split(data_dir, "val")
    x_train, x_val = task.preprocess(x_train_raw), task.preprocess(x_val_raw)
    n = len(y_train)

    data_sha = "".join(sha256_file(dataset.split_path(data_dir, s)) for s in ("train", "val"))
    fingerprint = _fingerprint(params, task_params or {}, data_sha)

    paddle.seed(params.seed)
    model = task.build_model(num_classes)
    scheduler = paddle.optimizer.lr.StepDecay(
        learning_rate=params.learning_rate, step_size=params.lr_step_size, gamma=params.lr_gamma
    )
    opt = paddle.optimizer.Adam(
        learning_rate=scheduler,
        parameters=model.parameters(),
        weight_decay=params.weight_decay or None,
    )
    scaler = None
    if amp.enabled:
        if amp.level == "O2":
            model, opt = paddle.amp.decorate(
                models=model, optimizers=opt, level="O2", dtype=amp.dtype
            )
        if amp.dtype == "float16":
            scaler = paddle.amp.GradScaler(init_loss_scaling=2.0**15)

    history: list[dict[str, float]] = []
    best = {"val_accuracy": -math.inf, "epoch": 0, "bad_epochs": 0}
    best_state = {k: v.clone() for k, v in model.state_dict().items()}
    start_epoch, train_seconds, samples_seen = 1, 0.0, 0
    resumed_from = None
    state = _load_checkpoint(ckpt_dir, fingerprint)
    if state is not None:
        model.set_state_dict(paddle.load(str(ckpt_dir / "last" / "model.pdparams")))
        opt.set_state_dict(paddle.load(str(ckpt_dir / "last" / "opt.pdopt")))
        best_state = paddle.load(str(ckpt_dir / "last" / "best.pdparams"))
        history, best = state["history"], state["best"]
        train_seconds, samples_seen = state["train_seconds"], state["samples_seen"]
        start_epoch = resumed_from = state["epoch"] + 1
        log.info("resuming from checkpoint after epoch %d", state["epoch"])

    stopped = state is not None and state.get("stopped", False)
    epochs = tqdm(
        range(start_epoch, params.epochs + 1),
        desc="train",
        unit="epoch",
        initial=start_epoch - 1,
        total=params.epochs,
    )
    for epoch in epochs:
        if stopped:
            break
        paddle.seed(params.seed * 1000 + epoch)
        rng = np.random.default_rng([params.seed, epoch])
        order = rng.permutation(n)
        model.train()
        t0 = time.perf_counter()
        loss_sum, correct = 0.0, 0
        for start in range(0, n, params.batch_size):
            idx = order[start : start + params.batch_size]
            batch = [paddle.to_tensor(x) for x in task.augment([x[idx] for x in x_train], rng)]
            y = paddle.to_tensor(y_train[idx])
            with paddle.amp.auto_cast(
                enable=amp.enabled,
                level=amp.level if amp.enabled else "O1",
                dtype=amp.dtype if amp.enabled else "float16",
            ):
                logits = model(*batch)
            loss = F.cross_entropy(logits.astype("float32"), y)  # loss always in fp32
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            opt.clear_grad()
            loss_sum += float(loss) * len(idx)
            correct += int((logits.argmax(axis=1) == y).astype("int64").sum())
        train_seconds += time.perf_counter() - t0
        samples_seen += n
        lr = scheduler.get_lr()
        scheduler.step()

        val_loss, val_acc = _evaluate(model, x_val, y_val, params.eval_batch_size)
        row = {
            "epoch": epoch,
            "train_loss": loss_sum / n,
            "train_accuracy": correct / n,
            "val_loss": val_loss,
            "val_accuracy": val_acc,
            "lr": lr,
        }
        history.append(row)
        if val_acc > best["val_accuracy"] + params.early_stopping.min_delta:
            best = {"val_accuracy": val_acc, "epoch": epoch, "bad_epochs": 0}
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            best["bad_epochs"] += 1
        stopped = best["bad_epochs"] >= params.early_stopping.patience
        epochs.set_postfix(loss=f"{row['train_loss']:.4f}", val_acc=f"{val_acc:.4f}")
        log.debug("epoch %d: %s", epoch, row)
        _save_checkpoint(
            ckpt_dir,
            model,
            opt,
            best_state,
            {
                "fingerprint": fingerprint,
                "epoch": epoch,
                "history": history,
                "best": best,
                "train_seconds": train_seconds,
                "samples_seen": samples_seen,
                "stopped": stopped,
            },
        )
        if stopped:
            log.info(
                "early stopping after epoch %d (best epoch %d, val_accuracy %.4f)",
                epoch,
                best["epoch"],
                best["val_accuracy"],
            )
    epochs.close()

    result = TrainResult(
        model_path=out_dir / "model.pdparams",
        best_val_accuracy=float(best["val_accuracy"]),
        best_epoch=int(best["epoch"]),
        epochs_run=len(history),
        samples_per_second=samples_seen / train_seconds if train_seconds else 0.0,
        amp_effective=amp.level,
        resumed_from_epoch=resumed_from,
    )
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        paddle.save(best_state, str(tmp / "model.pdparams"))
        write_json(
            tmp / "model_meta.json",
            {
                "task": task.name,
                "task_params": task_params or {},
                "num_classes": num_classes,
                "label_names": label_names,
                "best_epoch": result.best_epoch,
            },
        )
        write_json(tmp / "history.json", history)
        write_manifest(
            tmp,
            "train",
            inputs={s: dataset.split_path(data_dir, s) for s in ("train", "val")},
            outputs={"model.pdparams": tmp / "model.pdparams"},
            params=asdict(params),
            extra={"amp": asdict(amp), "device": device, "fingerprint": fingerprint},
        )
    write_json(
        metrics_file,
        {
            "best_val_accuracy": result.best_val_accuracy,
            "best_epoch": result.best_epoch,
            "epochs_run": result.epochs_run,
            "samples_per_second": round(result.samples_per_second, 2),
            "amp_effective": result.amp_effective,
            "amp_requested": params.amp,
        },
    )
    write_text(plots_file, _curves_csv(history))
    log.info(
        "best val_accuracy %.4f at epoch %d; %d epochs, %.0f samples/s, amp=%s",
        result.best_val_accuracy,
        result.best_epoch,
        result.epochs_run,
        result.samples_per_second,
        result.amp_effective,
    )
    return result


def _curves_csv(history: list[dict[str, float]]) -> str:
    buf = io.StringIO()
    cols = ["epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr"]
    writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    writer.writeheader()
    for row in history:
        writer.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()})
    return buf.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    parser = step_parser("components.train", __doc__)
    parser.add_argument("--data", default="outputs/ingest")
    parser.add_argument("--out", default="outputs/train")
    parser.add_argument("--checkpoints", default="checkpoints/train")
    parser.add_argument("--metrics", default="metrics/train.json")
    parser.add_argument("--plots", default="plots/train.csv")
    args = parser.parse_args(argv)

    def _go() -> None:
        output_dir(args.out)
        params, all_params = step_params(args.params, "train", TrainParams)
        task, task_params = task_from_params(all_params), all_params.get("task", {})
        run(
            params,
            task,
            args.data,
            args.out,
            checkpoint_dir=args.checkpoints,
            metrics_file=args.metrics,
            plots_file=args.plots,
            task_params=task_params,
        )

    return run_cli(_go)


if __name__ == "__main__":
    sys.exit(main())
