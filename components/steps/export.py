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

import numpy as np
import paddle
from pydantic import Field

from components.core.artifacts import StepError, atomic_path, write_json, write_manifest
from components.core.config import params_model
from components.faults import failpoints
from components.kernel.step import DATA, In, Out, Step
from components.ml import dataset, gates, warmup
from components.ml.modelio import load_trained, save_legacy
from components.ml.ov_runtime import OVPredictor
from components.ml.runtime import ModelFiles, PaddlePredictor
from components.tasks import Task
from components.tasks.base import ASSETS_DIR

log = logging.getLogger(__name__)

# what the failpoint export.parity (action corrupt) adds to every output the parity check
# reads of an exported program: a drift as a broken inference kernel or pass would make
FAILPOINT_DRIFT = 1e-2


@params_model
class ParityParams:
    samples: int = 64
    atol: float = 1e-4
    rtol: float = 1e-3


@params_model
class ExportParams:
    parity: ParityParams = field(default_factory=ParityParams)
    # validation samples the bundle carries for the server's warm-up (components.ml.warmup)
    warmup_samples: Annotated[int, Field(ge=0)] = 8


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    parity: dict[str, Any]


def save_onnx(pir_dir: Path, dest: Path) -> Path:
    """The PIR program in ``pir_dir`` (``model.json``) as ONNX (opset 13, paddle2onnx): the
    fp32 format OpenVINO reads for a model that has no legacy program."""
    import paddle2onnx

    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        paddle2onnx.export(
            str(pir_dir / "model.json"),
            str(pir_dir / "model.pdiparams"),
            save_file=str(dest),
            opset_version=13,
            enable_onnx_checker=True,
            optimize_tool="None",
        )
    except Exception as exc:  # paddle2onnx raises bare Exceptions for unsupported ops
        raise StepError(
            f"{pir_dir / 'model.json'}: paddle2onnx {paddle2onnx.__version__} cannot convert "
            f"it to ONNX ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from exc
    if not dest.is_file():
        raise StepError(f"{dest}: paddle2onnx wrote no ONNX file")
    return dest


def check_parity(
    model: paddle.nn.Layer,
    predictor: Any,
    inputs: list[np.ndarray],
    params: ParityParams,
    program: Path,
    logits: bool = True,
) -> dict[str, Any]:
    """Compare the exported program with the dygraph model; returns a JSON-able report.
    ``logits``: the output is class logits, whose top-1 classes must agree too."""
    with paddle.no_grad():
        ref = model(*[paddle.to_tensor(x) for x in inputs]).numpy()
    full = predictor.run(inputs)[0]
    single = np.concatenate(
        [predictor.run([x[i : i + 1] for x in inputs])[0] for i in range(inputs[0].shape[0])]
    )
    if failpoints.corrupts("export.parity", str(program)):
        full, single = full + FAILPOINT_DRIFT, single + FAILPOINT_DRIFT
    report: dict[str, Any] = {
        "samples": int(ref.shape[0]),
        "atol": params.atol,
        "rtol": params.rtol,
    }
    ok = True
    for name, got in (("batch_full", full), ("batch_1", single)):
        if got.shape != ref.shape:
            raise StepError(
                f"{program}: output shape {list(got.shape)} != dygraph {list(ref.shape)} ({name})"
            )
        diff = np.abs(got - ref)
        bound = params.atol + params.rtol * np.abs(ref)
        mismatches = gates.top1_mismatches(got, ref, params.atol, params.rtol) if logits else 0
        passed = bool((diff <= bound).all() and mismatches == 0)
        report[name] = {
            "max_abs_diff": float(diff.max()),
            "violations": int((diff > bound).sum()),
            "passed": passed,
        }
        if logits:
            # near-ties within the tolerance may differ; beyond it a real disagreement
            report[name]["top1_agreement"] = float((got.argmax(1) == ref.argmax(1)).mean())
            report[name]["top1_mismatches"] = mismatches
        ok = ok and passed
    report["passed"] = ok
    return report


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
        paddle.jit.save(model, str(tmp / "model"), input_spec=spec)
        task.save_assets(tmp / ASSETS_DIR)  # the fitted preprocessing, beside the program
        targets = [("pir", tmp)]
        if "legacy" in task.export_formats:
            save_legacy(model, spec, tmp / "legacy" / "model")
            targets.append(("legacy", tmp / "legacy"))
        runtimes: list[tuple[str, Any, Path, Path | None]] = []
        for fmt, directory in targets:
            files = ModelFiles.in_dir(directory)
            runtimes.append((fmt, PaddlePredictor(files), files.program, files.params))
        if "onnx" in task.export_formats:  # OpenVINO (the server) reads it; no legacy needed
            onnx_file = save_onnx(tmp, tmp / "onnx" / "model.onnx")
            runtimes.append(("onnx", OVPredictor(onnx_file), onnx_file, None))
        formats, parity = {}, {}
        for fmt, predictor, program, weights in runtimes:
            parity[fmt] = check_parity(
                model, predictor, held_out, params.parity, program, task.outputs_logits
            )
            formats[fmt] = {
                "program": program.relative_to(tmp).as_posix(),
                "params": weights.relative_to(tmp).as_posix() if weights else "",
                "input_names": predictor.input_names,
                "output_names": predictor.output_names,
            }
            log.info(
                "parity %s: %s",
                fmt,
                {k: v for k, v in parity[fmt].items() if k.startswith("batch")},
            )
        num_classes = int(meta["num_classes"])
        signature = {
            "task": task.name,
            "inputs": [s.to_json() for s in task.input_specs()],
            "outputs": [s.to_json() for s in task.output_specs(num_classes)],
            "formats": formats,
            "preprocessing": task.preprocessing_doc(),
            "label_names": dataset.read_label_names(data_dir),
            "paddle_version": paddle.__version__,
        }
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
        failed = [f for f, r in parity.items() if not r["passed"]]
        if failed:
            details = "; ".join(
                f"{f}: {k} max |diff| {parity[f][k]['max_abs_diff']:.3g}, "
                f"{parity[f][k]['violations']} outputs beyond tolerance, "
                f"{parity[f][k].get('top1_mismatches', 0)} top-1 classes differ "
                "(beyond near-ties)"
                for f in failed
                for k in ("batch_full", "batch_1")
                if not parity[f][k]["passed"]
            )
            raise StepError(
                f"{out_dir}: exported model differs from the trained model "
                f"(atol {params.parity.atol}, rtol {params.parity.rtol}): {details}"
            )
    return ExportResult(out_dir=out_dir, parity=parity)


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
