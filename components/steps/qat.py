"""qat: quantization-aware fine-tuning to a real int8 model, gated against its fp32 parent.

Route (measured on Paddle 3.3.1 / OpenVINO 2026.4, see docs/qat.md):

- ``paddle.quantization.ImperativeQuantAware`` inserts fake-quant ops: per-channel abs-max
  weights and moving-average abs-max activations. The newer ``paddle.quantization.QAT`` API
  is not used: in 3.3 its ``convert`` fails (``zero_points()`` returns None), its PIR export
  with a dynamic batch fails, and its export keeps weights float32 on disk.
- Fine-tuning distils from the fp32 parent (KL on temperature-softened logits, weight
  ``distill_weight``) besides the label loss, so the int8 model keeps the parent's decisions
  instead of merely its accuracy; training-time augmentation comes from the task.
- ``save_quantized_model(..., onnx_format=True)`` writes a legacy Paddle program with
  ``quantize_linear``/``dequantize_linear`` ops and int8 weights (``paddle/``), which Paddle
  Inference runs, and from which OpenVINO's Paddle frontend builds FakeQuantize ops that its
  CPU plugin executes in int8 (``openvino/model.xml|bin``, int8 weights).

A task whose model cannot be quantized says why (``Task.int8_blocker``); then, and when the
gate fails, the stage stops unless ``qat.allow_fp32_only`` is true, in which case it records the
reasons in ``gate.json`` (``fp32_only``) and the metrics, and ``package`` ships fp32 only.

Every split is read as a stream (no split is held whole): fine-tuning reads the training
split as the train step does (``components.tasks.stream``: pieces in an order drawn from
``(seed, epoch)``, a shuffle buffer of ``qat.shuffle_buffer`` samples), in this process;
``qat.max_steps_per_epoch`` bounds an epoch on a large data set. The activation scales are
calibrated during these steps (moving averages), so the calibration reads exactly the batches
the fine-tuning reads. The comparisons run every model on each split batch by batch and keep
only the per-sample outcomes.

The gate compares int8 with its fp32 parent sample by sample on the validation split
(``qat.split``), in both OpenVINO and Paddle Inference: a paired test (counts of samples that
got worse/better, one-sided exact McNemar) together with the accuracy and per-class recall
limits, see :mod:`components.ml.decisions.gates`. The reported numbers (``accuracy``,
``accuracy_drop``...) are measured on ``qat.report_split`` (test), which no decision looks
at. Outputs and ``metrics/qat.json`` are written either way; a failed gate then stops the stage with
one line per broken rule, naming the counts, the p-value and the setting that decided.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from components.core.artifacts import StepError, atomic_path, read_json, write_json, write_manifest
from components.core.config import params_model
from components.kernel.step import DATA, In, Out, Step
from components.ml.data import dataset
from components.ml.decisions import gates
from components.ml.training import quantization
from components.ml.training.quantization import GateDecision
from components.tasks import Task, quantize

log = logging.getLogger(__name__)


@params_model
class QatLatency:
    batch_sizes: list[int] = field(default_factory=lambda: [1, 64])
    warmup: int = 5
    repeats: int = 30
    threads: int = 1


@params_model
class QatParams:
    epochs: Annotated[int, Field(ge=0)] = 3
    learning_rate: float = 5e-5
    batch_size: Annotated[int, Field(ge=1)] = 32
    seed: int = 42
    # 0 = labels only, 1 = parent's soft labels only
    distill_weight: Annotated[float, Field(ge=0, le=1)] = 0.9
    distill_temperature: float = 2.0
    weight_quantize: Literal["channel_wise_abs_max", "abs_max"] = "channel_wise_abs_max"
    activation_quantize: Literal["moving_average_abs_max", "abs_max"] = "moving_average_abs_max"
    moving_rate: float = 0.9
    weight_bits: Literal[7, 8] = 7  # 7 avoids int16 overflow in int8 kernels of CPUs without VNNI
    split: str = "val"  # where the gate decides (test stays unseen by decisions)
    report_split: str = "test"  # where the reported int8 vs fp32 numbers are measured
    max_accuracy_drop: gates.Points = 0.5  # points (percent) of accuracy
    max_class_drop: gates.Points = 2.0  # points of recall, any class
    alpha: gates.Alpha = 0.1  # one-sided exact McNemar level ("significantly worse")
    min_class_flips: gates.Flips = 3  # a class limit counts only with this many samples lost net
    latency: QatLatency = field(default_factory=QatLatency)
    # training samples the shuffled stream draws batches from
    shuffle_buffer: Annotated[int, Field(ge=1)] = 2048
    # 0: a whole pass over the training split per epoch
    max_steps_per_epoch: Annotated[int, Field(ge=0)] = 0
    # When no int8 model can be had (the task's model cannot be quantized, or the gate
    # fails): false stops the pipeline here; true records why and the bundle is fp32 only.
    allow_fp32_only: bool = False

    def limits(self) -> gates.PairedLimits:
        return gates.PairedLimits(
            alpha=self.alpha,
            max_drop=self.max_accuracy_drop,
            max_class_drop=self.max_class_drop,
            min_class_flips=self.min_class_flips,
        )


@dataclass(frozen=True)
class QatResult:
    out_dir: Path
    metrics: dict[str, Any]
    gate: GateDecision


def run(
    params: QatParams,
    task: Task,
    train_dir: str | Path,
    export_dir: str | Path,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    metrics_file: str | Path | None = None,
) -> QatResult:
    """Fine-tune the trained model with fake quantization, gate it against the exported fp32
    program (sample by sample, docs/gates.md) and write the int8 bundle."""
    train_dir, export_dir = Path(train_dir), Path(export_dir)
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    metrics_file = Path(metrics_file) if metrics_file else out_dir / "metrics.json"
    blocker = task.int8_blocker()
    if blocker:
        return fp32_only(params, task, train_dir, out_dir, metrics_file, [blocker])
    student = quantize.quantized_student(task, train_dir, data_dir, params)

    with atomic_path(out_dir) as tmp, tempfile.TemporaryDirectory() as ref:
        tmp.mkdir(parents=True)
        quantization.write_bundle(tmp, student.save)
        quantization.fp32_bundle(export_dir, Path(ref))  # the exported parent, to compare
        result = quantize.compare(tmp, Path(ref), task, data_dir, params)
        decision = quantization.gate(result["comparisons"], params)
        metrics = quantization.summarize(result, decision)
        write_json(tmp / "gate.json", {**asdict(decision), **result, "history": student.history})
        write_manifest(
            tmp,
            "qat",
            inputs={
                "model.pdparams": train_dir / "model.pdparams",
                "fp32/model.pdmodel": export_dir / "legacy" / "model.pdmodel",
                **{
                    k: v
                    for split in ("train", params.split, params.report_split)
                    for k, v in dataset.split_inputs(data_dir, split).items()
                },
            },
            outputs={
                p.relative_to(tmp).as_posix(): p
                for p in sorted(tmp.rglob("*"))
                if p.is_file() and p.name != "gate.json"
            },
            params=asdict(params),
            extra={"gate_passed": decision.passed},
        )
    write_json(metrics_file, metrics)
    quantization.log_metrics(metrics, decision)
    if not decision.passed:
        metrics = _gate_failed(params, decision, out_dir, metrics_file, metrics)
    return QatResult(out_dir=out_dir, metrics=metrics, gate=decision)


def _gate_failed(
    params: QatParams,
    decision: GateDecision,
    out_dir: Path,
    metrics_file: Path,
    metrics: dict[str, Any],
) -> dict[str, Any]:
    """Stop on the failed gate, one line per broken rule; or (``qat.allow_fp32_only``) mark
    ``gate.json`` and the metrics ``fp32_only`` and go on."""
    message = (
        "QAT gate failed: the int8 model is worse than its fp32 parent on the "
        f"{params.split} split (details in {out_dir / 'gate.json'}):\n"
        + "\n".join(f"  - {r}" for r in decision.reasons)
    )
    if not params.allow_fp32_only:
        raise StepError(message + "\n(qat.allow_fp32_only: true ships the fp32 model only)")
    log.warning("%s\nqat.allow_fp32_only: the bundle will be fp32 only", message)
    gate_file = out_dir / "gate.json"
    with atomic_path(gate_file) as tmp_gate:
        gate_doc = read_json(gate_file)
        write_json(tmp_gate, {**gate_doc, "fp32_only": True})
    metrics = {**metrics, "fp32_only": True}
    write_json(metrics_file, metrics)
    return metrics


def fp32_only(
    params: QatParams,
    task: Task,
    train_dir: Path,
    out_dir: Path,
    metrics_file: Path,
    reasons: list[str],
) -> QatResult:
    """No int8 model for this task: stop with the reasons, or (``qat.allow_fp32_only``)
    record them in ``gate.json`` and the metrics so that package ships fp32 only."""
    what = f"task '{task.name}' has no int8 model: " + "; ".join(reasons)
    if not params.allow_fp32_only:
        raise StepError(what + " (qat.allow_fp32_only: true ships the fp32 model only)")
    log.warning("%s; qat.allow_fp32_only: the bundle will be fp32 only", what)
    decision = GateDecision(passed=False, reasons=list(reasons))
    metrics = {"gate_passed": False, "fp32_only": True, "int8_available": False}
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        write_json(tmp / "gate.json", {**asdict(decision), "fp32_only": True})
        write_manifest(
            tmp,
            "qat",
            inputs={"model.pdparams": train_dir / "model.pdparams"},
            outputs={},
            params=asdict(params),
            extra={"gate_passed": False, "fp32_only": True, "reasons": list(reasons)},
        )
    write_json(metrics_file, metrics)
    return QatResult(out_dir=out_dir, metrics=metrics, gate=decision)


STEP = Step(
    name="qat",
    doc=__doc__,
    params=QatParams,
    sections=("task", "qat"),
    run=run,
    inputs=(
        In("model", "outputs/train", "train_dir", source="train.model", help="trained weights"),
        In(
            "exported",
            "outputs/export",
            "export_dir",
            source="export.exported",
            help="the fp32 export: the parent the int8 model is gated against",
        ),
        DATA,
    ),
    outputs=(
        Out("int8", "outputs/qat", "out_dir", kfp="Model", help="gated int8 bundle"),
        Out("metrics", "metrics/qat.json", "metrics_file", kfp="Metrics", dvc="metrics"),
    ),
)
