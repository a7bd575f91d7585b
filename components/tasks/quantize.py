"""Quantization-aware fine-tuning and the int8-vs-fp32 comparison on a task's data (the qat
step, ``components/steps/qat.py``).

:func:`finetune` distils the fake-quantized student from its fp32 parent on the training split,
streamed as the train step streams it; :func:`compare` runs both bundles in OpenVINO and Paddle
Inference on each split batch by batch, keeping only the per-sample outcomes, and times and
sizes them; :func:`check_bundle` re-runs the gate on existing bundles. The quantizer, the
bundles and the gate are :mod:`components.ml.training.quantization`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from tqdm import tqdm

from components.core.artifacts import StepError
from components.faults import failpoints
from components.ml.data import dataset, snapshot
from components.ml.decisions import gates
from components.ml.serving.ov_runtime import OVPredictor
from components.ml.serving.runtime import ModelFiles, PaddlePredictor
from components.ml.training.quantization import (
    FAILPOINT_SCALE,
    GateDecision,
    QatParamsLike,
    bundle_sizes,
    freeze_batch_norm,
    gate,
    outcomes,
    quantizer,
    shrink_activation_scales,
    summarize,
)
from components.tasks.base import Task
from components.tasks.data import check_format
from components.tasks.stream import SnapshotData, StreamSettings
from components.tasks.trained import load_trained

log = logging.getLogger(__name__)


def finetune(
    student: paddle.nn.Layer,
    teacher: paddle.nn.Layer,
    task: Task,
    data_dir: Path,
    params: QatParamsLike,
) -> list[dict[str, float]]:
    """Fine-tune the fake-quantized ``student`` with the task's loss on its targets +
    distillation from ``teacher`` (``Objective.loss``/``distillation``), on shuffled batches
    streamed from the training split's shards."""
    check_format(data_dir, task.data, task.name)
    train = SnapshotData(
        snapshot.load(data_dir),
        task,
        StreamSettings(shuffle_buffer=params.shuffle_buffer, workers=0),
    )
    opt = paddle.optimizer.Adam(learning_rate=params.learning_rate, parameters=student.parameters())
    objective = task.objective()
    label_names = dataset.read_label_names(data_dir)
    teacher.eval()
    history = []
    for epoch in tqdm(range(1, params.epochs + 1), desc="qat", unit="epoch"):
        paddle.seed(params.seed * 1000 + epoch)
        rng = np.random.default_rng([params.seed, epoch, 1])
        student.train()
        freeze_batch_norm(student)
        total, samples, steps = 0.0, 0, 0
        # pieces in an order drawn from (seed, epoch), through the shuffle buffer, read here
        for piece in train.batches(params.batch_size, (params.seed, epoch)):
            y = piece.labels
            batch = [paddle.to_tensor(x) for x in task.augment(piece.inputs, rng)]
            logits = student(*batch)
            with paddle.no_grad():
                parent = teacher(*batch)
            distill = objective.distillation(logits, parent, params.distill_temperature)
            hard = objective.loss(logits, paddle.to_tensor(y))
            loss = (1.0 - params.distill_weight) * hard + params.distill_weight * distill
            loss.backward()
            opt.step()
            opt.clear_grad()
            total += float(loss) * len(y)
            samples += len(y)
            steps += 1
            if params.max_steps_per_epoch and steps >= params.max_steps_per_epoch:
                break
        student.eval()
        scorer = task.scorer(data_dir, "val", label_names)
        with paddle.no_grad():
            for inputs, y_val in task.eval_batches(data_dir, "val"):
                scorer.add(student(*[paddle.to_tensor(x) for x in inputs]).numpy(), y_val)
        history.append(
            {
                "epoch": epoch,
                "loss": total / max(samples, 1),
                "val_accuracy": scorer.result().metrics["accuracy"],  # the task's outcome
                "samples": samples,
            }
        )
        log.info("qat epoch %d: %s", epoch, history[-1])
    student.eval()
    return history


KINDS = ("fp32", "int8")


