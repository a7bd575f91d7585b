"""Writing an exported program in each format and proving it faithful (the export step,
``components/steps/export.py``).

:func:`write_formats` saves the PIR program and, as asked, the legacy program and ONNX, each
with the runtime that reads it; :func:`check_parity` runs one on held-out samples at batch 1
and at the full batch against the dygraph model: every output within
``atol + rtol * |dygraph|``, and (for logits) the same top-1 class except near-ties;
:func:`raise_on_failed_parity` turns a failure into one error line.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from components.core.artifacts import StepError
from components.faults import failpoints
from components.ml.decisions import gates
from components.ml.serving.ov_runtime import OVPredictor
from components.ml.serving.runtime import ModelFiles, PaddlePredictor
from components.ml.training.modelio import save_legacy

log = logging.getLogger(__name__)
# the export step's parity params (components.steps.export.ParityParams): samples, atol, rtol
ParityParamsLike = Any

# what the failpoint export.parity (action corrupt) adds to every output the parity check
# reads of an exported program: a drift as a broken inference kernel or pass would make
FAILPOINT_DRIFT = 1e-2


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
    params: ParityParamsLike,
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


def write_formats(
    model: paddle.nn.Layer, spec: Any, tmp: Path, formats: Any
) -> list[tuple[str, Any, Path, Path | None]]:
    """Save ``model`` in ``tmp`` as PIR, and as the legacy program and ONNX when ``formats``
    (``Task.export_formats``) name them; each with its runtime, program and weights."""
    paddle.jit.save(model, str(tmp / "model"), input_spec=spec)
    targets = [("pir", tmp)]
    if "legacy" in formats:
        save_legacy(model, spec, tmp / "legacy" / "model")
        targets.append(("legacy", tmp / "legacy"))
    runtimes: list[tuple[str, Any, Path, Path | None]] = []
    for fmt, directory in targets:
        files = ModelFiles.in_dir(directory)
        runtimes.append((fmt, PaddlePredictor(files), files.program, files.params))
    if "onnx" in formats:  # OpenVINO (the server) reads it; no legacy needed
        onnx_file = save_onnx(tmp, tmp / "onnx" / "model.onnx")
        runtimes.append(("onnx", OVPredictor(onnx_file), onnx_file, None))
    return runtimes


def check_formats(
    model: paddle.nn.Layer,
    runtimes: list[tuple[str, Any, Path, Path | None]],
    held_out: list[np.ndarray],
    params: ParityParamsLike,
    tmp: Path,
    logits: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each format's ``signature.json`` entry (paths relative to ``tmp``, runtime tensor
    names) and its parity report (:func:`check_parity`)."""
    formats, parity = {}, {}
    for fmt, predictor, program, weights in runtimes:
        parity[fmt] = check_parity(model, predictor, held_out, params, program, logits)
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
    return formats, parity


def raise_on_failed_parity(parity: dict[str, Any], params: ParityParamsLike, out_dir: Path) -> None:
    """One error line naming every format and batch whose outputs differ beyond tolerance."""
    failed = [f for f, r in parity.items() if not r["passed"]]
    if not failed:
        return
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
        f"(atol {params.atol}, rtol {params.rtol}): {details}"
    )
