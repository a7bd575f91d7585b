"""OpenVINO runtime: the CPU serving runtime (the C++ server links the same library).

Reads a legacy Paddle program (``.pdmodel``, OpenVINO's Paddle frontend) or an OpenVINO IR
(``.xml`` + ``.bin``). Inference precision is pinned to f32: on CPUs with AMX/avx512_bf16
OpenVINO otherwise runs float32 models in bf16 and results drift from Paddle's by ~1e-3.
Quantized models still run their quantized ops in int8 under that hint.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import StepError, atomic_path
from components.ml.serving.runtime import BatchedPredictor

log = logging.getLogger(__name__)


def _core() -> Any:
    import openvino as ov

    return ov.Core()


def read_model(path: str | Path) -> Any:
    """An ``ov.Model`` with a dynamic batch dimension on every input."""
    import openvino as ov

    path = Path(path)
    if not path.exists():
        raise StepError(f"{path}: model file not found")
    try:
        model = _core().read_model(str(path))
    except RuntimeError as exc:
        raise StepError(f"{path}: OpenVINO cannot read it ({str(exc).splitlines()[0]})") from exc
    shapes = {}
    for port in model.inputs:
        shape = port.get_partial_shape()
        shape[0] = ov.Dimension.dynamic()
        shapes[port.get_any_name()] = shape
    model.reshape(shapes)
    return model


def save_ir(model: Any, xml_path: str | Path) -> tuple[Path, Path]:
    """Write ``model`` as OpenVINO IR (weights kept in their stored precision, no fp16)."""
    import openvino as ov

    xml_path = Path(xml_path)
    with atomic_path(xml_path.parent) as tmp:
        tmp.mkdir(parents=True)
        ov.save_model(model, str(tmp / xml_path.name), compress_to_fp16=False)
    return xml_path, xml_path.with_suffix(".bin")


class OVPredictor(BatchedPredictor):
    """A compiled OpenVINO model on CPU with a fixed thread count.

    ``cpu_pinning``: OpenVINO's ENABLE_CPU_PINNING (None: OpenVINO's default, which pins
    the calling thread on every inference, two sched_setaffinity calls per call); the C++
    server turns it off unless ``--cpu-pinning``, and the benchmarks mirror that.
    """

    def __init__(self, model_or_path: Any, *, threads: int = 1, cpu_pinning: bool | None = None):
        model = (
            read_model(model_or_path) if isinstance(model_or_path, str | Path) else model_or_path
        )
        config: dict[str, Any] = {
            "INFERENCE_NUM_THREADS": threads,
            "INFERENCE_PRECISION_HINT": "f32",
        }
        if cpu_pinning is not None:
            config["ENABLE_CPU_PINNING"] = cpu_pinning
        self._compiled = _core().compile_model(model, "CPU", config)
        self._request = self._compiled.create_infer_request()
        self.input_names = [p.get_any_name() for p in self._compiled.inputs]
        self.output_names = [p.get_any_name() for p in self._compiled.outputs]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        result = self._request.infer([np.ascontiguousarray(x) for x in inputs])
        return [np.asarray(result[out]) for out in self._compiled.outputs]

    def precision_counts(self) -> dict[str, dict[str, int]]:
        """How many layers of each kind execute in each precision, from the compiled (runtime)
        model: {"Convolution": {"i8": 52, "f32": 1}, "Eltwise": {"f32": 16}, ...}."""
        out: dict[str, dict[str, int]] = {}
        for op in self._compiled.get_runtime_model().get_ops():
            info = op.get_rt_info()
            kind = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
            prec = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else "?"
            counts = out.setdefault(kind, {})
            counts[prec] = counts.get(prec, 0) + 1
        return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}

    def precision_by_layer_type(self) -> dict[str, list[str]]:
        """What precision each kind of layer really executes in (e.g. Convolution: i8)."""
        out: dict[str, set[str]] = {}
        for op in self._compiled.get_runtime_model().get_ops():
            info = op.get_rt_info()
            kind = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
            prec = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else "?"
            out.setdefault(kind, set()).add(prec)
        return {k: sorted(v) for k, v in sorted(out.items())}
