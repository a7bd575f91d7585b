"""The task-independent parts of quantization-aware training (the qat step,
``components/steps/qat.py``): the quantizer, the int8 and fp32 bundles, the paired gate of int8
against its fp32 parent (:mod:`components.ml.decisions.gates`) and the flat ``metrics/qat.json``.

The fine-tuning and the comparison on a task's data are :mod:`components.tasks.quantize`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paddle

from components.core.artifacts import StepError
from components.ml.decisions import gates
from components.ml.serving.ov_runtime import read_model, save_ir
from components.ml.serving.runtime import ModelFiles

log = logging.getLogger(__name__)
# the qat step's params (components.steps.qat.QatParams): the quantizer's settings, the
# splits, the gate's limits (.limits()) and the latency settings
QatParamsLike = Any


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    reasons: list[str]
    rules: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per runtime


def quantizer(params: QatParamsLike) -> Any:
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


def shrink_activation_scales(model: paddle.nn.Layer, factor: float) -> int:
    """Multiply the fake-quant activation scales (calibrated by the fine-tuning) by
    ``factor``; returns how many there were."""
    count = 0
    for name, param in model.named_parameters():
        if name.endswith("_fake_quant_input._scale"):
            param.set_value(param * factor)
            count += 1
    return count


def freeze_batch_norm(model: paddle.nn.Layer) -> None:
    """Keep BatchNorm on its trained running statistics while fake-quant fine-tunes.

    Small QAT batches would otherwise overwrite the statistics the fp32 parent learned on
    the full training run, and the int8 model would drift from its parent.
    """
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.layer.norm._BatchNormBase):
            layer.eval()


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


def gate(comparisons: dict[str, dict[str, Any]], params: QatParamsLike) -> GateDecision:
    """Paired int8-vs-fp32 decision for each runtime (see :mod:`components.ml.decisions.gates`)."""
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


def bundle_sizes(fp32_dir: Path, int8_dir: Path) -> dict[str, int]:
    """The bytes of each bundle's programs and weights, per format."""

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
    return sizes


def log_metrics(metrics: dict[str, Any], decision: GateDecision) -> None:
    """The qat step's one-line summary."""
    log.info(
        "int8 accuracy %.4f (fp32 %.4f), size ratio %.3f, latency ratio %s, gate %s",
        metrics["accuracy"],
        metrics["fp32_accuracy"],
        metrics["size_ratio"],
        {k: v for k, v in metrics.items() if k.startswith("latency_ratio")},
        "passed" if decision.passed else "FAILED",
    )
