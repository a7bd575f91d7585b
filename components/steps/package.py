"""package: the served model bundle, the fp32 export plus the gated int8 model.

Copies ``export``'s output (fp32 PIR + legacy programs, parity report, signature) and adds the
int8 programs of ``qat`` under ``int8/paddle`` and ``int8/openvino``; ``signature.json`` then
lists every format. When qat shipped no int8 model (``qat.allow_fp32_only``), the bundle is
fp32 only and ``signature.json`` says why (``int8_unavailable``). Writes the bundle's model
config (``model_config.json``, from ``package.model_config``): the per-model settings the C++
server runs it with, wherever it is served. With ``package.tune.budget_s`` > 0 those settings
are first searched on this machine (``components/ml/serving/tuning.py``: the real server, a
closed-loop ``wrk`` load): the winner is what ``model_config.json`` says, and ``tune.json``
beside it is the search table. Here, before infra validation, because the bundle is immutable once
packaged: infra validation then checks the tuned settings, and evaluate, the image, the registry and
``deploy`` all get the one bundle. Nothing is exported or converted again: this bundle is what
``evaluate`` scores, what infra validation serves, what the server image bakes in, what the registry
versions and what ``deploy`` serves.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError, atomic_path, read_json, write_json, write_manifest
from components.core.config import params_model
from components.kernel.step import In, Out, Step
from components.ml.serving import model_config, tuning
from components.ml.serving.model_config import ModelConfig
from components.ml.serving.server import REPO, default_build_dir, server_binary
from components.ml.serving.tuning import TuneParams

log = logging.getLogger(__name__)


@params_model
class PackageParams:
    # the server's per-model settings, written into the bundle as model_config.json
    model_config: ModelConfig
    # the search for the settings that serve this bundle best here (components/ml/serving/tuning.py)
    tune: TuneParams


INT8_FORMATS = {
    "paddle": ("model.pdmodel", "model.pdiparams"),
    "openvino": ("model.xml", "model.bin"),
}


def fp32_only_reasons(qat_dir: Path) -> list[str] | None:
    """Why the qat step shipped no int8 model (``qat.allow_fp32_only``), or None when it
    passed its gate."""
    gate = qat_dir / "gate.json"
    doc = read_json(gate) if gate.exists() else {}
    if doc.get("passed"):
        return None
    if doc.get("fp32_only"):
        return [str(r) for r in doc.get("reasons") or []]
    raise StepError(f"{gate}: no int8 model that passed the QAT gate; run qat first")


def bundle_int8(qat_dir: Path, dest: Path) -> dict[str, Any]:
    """Copy the gated int8 programs of ``qat_dir`` to ``dest``; their ``signature.json``
    format entries (paths relative to the bundle)."""
    formats = {}
    for fmt, (program, params) in INT8_FORMATS.items():
        for name in (program, params):
            if not (qat_dir / fmt / name).is_file():
                raise StepError(f"{qat_dir / fmt / name}: missing from the qat output")
        shutil.copytree(qat_dir / fmt, dest / fmt)
        formats[f"int8_{fmt}"] = {
            "program": f"{dest.name}/{fmt}/{program}",
            "params": f"{dest.name}/{fmt}/{params}",
        }
    return formats


def run(
    params: PackageParams, export_dir: str | Path, qat_dir: str | Path, out_dir: str | Path
) -> Path:
    """Write the bundle to ``out_dir``: ``export_dir`` plus ``int8/`` from ``qat_dir`` and
    the model config."""
    export_dir, qat_dir, out_dir = Path(export_dir), Path(qat_dir), Path(out_dir)
    signature_file = export_dir / "signature.json"
    if not signature_file.is_file():
        raise StepError(f"{signature_file}: missing; --exported must be the output of export")
    with atomic_path(out_dir) as tmp:
        shutil.copytree(export_dir, tmp, ignore=shutil.ignore_patterns("manifest.json"))
        signature = read_json(signature_file)
        reasons = fp32_only_reasons(qat_dir)
        if reasons is None:
            signature["formats"].update(bundle_int8(qat_dir, tmp / "int8"))
        else:  # recorded where every consumer of the bundle reads
            signature["int8_unavailable"] = reasons
            log.warning("bundle without int8 (qat.allow_fp32_only): %s", "; ".join(reasons))
        write_json(tmp / "signature.json", signature)
        model_config.write(tmp, params.model_config)
        tuned = None
        if params.tune.budget_s > 0:
            binary = server_binary(REPO / "serving", default_build_dir())
            tuned, table = tuning.tune(params.tune, binary, tmp, params.model_config)
            model_config.write(tmp, tuned)
            write_json(tmp / tuning.TUNE_FILE, table)
        write_manifest(
            tmp,
            "package",
            inputs={"export": export_dir / "manifest.json", "qat": qat_dir / "manifest.json"},
            outputs={
                p.relative_to(tmp).as_posix(): p for p in sorted(tmp.rglob("*")) if p.is_file()
            },
            params={
                "model_config": params.model_config.to_json(),
                "tune": asdict(params.tune),
            },
            extra={"tuned_model_config": tuned.to_json() if tuned else None},
        )
    log.info("packaged %s: formats %s", out_dir, sorted(signature["formats"]))
    return out_dir


STEP = Step(
    name="package",
    doc=__doc__,
    params=PackageParams,
    sections=("package",),
    run=run,
    inputs=(
        In("exported", "outputs/export", "export_dir", source="export.exported", help="fp32"),
        In("int8", "outputs/qat", "qat_dir", source="qat.int8", help="gated int8 bundle"),
    ),
    outputs=(Out("bundle", "outputs/package", "out_dir", kfp="Model", help="served bundle"),),
    extra_deps=("serving/src", "serving/CMakeLists.txt"),  # the tuning runs the server
)
