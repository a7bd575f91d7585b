"""serving_image: build context for the C++ server image, image build, infra validation.

1. Assembles a build context: a ``Dockerfile`` that adds the packaged model (``model/``, its
   ``model_config.json`` included) to the prebuilt server image (``serving/Containerfile``, built by
   ``make images``; ``serving_image.server_image`` in a cluster), and hashes it. Nothing is
   compiled in a step or in the image build.
2. Builds ``image_repository:tag`` where a builder works (docker, podman or buildah on this
   machine; in the cluster a kaniko job builds the same context). No builder is a normal
   case: the step says so and still produces the context. The image reference and the local
   image id go to the manifest; the registry digest exists only once ``promote`` pushes it.
3. Always validates the infrastructure: builds (or reuses) the server binary, starts it on
   127.0.0.1 with the exported model (``fp32`` and ``int8`` variants), replays golden inputs
   from the test split and compares the answers with Paddle Inference (Python) on the same
   files: fp32 within ``|server - paddle| <= atol + rtol*|paddle|`` (server pinned to f32
   precision; OpenVINO would otherwise run bf16 on AMX CPUs); int8 against the same runtime
   in-process (OpenVINO, Python) on the same IR within ``int8_atol``/``int8_rtol`` — which
   int8 kernel runs (i8, u8, VNNI, AMX) is the CPU's choice, so only the same runtime on the
   same CPU is a fair reference — and the top-1 class must agree except on near-ties (both
   also for fp32). The int8 agreement with Paddle Inference's int8 kernels is recorded, not
   gated (the QAT gate already judged both runtimes). Checks the p50 latency budget of
   single-sample requests; and requires a clean exit on SIGTERM. The server runs with the
   bundle's own ``model_config.json`` (no settings flag or ``SERVING_*`` variable), and the
   settings it reports (``GET /v2/models/<name>/config``) must be the file's: the image and
   ``deploy`` serve the same bundle, so what was validated is what is served. Any failure
   fails the step; ``infra_validated`` is recorded either way.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from components.core.artifacts import (
    StepError,
    atomic_path,
    combined_sha256,
    read_json,
    sha256_tree,
    write_json,
    write_manifest,
)
from components.core.config import params_model
from components.kernel.step import BUNDLE, DATA, Out, Step
from components.kube.images import build_image, detect_builder, image_present
from components.kube.sbom import serving_image_sbom
from components.kube.sbom import validate as validate_sbom
from components.ml import gates, model_config
from components.ml.kserve_client import KServeError
from components.ml.model_config import ModelConfig
from components.ml.ov_runtime import OVPredictor
from components.ml.runtime import BatchedPredictor, ModelFiles, PaddlePredictor
from components.ml.server import (
    REPO,
    RunningServer,
    default_build_dir,
    server_binary,
)
from components.tasks import Task

log = logging.getLogger(__name__)


@params_model
class ServingImageParams:
    image_repository: str = "localhost/paddle-mlops/digits-server"
    image_tag: str | None = None  # default: the first 12 hex digits of the context hash
    builder: Literal["auto", "docker", "podman", "buildah", "none"] = "auto"
    variants: list[Literal["fp32", "int8"]] = field(default_factory=lambda: ["fp32", "int8"])
    # what the image is built FROM: the server image without a model (`make images`, or a
    # registry ref in a cluster); null = the one `make images` built here (build/images.json)
    server_image: str | None = None
    golden_samples: Annotated[int, Field(ge=1)] = 64
    fp32_atol: float = 1e-4
    fp32_rtol: float = 1e-3
    int8_atol: float = 1e-3  # |server - OpenVINO in-process| on the same int8 IR
    int8_rtol: float = 1e-2
    latency_requests: int = 50
    latency_budget_ms_p50: float = 20.0
    startup_timeout_s: float = 60.0


@dataclass(frozen=True)
class ServingImageResult:
    image: str
    image_id: str | None  # the local build's image id: not a registry digest (promote pushes)
    built: bool
    builder: str | None
    infra_validated: bool
    report: dict[str, Any]


# --------------------------------------------------------------------------- validation


def _paddle(model_dir: Path, signature: dict[str, Any], fmt: str) -> PaddlePredictor:
    program = model_dir / signature["formats"][fmt]["program"]
    return PaddlePredictor(ModelFiles.in_dir(program.parent, program.stem))


def _reference(model_dir: Path, signature: dict[str, Any], variant: str) -> BatchedPredictor:
    """What the served variant must match: fp32 Paddle Inference; int8 OpenVINO on its IR."""
    if variant == "fp32":
        return _paddle(model_dir, signature, "pir")

    return OVPredictor(model_dir / signature["formats"]["int8_openvino"]["program"])


def _check_raw(
    server: RunningServer,
    name: str,
    text_input: str,
    raw: np.ndarray,
    expected: np.ndarray,
    report: dict[str, Any],
    tolerance: tuple[float, float],
) -> list[str]:
    """Send the raw samples (texts) themselves; the server's own preprocessing (its C++
    tokenizer) must give the answers of the Python preprocessing + in-process runtime, within
    the variant's ``(atol, rtol)`` and with no top-1 difference beyond near-ties."""
    batch = max(1, min(len(raw), 64))
    output = server.client.metadata(name)["outputs"][0]["name"]
    got = np.concatenate(
        [
            server.client.infer(name, {text_input: raw[i : i + batch]}, binary=True)[output]
            for i in range(0, len(raw), batch)
        ]
    )
    got_json = server.client.infer(name, {text_input: raw[:4]})
    diff = np.abs(got - expected)
    atol, rtol = tolerance
    mismatches = gates.top1_mismatches(got, expected, atol, rtol)
    report["checks"]["raw_answers"] = {
        "input": text_input,
        "samples": int(len(raw)),
        "max_abs_diff": float(diff.max()),
        "top1_agreement": float((got.argmax(1) == expected.argmax(1)).mean()),
        "top1_mismatches": mismatches,
        "json_equals_binary": bool(np.array_equal(got_json[output], got[: len(raw[:4])])),
    }
    failures = []
    if mismatches or not (diff <= atol + rtol * np.abs(expected)).all():
        failures.append(
            f"raw {text_input} requests (the server tokenizes) differ from the Python "
            f"preprocessing: max |diff| {diff.max():.3g}, {mismatches} top-1 classes differ "
            "beyond near-ties"
        )
    if not report["checks"]["raw_answers"]["json_equals_binary"]:
        failures.append(f"raw {text_input}: JSON and binary requests gave different answers")
    return failures


