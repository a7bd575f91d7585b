"""export: serialise the trained model for inference and prove the export is faithful.

Writes to the output directory:

- ``model.json`` + ``model.pdiparams``: ``paddle.jit.save`` (PIR) with the task's
  ``InputSpec`` whose batch dimension is dynamic (-1).
- ``legacy/model.pdmodel`` + ``legacy/model.pdiparams``: the same program in the legacy
  format, for runtimes that only read that (OpenVINO's Paddle frontend).
- ``signature.json``: inputs/outputs (served names, shapes, dtypes; runtime tensor names per
  format), preprocessing, label names.
- ``parity.json``: the parity check result; ``manifest.json``.

Parity: each format is loaded with Paddle Inference and run on the first ``parity.samples``
held-out (validation) samples (read from the split's stream, which stops there) at batch 1
and at the full batch. The stage fails unless, for every logit,
``|exported - dygraph| <= atol + rtol * |dygraph|`` (defaults ``atol=1e-4``,
``rtol=1e-3``: float32 kernels differ between dygraph and the inference passes only by
reassociation) and the top-1 class agrees on every sample except near-ties: samples whose two
best dygraph logits are closer than that tolerance may pick either class on another CPU.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import paddle
from pydantic import Field

from components.core.artifacts import atomic_path, write_json, write_manifest
from components.core.config import params_model
from components.kernel.step import DATA, In, Out, Step
from components.ml.data import dataset
from components.ml.serving import warmup
from components.ml.training import exporting
from components.tasks import Task
from components.tasks.base import ASSETS_DIR
from components.tasks.trained import load_trained

log = logging.getLogger(__name__)


@params_model
class ParityParams:
    samples: int = 64
    atol: float = 1e-4
    rtol: float = 1e-3


@params_model
class ExportParams:
    parity: ParityParams = field(default_factory=ParityParams)
    # validation samples the bundle carries for the server's warm-up (components.ml.serving.warmup)
    warmup_samples: Annotated[int, Field(ge=0)] = 8


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    parity: dict[str, Any]


def run(
    params: ExportParams,
    task: Task,
    train_dir: str | Path,
    data_dir: str | Path,
    out_dir: str | Path,
) -> ExportResult:
    """Export fp32 (PIR + legacy) once and check parity; ``qat`` and ``package`` build on it."""
    train_dir, data_dir, out_dir = Path(train_dir), Path(data_dir), Path(out_dir)
    trained, meta = load_trained(task, train_dir)
    model = task.serving_model(trained)  # what is exported and served (a GAN's generator)
    spec = task.paddle_input_specs()
    # the validation split's first samples: only the row groups they are in are read
    held_out, _ = task.eval_head(data_dir, "val", params.parity.samples)

    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        runtimes = exporting.write_formats(model, spec, tmp, task.export_formats)
        task.save_assets(tmp / ASSETS_DIR)  # the fitted preprocessing, beside the program
        formats, parity = exporting.check_formats(
            model, runtimes, held_out, params.parity, tmp, task.outputs_logits
        )
        signature = _signature(task, int(meta["num_classes"]), formats, data_dir)
        write_json(tmp / "signature.json", signature)
        if params.warmup_samples:
            warm, _ = task.eval_head(data_dir, "val", params.warmup_samples)
            warmup.write(tmp, [s["name"] for s in signature["inputs"]], warm)
        write_json(tmp / "parity.json", parity)
        write_manifest(
            tmp,
            "export",
            inputs={"model.pdparams": train_dir / "model.pdparams"},
            outputs={
                p.relative_to(tmp).as_posix(): p for p in sorted(tmp.rglob("*")) if p.is_file()
            },
            params=asdict(params),
        )
        exporting.raise_on_failed_parity(parity, params.parity, out_dir)
    return ExportResult(out_dir=out_dir, parity=parity)


def _signature(
    task: Task, num_classes: int, formats: dict[str, Any], data_dir: Path
) -> dict[str, Any]:
    """``signature.json``: the served inputs and outputs, each format, the preprocessing,
    the label names."""
    return {
        "task": task.name,
        "inputs": [s.to_json() for s in task.input_specs()],
        "outputs": [s.to_json() for s in task.output_specs(num_classes)],
        "formats": formats,
        "preprocessing": task.preprocessing_doc(),
        "label_names": dataset.read_label_names(data_dir),
        "paddle_version": paddle.__version__,
    }


STEP = Step(
    name="export",
    doc=__doc__,
    params=ExportParams,
    sections=("task", "export"),
    run=run,
    inputs=(
        In("model", "outputs/train", "train_dir", source="train.model", help="trained weights"),
        DATA,
    ),
    outputs=(Out("exported", "outputs/export", "out_dir", kfp="Model", help="fp32 export"),),
)
