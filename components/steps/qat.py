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
limits, see :mod:`components.ml.gates`. The reported numbers (``accuracy``, ``accuracy_drop``...)
are measured on ``qat.report_split`` (test), which no decision looks at. Outputs and
``metrics/qat.json`` are written either way; a failed gate then stops the stage with one line
per broken rule, naming the counts, the p-value and the setting that decided.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import paddle
from pydantic import Field
from tqdm import tqdm

from components.core.artifacts import StepError, atomic_path, read_json, write_json, write_manifest
from components.core.config import params_model
from components.faults import failpoints
from components.kernel.step import DATA, In, Out, Step
from components.ml import dataset, gates, snapshot
from components.ml.modelio import load_trained
from components.ml.ov_runtime import OVPredictor, read_model, save_ir
from components.ml.runtime import ModelFiles, PaddlePredictor
from components.tasks import Task
from components.tasks.data import check_format
from components.tasks.stream import SnapshotData, StreamSettings

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
class GateDecision:
    passed: bool
    reasons: list[str]
    rules: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per runtime


@dataclass(frozen=True)
class QatResult:
    out_dir: Path
    metrics: dict[str, Any]
    gate: GateDecision


# --------------------------------------------------------------------------- fine-tuning


def quantizer(params: QatParams) -> Any:
    from paddle.quantization import ImperativeQuantAware

    return ImperativeQuantAware(
        weight_quantize_type=params.weight_quantize,
        activation_quantize_type=params.activation_quantize,
        moving_rate=params.moving_rate,
        weight_bits=params.weight_bits,
        onnx_format=True,  # quantize_linear/dequantize_linear + int8 weights on save
    )


# the failpoint qat.after_finetune (action corrupt) multiplies every activation quantization
# scale of the fine-tuned student by this: its activations saturate at 2 % of their range
FAILPOINT_SCALE = 0.02


def _shrink_activation_scales(model: paddle.nn.Layer, factor: float) -> int:
    """Multiply the fake-quant activation scales (calibrated by the fine-tuning) by
    ``factor``; returns how many there were."""
    count = 0
    for name, param in model.named_parameters():
        if name.endswith("_fake_quant_input._scale"):
            param.set_value(param * factor)
            count += 1
    return count


def _freeze_batch_norm(model: paddle.nn.Layer) -> None:
    """Keep BatchNorm on its trained running statistics while fake-quant fine-tunes.

    Small QAT batches would otherwise overwrite the statistics the fp32 parent learned on
    the full training run, and the int8 model would drift from its parent.
    """
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.layer.norm._BatchNormBase):
            layer.eval()


