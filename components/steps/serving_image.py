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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from components.core.artifacts import (
    StepError,
    atomic_path,
    write_json,
    write_manifest,
)
from components.core.config import params_model
from components.kernel.step import BUNDLE, DATA, Out, Step
from components.kube.serving_context import (
    assemble_context,
    build,
    choose_builder,
    local_server_image,
)
from components.ml.serving import model_config
from components.ml.serving.infra_validation import validate_variant
from components.ml.serving.server import READY_POLL_S, REPO, default_build_dir, server_binary
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
    # how often a starting server is asked whether it is ready
    startup_poll_s: Annotated[float, Field(gt=0)] = READY_POLL_S


@dataclass(frozen=True)
class ServingImageResult:
    image: str
    image_id: str | None  # the local build's image id: not a registry digest (promote pushes)
    built: bool
    builder: str | None
    infra_validated: bool
    report: dict[str, Any]


def _summary(
    params: ServingImageParams, model_dir: Path, tmp: Path, summary: dict[str, Any]
) -> dict[str, Any]:
    """infra.json and the step's manifest; the summary."""
    write_json(tmp / "infra.json", summary)
    write_manifest(
        tmp,
        "serving_image",
        inputs={"model": model_dir},
        outputs={"infra.json": tmp / "infra.json"},
        params=asdict(params),
        extra={
            "image": summary["image"],
            "image_id": summary["image_id"],
            "infra_validated": summary["infra_validated"],
            "context_sha256": summary["context_sha256"],
        },
    )
    return summary


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
        builder, why = choose_builder(params.builder, base)
        image_id = build(builder, why, tmp / "context", ref, model_dir, task.name)
        checks = (golden, params, bundled, tmp, raw_golden, task.outputs_logits)
        reports = [validate_variant(binary, model_dir, v, *checks) for v in params.variants]
        failures = [f for r in reports for f in r["failures"]]
        validated = not failures
        summary = _summary(
            params, model_dir, tmp, {
                "image": ref, "image_id": image_id, "built": builder is not None,
                "builder": builder, "builder_note": why, "context_sha256": context_sha,
                "model_config": bundled.to_json(), "infra_validated": validated,
                "variants": reports, "server_binary": str(binary),
            },
        )  # fmt: skip
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
