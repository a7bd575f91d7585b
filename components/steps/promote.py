"""promote: a blessed model's image is pushed and the model becomes the champion.

Runs after ``register``. For a challenger that was not blessed it records why nothing
happened and succeeds (the pipeline worked; the model was not good enough). For a blessed one:

1. The serving image: with an image digest handed over by the orchestrator (the kaniko job of
   the cluster pipeline built and pushed it), that digest is used. Otherwise, with
   ``promote.push``, the image ``serving_image`` built and validated on this machine is pushed
   now (never before blessing). The digest is tagged on the registered version
   (``serving_image_digest``), so the champion names the exact image that serves it.
2. Signing (``PADDLE_MLOPS_SIGNING_KEY``, a key file or mounted Secret; docs/provenance.md):
   the version's bundle is signed (OpenSSF model-signing) and its SLSA provenance statement
   written and signed, both kept with the version (``components.tracking.provenance``); a
   pushed image gets a cosign-compatible signature and the provenance as an attestation in
   its registry (``components.kube.signatures``). Without a key nothing is signed (a
   warning): ``deploy`` and ``fetch-model`` refuse such a version wherever keys are trusted.
3. With ``promote.auto_promote`` the version becomes ``champion`` (compare-and-swap against
   the champion the blessing judged: if another run promoted meanwhile, this one fails rather
   than overwrite a model it was never compared with). Deployments follow the alias.

``promotion.json`` records what was done, and so does the ``promote`` run nested under the
pipeline run (tags ``promoted``, ``decision``, the version and the image; the file as an
artifact), whether or not the version was promoted.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError, read_json, write_json
from components.core.config import params_model
from components.kernel.step import In, Out, Step, Value
from components.kube.publish import publish_image, sign_release
from components.tracking.provenance import SBOM
from components.tracking.registry import (
    TAG_LIMIT,
    ChampionChanged,
    Registry,
    RegistryParams,
    step_run,
    tracking_uri,
)
from components.tracking.registry import client as mlflow_client

log = logging.getLogger(__name__)


@params_model
class PromoteParams:
    auto_promote: bool = True  # a blessed challenger becomes champion
    push: bool = False  # push the locally built serving image before promoting


@dataclass(frozen=True)
class PromoteResult:
    model: str
    version: int
    blessed: bool
    promoted: bool
    image: str
    image_digest: str | None
    pushed: bool
    not_promoted: str = ""  # why a blessed version was not promoted (a racing promotion won)
    signed_by: str = ""  # the signing key's id (bundle, provenance and a pushed image)
    image_signature: str = ""  # the registry tag of the image's signature (sha256-<hex>.sig)
    decision: str = ""  # what was done and why, one line (the promote run's tag)


def run(
    params: PromoteParams,
    registration_dir: str | Path,
    infra_dir: str | Path,
    out_dir: str | Path,
    *,
    registry_params: RegistryParams | None = None,
    image_digest: str = "",
) -> PromoteResult:
    registration_dir, infra_dir, out_dir = Path(registration_dir), Path(infra_dir), Path(out_dir)
    info = read_json(registration_dir / "registration.json")
    # the environment's URI (it may hold credentials); registration.json's is redacted
    uri = os.environ.get("MLFLOW_TRACKING_URI") or str(info.get("tracking_uri") or "")
    if "***" in uri:
        raise StepError(
            f"{registration_dir / 'registration.json'}: field 'tracking_uri' {uri} is "
            "redacted (it held credentials); set MLFLOW_TRACKING_URI (credentials in "
            "MLFLOW_TRACKING_USERNAME/PASSWORD)"
        )
    client = mlflow_client(uri or None)
    # the pipeline run register was given (older registration.json: the version's run)
    parent = str(info.get("pipeline_run_id") or info.get("version_run_id") or "")
    if not parent:
        raise StepError(
            f"{registration_dir / 'registration.json'}: no field 'pipeline_run_id' or "
            "'version_run_id' (the MLflow run to record the promotion under); run register again"
        )
    name, version = str(info["model"]), int(info["version"])
    tags = {"registered_model": name, "model_version": str(version)}
    stale_after_s = (registry_params or RegistryParams()).lock_stale_s
    with step_run(client, parent, "promote", tags, stale_after_s=stale_after_s) as step_id:
        result = _promote(
            params, info, registration_dir, infra_dir, uri, client, registry_params, image_digest
        )
        write_json(out_dir / "promotion.json", asdict(result))
        client.log_batch(
            step_id,
            tags=[
                _tag(k, v)
                for k, v in {
                    "blessed": str(result.blessed).lower(),
                    "promoted": str(result.promoted).lower(),
                    "decision": result.decision[:TAG_LIMIT],
                    "pushed": str(result.pushed).lower(),
                    "serving_image_digest": result.image_digest or "",
                    "signed_by": result.signed_by,
                }.items()
                if v
            ],
        )
        client.log_artifact(step_id, str(out_dir / "promotion.json"))
    return result


def _tag(key: str, value: str) -> Any:
    from mlflow.entities import RunTag

    return RunTag(key, value)


def _promote(
    params: PromoteParams,
    info: dict,
    registration_dir: Path,
    infra_dir: Path,
    uri: str,
    client: Any,
    registry_params: RegistryParams | None,
    image_digest: str,
) -> PromoteResult:
    infra = read_json(infra_dir / "infra.json")
    name, version = str(info["model"]), int(info["version"])
    digest, pushed, promoted = image_digest.strip() or None, False, False
    signed_by = image_signature = ""
    not_promoted = ""  # why a blessed version was not promoted
    if not info["blessed"]:
        log.warning("%s v%d was not blessed: no push, no promotion", name, version)
        decision = (
            f"not promoted: v{version} was not blessed ({_blessing_reasons(registration_dir)})"
        )
    else:
        registry = Registry(client, name, registry_params or RegistryParams())
        digest, pushed = publish_image(registry, version, infra, digest, params.push)
        sbom = infra_dir / SBOM if (infra_dir / SBOM).is_file() else None
        signed_by, image_signature = sign_release(
            registry, uri or tracking_uri(), version, infra, sbom, digest
        )
        if params.auto_promote:
            promoted, not_promoted, decision = _make_champion(registry, version, info)
        else:
            decision = (
                f"blessed, not promoted: promote.auto_promote is false (promote it with "
                f"`paddle-mlops registry promote --version {version}`)"
            )
    return PromoteResult(
        name,
        version,
        bool(info["blessed"]),
        promoted,
        str(infra["image"]),
        digest,
        pushed,
        not_promoted,
        signed_by,
        image_signature,
        decision,
    )


def _make_champion(registry: Registry, version: int, info: dict) -> tuple[bool, str, str]:
    """The blessed ``version`` becomes the champion unless another run promoted since the
    blessing judged (compare-and-swap): (promoted, why not, the decision line)."""
    try:
        event = registry.promote(
            version,
            reason="blessed by the pipeline",
            expected_champion=info.get("judged_against"),
        )
    except ChampionChanged as exc:  # a racing pipeline won: its champion stands
        log.warning("%s; v%d stays the challenger, not promoted", exc, version)
        return False, str(exc), f"blessed, not promoted: {exc}"
    was = event.get("previous")
    decision = (
        f"v{version} already is the champion"
        if event.get("action") == "noop"
        else f"promoted: v{version} is the champion" + (f" (was v{was})" if was else " (the first)")
    )
    return True, "", decision


def _blessing_reasons(registration_dir: Path) -> str:
    """The failed rules register recorded (``blessing.json``), one line."""
    blessing = registration_dir / "blessing.json"
    if not blessing.is_file():
        return f"no {blessing}"
    return "; ".join(read_json(blessing).get("reasons") or []) or "no reason recorded"


STEP = Step(
    name="promote",
    doc=__doc__,
    params=PromoteParams,
    sections=("promote", "registry"),
    shared=(("registry", "registry_params", RegistryParams),),
    run=run,
    inputs=(
        In(
            "registration",
            "outputs/register",
            "registration_dir",
            source="register.registration",
            help="registration.json of the challenger",
        ),
        In(
            "infra",
            "outputs/serving_image",
            "infra_dir",
            source="serving_image.infra",
            help="the validated serving image",
        ),
    ),
    outputs=(Out("promotion", "outputs/promote", "out_dir", dvc="uncached"),),
    values=(Value("image_digest", "image_digest", help="digest of an image pushed elsewhere"),),
)