def finetune(
    student: paddle.nn.Layer,
    teacher: paddle.nn.Layer,
    task: Task,
    data_dir: Path,
    params: QatParams,
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
        _freeze_batch_norm(student)
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


# --------------------------------------------------------------------------- comparison


def model_bytes(files: Sequence[Path]) -> int:
    return int(sum(Path(f).stat().st_size for f in files))


def outcomes(paired: dict[str, Any]) -> dict[str, Any]:
    """Both models' accuracy and per-class recall, and int8's drops (points), read off the
    paired counts of :func:`gates.compare` (which already hold them)."""
    o, per_class = paired["overall"], paired["per_class"]
    worst = max(per_class, key=lambda n: per_class[n]["drop_points"])
    return {
        "fp32": {
            "accuracy": o["reference"],
            "recall": {n: c["reference"] for n, c in per_class.items()},
        },
        "int8": {
            "accuracy": o["candidate"],
            "recall": {n: c["candidate"] for n, c in per_class.items()},
        },
        "drops": {
            "accuracy_drop": o["drop_points"],
            "worst_class": worst,
            "worst_class_drop": per_class[worst]["drop_points"],
        },
    }


def gate(comparisons: dict[str, dict[str, Any]], params: QatParams) -> GateDecision:
    """Paired int8-vs-fp32 decision for each runtime (see :mod:`components.ml.gates`)."""
    reasons: list[str] = []
    rules: dict[str, list[dict[str, Any]]] = {}
    for runtime, c in comparisons.items():
        verdict = gates.decide(
            c["paired"],
            params.limits(),
            what=f"{runtime}: int8 on {params.split}",
            reference="its fp32 parent",
            params_prefix="qat",
            drop_param="max_accuracy_drop",
            class_drop_param="max_class_drop",
        )
        reasons += verdict.failures
        rules[runtime] = verdict.rules
    return GateDecision(passed=not reasons, reasons=reasons, rules=rules)


KINDS = ("fp32", "int8")


def compare(
    int8_dir: Path,
    fp32_dir: Path,
    task: Task,
    data_dir: Path,
    params: QatParams,
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

    def files(d: Path, fmt: str) -> list[Path]:
        pattern = (
            ("model.pdmodel", "model.pdiparams") if fmt == "paddle" else ("model.xml", "model.bin")
        )
        return [d / fmt / name for name in pattern]

    sizes = {
        f"{k}_{fmt}_bytes": model_bytes(files(d, fmt))
        for k, d in (("fp32", fp32_dir), ("int8", int8_dir))
        for fmt in ("paddle", "openvino")
    }
    sizes["fp32_paddle_weights_bytes"] = model_bytes([fp32_dir / "paddle" / "model.pdiparams"])
    sizes["int8_paddle_weights_bytes"] = model_bytes([int8_dir / "paddle" / "model.pdiparams"])
    sizes["fp32_openvino_weights_bytes"] = model_bytes([fp32_dir / "openvino" / "model.bin"])
    sizes["int8_openvino_weights_bytes"] = model_bytes([int8_dir / "openvino" / "model.bin"])
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


def summarize(result: dict[str, Any], decision: GateDecision) -> dict[str, Any]:
    """The flat ``metrics/qat.json`` contract.

    ``accuracy*``/``worst_class_drop`` are measured on the report split (test); ``gate_*`` on
    the split the gate decided on (val), from the OpenVINO comparison (the served runtime).
    """
    ov = result["report"]["openvino"]
    pi = result["report"]["paddle_inference"]
    g = result["comparisons"]["openvino"]["paired"]["overall"]
    s, lat = result["sizes"], result["latency"]
    metrics = {
        "accuracy": ov["int8"]["accuracy"],
        "fp32_accuracy": ov["fp32"]["accuracy"],
        "accuracy_drop": round(ov["drops"]["accuracy_drop"], 4),
        "worst_class_drop": round(ov["drops"]["worst_class_drop"], 4),
        "paddle_inference_accuracy": pi["int8"]["accuracy"],
        "paddle_inference_accuracy_drop": round(pi["drops"]["accuracy_drop"], 4),
        "size_ratio": round(s["int8_paddle_bytes"] / s["fp32_paddle_bytes"], 4),
        "size_ratio_paddle_weights": round(
            s["int8_paddle_weights_bytes"] / s["fp32_paddle_weights_bytes"], 4
        ),
        "size_ratio_openvino": round(s["int8_openvino_bytes"] / s["fp32_openvino_bytes"], 4),
        "size_ratio_openvino_weights": round(
            s["int8_openvino_weights_bytes"] / s["fp32_openvino_weights_bytes"], 4
        ),
        "latency_threads": result["threads"],
        "gate_passed": decision.passed,
        "gate_accuracy_drop": round(g["drop_points"], 4),
        "gate_worse": g["worse"],
        "gate_better": g["better"],
        "gate_p_value": round(g["p_value"], 6),
        "gate_samples": g["samples"],
    }
    for key in sorted(lat):
        if key.startswith("int8_ms_b"):
            bs = key.removeprefix("int8_ms_b")
            metrics[f"latency_ratio_b{bs}"] = round(lat[key] / lat[f"fp32_ms_b{bs}"], 4)
            metrics[f"int8_latency_ms_b{bs}"] = round(lat[key], 4)
            metrics[f"fp32_latency_ms_b{bs}"] = round(lat[f"fp32_ms_b{bs}"], 4)
    return metrics


# --------------------------------------------------------------------------- step


def write_bundle(directory: Path, paddle_writer: Any) -> None:
    """``paddle/model.pdmodel|pdiparams`` via ``paddle_writer(prefix)``, then its OpenVINO IR."""
    paddle_writer(directory / "paddle" / "model")
    save_ir(
        read_model(directory / "paddle" / "model.pdmodel"), directory / "openvino" / "model.xml"
    )


def fp32_bundle(export_dir: Path, dest: Path) -> None:
    """The exported fp32 program (export's ``legacy/``) as the bundle the int8 model is
    compared with: the parent is exported once, by ``export``, and only converted here."""
    legacy = ModelFiles.in_dir(export_dir / "legacy")
    for name in (legacy.program, legacy.params):
        if not name.exists():
            raise StepError(f"{name}: missing; --exported must be the output of export")
    (dest / "paddle").mkdir(parents=True)
    shutil.copy2(legacy.program, dest / "paddle" / "model.pdmodel")
    shutil.copy2(legacy.params, dest / "paddle" / "model.pdiparams")
    save_ir(read_model(dest / "paddle" / "model.pdmodel"), dest / "openvino" / "model.xml")


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
    spec = task.paddle_input_specs()
    teacher, _ = load_trained(task, train_dir)
    student, _ = load_trained(task, train_dir)
    quant = quantizer(params)
    student.train()
    quant.quantize(student)  # must see the model in train mode
    history = finetune(student, teacher, task, data_dir, params)
    if failpoints.corrupts("qat.after_finetune", task.name):
        shrunk = _shrink_activation_scales(student, FAILPOINT_SCALE)
        log.warning("failpoint: %d activation scales shrunk to %g", shrunk, FAILPOINT_SCALE)

    with atomic_path(out_dir) as tmp, tempfile.TemporaryDirectory() as ref:
        tmp.mkdir(parents=True)
        write_bundle(tmp, lambda p: quant.save_quantized_model(student, str(p), input_spec=spec))
        fp32_bundle(export_dir, Path(ref))  # the exported parent, to compare against
        result = compare(tmp, Path(ref), task, data_dir, params)
        decision = gate(result["comparisons"], params)
        metrics = summarize(result, decision)
        write_json(tmp / "gate.json", {**asdict(decision), **result, "history": history})
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
    log.info(
        "int8 accuracy %.4f (fp32 %.4f), size ratio %.3f, latency ratio %s, gate %s",
        metrics["accuracy"],
        metrics["fp32_accuracy"],
        metrics["size_ratio"],
        {k: v for k, v in metrics.items() if k.startswith("latency_ratio")},
        "passed" if decision.passed else "FAILED",
    )
    if not decision.passed:
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
    return QatResult(out_dir=out_dir, metrics=metrics, gate=decision)


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


def check_bundle(
    int8_dir: str | Path,
    fp32_dir: str | Path,
    task: Task,
    data_dir: str | Path,
    params: QatParams,
) -> tuple[GateDecision, dict[str, Any]]:
    """Re-run the gate on existing bundles (used to audit an int8 artifact)."""
    result = compare(Path(int8_dir), Path(fp32_dir), task, Path(data_dir), params)
    decision = gate(result["comparisons"], params)
    return decision, summarize(result, decision)


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
