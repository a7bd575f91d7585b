"""Paddle Inference runtime used by export (parity), evaluate and later the blessing step."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from components.core.artifacts import StepError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFiles:
    """A serialised program + its parameters (PIR ``.json`` or legacy ``.pdmodel``)."""

    program: Path
    params: Path

    @classmethod
    def in_dir(cls, directory: str | Path, stem: str = "model") -> ModelFiles:
        directory = Path(directory)
        for suffix in (".json", ".pdmodel"):
            program = directory / f"{stem}{suffix}"
            if program.exists():
                return cls(program, directory / f"{stem}.pdiparams")
        raise StepError(f"{directory}: no {stem}.json or {stem}.pdmodel exported model")


class BatchedPredictor:
    """What every runtime wrapper offers on top of its ``run`` (one call, one batch)."""

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def predict(self, inputs: Sequence[np.ndarray], batch_size: int = 256) -> np.ndarray:
        """First output for all samples, run in batches."""
        n = inputs[0].shape[0]
        outs = [
            # copy: a runtime may hand out views of buffers its next call overwrites
            self.run([x[s : s + batch_size] for x in inputs])[0].copy()
            for s in range(0, n, batch_size)
        ]
        return np.concatenate(outs, axis=0)

    def latency_ms(self, inputs: Sequence[np.ndarray], *, warmup: int, repeats: int) -> float:
        """Median wall time of one ``run`` call on ``inputs`` in milliseconds."""
        for _ in range(warmup):
            self.run(inputs)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self.run(inputs)
            times.append((time.perf_counter() - t0) * 1000.0)
        return float(np.median(times))


class PaddlePredictor(BatchedPredictor):
    """A Paddle Inference predictor on CPU (or GPU when ``use_gpu``)."""

    def __init__(
        self, files: ModelFiles, *, threads: int = 1, onednn: bool = False, use_gpu: bool = False
    ):
        from paddle import inference

        for f in (files.program, files.params):
            if not f.exists():
                raise StepError(f"{f}: exported model file not found")
        config = inference.Config(str(files.program), str(files.params))
        if use_gpu:
            config.enable_use_gpu(256, 0)
        else:
            config.disable_gpu()
            config.set_cpu_math_library_num_threads(threads)
            if onednn:
                config.enable_onednn()
            else:
                config.disable_onednn()
        config.disable_glog_info()
        config.switch_ir_debug(False)
        try:
            self._predictor = inference.create_predictor(config)
        except Exception as exc:  # Paddle raises its own C++ error types
            raise StepError(f"{files.program}: Paddle Inference cannot load it ({exc})") from exc
        self.input_names = list(self._predictor.get_input_names())
        self.output_names = list(self._predictor.get_output_names())
        self.files = files

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if len(inputs) != len(self.input_names):
            raise ValueError(f"model takes {len(self.input_names)} inputs, got {len(inputs)}")
        for name, arr in zip(self.input_names, inputs, strict=True):
            handle = self._predictor.get_input_handle(name)
            handle.reshape(list(arr.shape))
            handle.copy_from_cpu(np.ascontiguousarray(arr))
        self._predictor.run()
        return [self._predictor.get_output_handle(n).copy_to_cpu() for n in self.output_names]