def validate_variant(
    binary: Path,
    model_dir: Path,
    variant: str,
    golden: list[np.ndarray],
    params: ServingImageParams,
    bundled: ModelConfig,
    log_dir: Path,
    raw: np.ndarray | None = None,
    logits: bool = True,
) -> dict[str, Any]:
    """Serve one variant and check answers, latency and graceful shutdown; the server must
    report ``bundled`` (the bundle's model_config.json) as its settings; a server that
    also takes raw samples (a text model's ``text_inputs``: it tokenizes in C++) must answer
    ``raw`` (the stored samples ``golden`` was preprocessed from) the same. ``logits``: the
    output is class logits, whose top-1 classes are compared too (not a generator's image)."""
    signature = read_json(model_dir / "signature.json")
    input_names = [s["name"] for s in signature["inputs"]]
    output_name = signature["outputs"][0]["name"]
    expected = _reference(model_dir, signature, variant).predict(golden)
    name = f"{signature.get('task', 'model')}-{variant}"
    server = RunningServer(binary, model_dir, variant, name, log_dir / f"server-{variant}.log")
    report: dict[str, Any] = {"variant": variant, "checks": {}}
    failures: list[str] = []
    try:
        server.wait_ready(params.startup_timeout_s)
        served = server.client.model_config(name)["settings"]
        report["checks"]["model_config"] = {"bundle": bundled.to_json(), "served": served}
        differ = {k: (v, served.get(k)) for k, v in bundled.to_json().items() if served.get(k) != v}
        if differ:
            failures.append(
                f"{variant}: the server runs with settings other than the bundle's "
                f"{model_config.MODEL_CONFIG_FILE}: "
                + ", ".join(f"{k} {got!r} (bundle {want!r})" for k, (want, got) in differ.items())
            )
        # no request larger than the server's max batch size (it answers 400 to those)
        batch = bundled.max_batch_size
        starts = range(0, len(golden[0]), batch)
        got = np.concatenate(
            [
                server.client.infer(
                    name,
                    {n: x[i : i + batch] for n, x in zip(input_names, golden, strict=True)},
                    binary=True,
                )[output_name]
                for i in starts
            ]
        )
        n_json = min(4, batch)
        got_json = server.client.infer(
            name, {n: x[:n_json] for n, x in zip(input_names, golden, strict=True)}
        )[output_name]
        diff = np.abs(got - expected)
        atol, rtol = (
            (params.fp32_atol, params.fp32_rtol)
            if variant == "fp32"
            else (params.int8_atol, params.int8_rtol)
        )
        mismatches = gates.top1_mismatches(got, expected, atol, rtol) if logits else 0
        report["checks"]["answers"] = {
            "reference": "paddle_inference" if variant == "fp32" else "openvino",
            "samples": int(len(expected)),
            "requests": len(starts),
            "max_abs_diff": float(diff.max()),
            "json_equals_binary": bool(np.array_equal(got_json, got[:n_json])),
        }
        if logits:
            report["checks"]["answers"]["top1_agreement"] = float(
                (got.argmax(1) == expected.argmax(1)).mean()
            )
            report["checks"]["answers"]["top1_mismatches"] = mismatches
        if (
            variant != "fp32" and logits
        ):  # recorded: another runtime's int8 kernels round differently
            other = _paddle(model_dir, signature, "int8_paddle").predict(golden)
            report["checks"]["answers"]["top1_agreement_paddle_inference_int8"] = float(
                (got.argmax(1) == other.argmax(1)).mean()
            )
        bound = atol + rtol * np.abs(expected)
        runtime = "Paddle Inference" if variant == "fp32" else "OpenVINO"
        if not (diff <= bound).all():
            failures.append(
                f"{variant}: server differs from {runtime} "
                f"in-process by up to {diff.max():.3g} (serving_image.{variant}_atol {atol}, "
                f"{variant}_rtol {rtol})"
            )
        if mismatches:
            failures.append(
                f"{variant}: {mismatches} of {len(expected)} top-1 classes differ from "
                f"{runtime} beyond near-ties"
            )
        if not report["checks"]["answers"]["json_equals_binary"]:
            failures.append(f"{variant}: JSON and binary requests gave different answers")
        text_inputs = server.client.metadata(name).get("text_inputs") or []
        if text_inputs and raw is not None:
            checked = _check_raw(
                server, name, text_inputs[0]["name"], raw, expected, report, (atol, rtol)
            )
            failures += [f"{variant}: {f}" for f in checked]

        times = []
        for i in range(params.latency_requests):
            one = {n: x[i % len(x)][None] for n, x in zip(input_names, golden, strict=True)}
            t0 = time.perf_counter()
            server.client.infer(name, one, binary=True)
            times.append((time.perf_counter() - t0) * 1000)
        p50 = float(np.median(times))
        report["checks"]["latency"] = {
            "p50_ms": p50,
            "p99_ms": float(np.percentile(times, 99)),
            "budget_ms_p50": params.latency_budget_ms_p50,
        }
        if p50 > params.latency_budget_ms_p50:
            failures.append(
                f"{variant}: p50 latency {p50:.2f} ms over the budget "
                f"{params.latency_budget_ms_p50} ms"
            )
    except KServeError as exc:
        failures.append(f"{variant}: the server answered {exc}")
    finally:
        code = server.stop()
    report["checks"]["sigterm_exit_code"] = code
    if code != 0:
        failures.append(f"{variant}: the server did not exit cleanly on SIGTERM (code {code})")
    report["failures"] = failures
    report["passed"] = not failures
    return report