def compare(
    int8_dir: Path,
    fp32_dir: Path,
    task: Task,
    data_dir: Path,
    params: QatParamsLike,
) -> dict[str, Any]:
    """Score, size and time an int8 bundle against its fp32 parent bundle.

    Each bundle holds ``paddle/model.pdmodel|pdiparams`` and ``openvino/model.xml|bin``.
    """
    names = dataset.read_label_names(data_dir)
    threads = params.latency.threads
    ov = {
        k: OVPredictor(d / "openvino" / "model.xml", threads=threads)
        for k, d in (("fp32", fp32_dir), ("int8", int8_dir))
    }
    pi = {
        k: PaddlePredictor(ModelFiles.in_dir(d / "paddle"), threads=threads)
        for k, d in (("fp32", fp32_dir), ("int8", int8_dir))
    }
    runtimes = (("openvino", ov), ("paddle_inference", pi))
    by_split: dict[str, dict[str, Any]] = {}
    for split in dict.fromkeys((params.split, params.report_split)):
        # each model on each batch as it streams by, judged by the task's scorer (which keeps
        # only per-sample outcomes: a classifier's predicted class, a segmenter's stroke class)
        scorers = {(r, k): task.scorer(data_dir, split, names) for r, _ in runtimes for k in KINDS}
        seen = 0
        for inputs, lbl in tqdm(
            task.eval_batches(data_dir, split), desc=f"compare {split}", leave=False
        ):
            seen += len(lbl)
            for runtime, predictors in runtimes:
                for k in KINDS:
                    scorers[runtime, k].add(predictors[k].predict(inputs), lbl)
        if not seen:
            raise StepError(f"{data_dir}: split {split} holds no samples (run ingest)")
        by_split[split] = {}
        for runtime, _ in runtimes:
            fp32, int8 = (scorers[runtime, k].result() for k in KINDS)
            paired = gates.compare(fp32.y_true, fp32.y_pred, int8.y_pred, names)
            by_split[split][runtime] = {**outcomes(paired), "paired": paired}
    comparisons = by_split[params.split]

    latency = _latency(ov, task, data_dir, params)
    sizes = bundle_sizes(fp32_dir, int8_dir)
    return {
        "split": params.split,
        "comparisons": comparisons,
        "report_split": params.report_split,
        "report": by_split[params.report_split],
        "latency": latency,
        "sizes": sizes,
        "int8_layer_precisions": ov["int8"].precision_by_layer_type(),
        "threads": threads,
        "samples": seen,  # of the report split
    }


def check_bundle(
    int8_dir: str | Path,
    fp32_dir: str | Path,
    task: Task,
    data_dir: str | Path,
    params: QatParamsLike,
) -> tuple[GateDecision, dict[str, Any]]:
    """Re-run the gate on existing bundles (used to audit an int8 artifact)."""
    result = compare(Path(int8_dir), Path(fp32_dir), task, Path(data_dir), params)
    decision = gate(result["comparisons"], params)
    return decision, summarize(result, decision)


def _latency(
    ov: dict[str, OVPredictor], task: Task, data_dir: Path, params: QatParamsLike
) -> dict[str, float]:
    """Each OpenVINO model's latency (ms) at each of ``qat.latency.batch_sizes``."""
    latency: dict[str, float] = {}
    # timed on the report split's first samples (only as many as the largest batch are read)
    largest = max(params.latency.batch_sizes, default=1)
    timed, _ = task.eval_head(data_dir, params.report_split, largest)
    for bs in params.latency.batch_sizes:
        idx = np.arange(bs) % len(timed[0])
        batch = [x[idx] for x in timed]
        for k, p in ov.items():
            latency[f"{k}_ms_b{bs}"] = p.latency_ms(
                batch, warmup=params.latency.warmup, repeats=params.latency.repeats
            )
    return latency


@dataclass(frozen=True)
class Student:
    """The fine-tuned fake-quantized model, its quantizer, input spec and epochs."""

    model: paddle.nn.Layer
    quantizer: Any
    spec: Any
    history: list[dict[str, float]]

    def save(self, prefix: Path) -> None:
        """The int8 program at ``prefix`` (``.pdmodel``/``.pdiparams``)."""
        self.quantizer.save_quantized_model(self.model, str(prefix), input_spec=self.spec)


def quantized_student(
    task: Task, train_dir: Path, data_dir: Path, params: QatParamsLike
) -> Student:
    """The trained model with fake quantization, fine-tuned against itself in fp32 as the
    teacher (:func:`finetune`); the failpoint ``qat.after_finetune`` corrupts its scales."""
    spec = task.paddle_input_specs()
    teacher, _ = load_trained(task, train_dir)
    student, _ = load_trained(task, train_dir)
    quant = quantizer(params)
    student.train()
    quant.quantize(student)  # must see the model in train mode
    history = finetune(student, teacher, task, data_dir, params)
    if failpoints.corrupts("qat.after_finetune", task.name):
        shrunk = shrink_activation_scales(student, FAILPOINT_SCALE)
        log.warning("failpoint: %d activation scales shrunk to %g", shrunk, FAILPOINT_SCALE)
    return Student(student, quant, spec, history)