# --------------------------------------------------------------------------- image


MODEL_LAYER = """\
# The served model on top of the C++ server image (serving/Containerfile, built by
# `make images`; in a cluster a registry ref). Generated by components/steps/serving_image.py.
ARG SERVER_IMAGE={server_image}
FROM ${{SERVER_IMAGE}}
ARG SERVER_IMAGE
# deploy swaps a new model into a running server only when its server image is this one
LABEL paddle-mlops.server-image="${{SERVER_IMAGE}}"
COPY model /mnt/models
"""


def assemble_context(dest: Path, model_dir: Path, server_image: str) -> str:
    """``Dockerfile`` (the model layer) and ``model/`` (the bundle, its model config
    included); the context's sha256 (over its files) names the image."""
    (dest / "Dockerfile").write_text(MODEL_LAYER.format(server_image=server_image))
    shutil.copytree(model_dir, dest / "model")
    return combined_sha256(sha256_tree(dest))


def local_server_image() -> str | None:
    """The server image ``make images`` built on this machine (``build/images.json``)."""
    record = REPO / "build" / "images.json"
    if not record.is_file():
        return None
    return (read_json(record).get("server") or {}).get("ref")


# --------------------------------------------------------------------------- step


def run(
    params: ServingImageParams,
    task: Task,
    model_dir: str | Path,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    serving_src: str | Path = REPO / "serving",
    build_dir: str | Path | None = None,
) -> ServingImageResult:
    """Serve ``model_dir`` with the real server binary (built from ``serving_src`` into
    ``build_dir``, default ``$SERVING_BUILD_DIR`` or ``build/serving``), check every variant's
    answers and latency, and build the image when a builder is here (``promote`` pushes it)."""
    build_dir = build_dir or default_build_dir()
    model_dir, data_dir, out_dir = Path(model_dir), Path(data_dir), Path(out_dir)
    bundled = model_config.read(model_dir)  # what every variant must be served with
    binary = server_binary(Path(serving_src), Path(build_dir))
    base = params.server_image or local_server_image()
    # the first golden_samples of the test split: the stream stops there
    raw_golden, _ = task.read_head(data_dir, "test", params.golden_samples)
    task.load_assets(model_dir)
    # what the model takes for them (a generator's: latents + classes)
    golden, _ = task.eval_head(data_dir, "test", params.golden_samples)

    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        (tmp / "context").mkdir()
        context_sha = assemble_context(
            tmp / "context", model_dir, base or "paddle-mlops/server:latest"
        )
        ref = f"{params.image_repository}:{params.image_tag or context_sha[:12]}"
        builder, why = detect_builder(params.builder)
        if builder is not None and not image_present(builder, base):
            builder, why = (
                None,
                (
                    f"the server image {base} is not on this machine (make images)"
                    if base
                    else "no server image: run `make images` or set serving_image.server_image"
                ),
            )
        image_id = None
        if builder is None:
            log.warning(
                "no image builder here (%s): build context ready; in the cluster a "
                "kaniko job builds %s from it",
                why,
                ref,
            )
        else:
            image_id = build_image(builder, tmp / "context", ref)  # pushed by promote
            log.info("built %s with %s (image id %s)", ref, builder, image_id)
            # what the image holds (CycloneDX): promote attaches it to the pushed image
            sbom = serving_image_sbom(builder, ref, model_dir, task.name)
            validate_sbom(sbom)
            write_json(tmp / "sbom.cdx.json", sbom)

        reports = [
            validate_variant(
                binary,
                model_dir,
                v,
                golden,
                params,
                bundled,
                tmp,
                raw_golden,
                task.outputs_logits,
            )
            for v in params.variants
        ]
        failures = [f for r in reports for f in r["failures"]]
        validated = not failures
        summary = {
            "image": ref,
            "image_id": image_id,
            "built": builder is not None,
            "builder": builder,
            "builder_note": why,
            "context_sha256": context_sha,
            "model_config": bundled.to_json(),
            "infra_validated": validated,
            "variants": reports,
            "server_binary": str(binary),
        }
        write_json(tmp / "infra.json", summary)
        write_manifest(
            tmp,
            "serving_image",
            inputs={"model": model_dir},
            outputs={"infra.json": tmp / "infra.json"},
            params=asdict(params),
            extra={
                "image": ref,
                "image_id": image_id,
                "infra_validated": validated,
                "context_sha256": context_sha,
            },
        )
    for r in reports:
        log.info("infra validation %s: %s", r["variant"], {k: v for k, v in r["checks"].items()})
    if not validated:
        raise StepError("infra validation failed:\n" + "\n".join(f"  - {f}" for f in failures))
    return ServingImageResult(ref, image_id, builder is not None, builder, validated, summary)


STEP = Step(
    name="serving_image",
    doc=__doc__,
    params=ServingImageParams,
    sections=("task", "serving_image"),
    run=run,
    inputs=(
        BUNDLE,
        DATA,
    ),
    outputs=(
        Out(
            "infra",
            "outputs/serving_image",
            "out_dir",
            help="infra.json, the image's build context",
        ),
    ),
    result="image",
    extra_deps=("serving/src", "serving/CMakeLists.txt"),
)
