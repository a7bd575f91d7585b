"""The version ``deploy`` serves (library layer): the alias resolved to an immutable version,
refused without an image digest or with incomplete lineage, or when its signed provenance
(matching its lineage tags) or image signature does not verify against the trusted keys
(``components.kube.verify``; docs/provenance.md); which version runs as a challenger beside
the champion; and its bundle fetched and verified as the init container does."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from components.core.artifacts import StepError, write_json, write_text
from components.core.deploy_target import DeploySettings, Release
from components.kube.images import image_repository
from components.kube.signatures import policy_json, registries_d
from components.kube.verify import check_version
from components.tracking.fetch_model import fetch
from components.tracking.model import BUNDLE_TAG
from components.tracking.registry import CHAMPION, Registry
from components.tracking.signing import ACCEPT_ANYTHING, TRUST_ENV, trusted_keys

log = logging.getLogger(__name__)


def release(registry: Registry, version: int, *, image: bool = True) -> Release:
    """The deployable facts of ``version``; refuses what cannot be pinned or traced.
    ``image`` False (``target: local``, the bundle served by the built binary): a version
    without a pushed image is deployable (its ``image`` is empty)."""

    tags = registry.version(version).tags
    problems = []
    missing = registry.missing_lineage(version)
    if missing:
        problems.append(f"lineage tags missing: {', '.join(missing)}")
    digest = tags.get("serving_image_digest", "")
    pinned = digest.startswith("sha256:") and len(digest) == 71
    if image and not pinned:
        problems.append(
            "no serving image digest (tag serving_image_digest): the image was never pushed; "
            "set promote.push (or build in the cluster) so promote records one"
        )
    if not tags.get(BUNDLE_TAG):
        problems.append(f"no {BUNDLE_TAG} tag: its files cannot be verified when fetched")
    if problems:
        raise StepError(
            f"{registry.name} v{version}: refusing to deploy:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    return Release(
        registry.name,
        version,
        f"{image_repository(tags['serving_image'])}@{digest}" if pinned else "",
        f"models:/{registry.name}/{version}",
        tags[BUNDLE_TAG],
    )


def verify_release(
    registry: Registry,
    tracking: str,
    rel: Release,
    out: Path | None = None,
    final: Path | None = None,
) -> dict[str, Any]:
    """Refuse ``rel`` unless its signed provenance (matching its lineage tags) and its image
    signature verify against the trusted keys (``components.kube.verify``); its bundle is
    verified where it is fetched. ``out``: also write the containers ``policy.json`` and
    ``registries.d/`` that make a podman with sigstore support enforce the image signature
    itself (``final``: where ``out`` will be once written)."""
    keys = trusted_keys()
    if keys is None:
        log.warning("%s=%s: deploying v%d unverified", TRUST_ENV, ACCEPT_ANYTHING, rel.version)
        return {"verified": False, "why": f"{TRUST_ENV}={ACCEPT_ANYTHING}"}
    report = check_version(registry.client, tracking, rel.model, rel.version, keys, bundle=False)
    if out is not None:  # the key that signed the image, next to the policy naming it
        image_signer = report["image"]["signed_by"]
        signer = next(k for k in keys if k.keyid == image_signer)
        write_text(out / "image-signing.pub", signer.pem.decode())
        key_path = (final or out).resolve() / "image-signing.pub"
        write_json(out / "policy.json", policy_json(rel.image, key_path))
        attachments = yaml.safe_dump(registries_d(rel.image))
        write_text(out / "registries.d" / "paddle-mlops.yaml", attachments)
    log.info("%s v%d: provenance and image signature verified", rel.model, rel.version)
    return {"verified": True, **report}


def not_deployable(
    registry: Registry, version: int, champion: int | None, params: DeploySettings
) -> str:
    """Why the alias's version is not deployed beside (or instead of) the champion: never
    blessed (the newest version carries ``challenger`` whether blessed or not), judged and
    rolled back, or the champion already (promoted). Empty: deployable."""
    if params.alias == CHAMPION:
        return ""
    tags = registry.version(version).tags
    what = f"{registry.name} v{version} ('{params.alias}')"
    if tags.get("blessed") != "true":
        return f"{what} is not blessed ({tags.get('blessed')})"
    if params.challenger == "none":
        return ""
    if tags.get("judged") == "reject":
        return f"{what} was rolled back by the judge ({tags.get('judged_reason', '')[:200]})"
    if version == champion:
        return f"{what} is the champion already"
    return ""


@dataclass(frozen=True)
class Choice:
    """What ``deploy`` serves: ``version``, with ``challenger`` beside it (a cluster's or a
    rendering's pods); ``challenger_record`` for deployment.json; ``refusal``: nothing."""

    version: int
    challenger: Release | None = None
    challenger_record: dict[str, Any] | None = None
    refusal: str = ""


def choose(
    registry: Registry, aliases: dict[str, int], version: int, params: DeploySettings
) -> Choice:
    """The versions to deploy for ``params.alias``, which names ``version``. A cluster's pods (and a
    rendering) run the champion and, beside it, the alias's version; a challenger the judge
    promoted or rolled back (or one never blessed) leaves the champion alone."""
    refusal = not_deployable(registry, version, aliases.get(CHAMPION), params)
    if params.challenger != "none" and params.target in ("kubernetes", "none"):
        champion = aliases.get(CHAMPION)
        if champion is None:
            raise StepError(f"{registry.name}: no '{CHAMPION}' to run a challenger beside")
        if refusal:
            log.warning("%s: the champion v%d alone", refusal, champion)
            return Choice(champion, challenger_record={"refused": refusal})
        challenger = release(registry, version)
        record = {**asdict(challenger), "policy": params.challenger}
        return Choice(champion, challenger, record)
    return Choice(version, refusal=refusal)


def fetch_verified(rel: Release, params: DeploySettings, tracking: str) -> Path:
    """Fetch and verify ``rel``'s bundle as the init container does, into
    ``local_state_dir/models/MODEL/vN`` (returned)."""
    models_root = Path(params.local_state_dir).resolve() / "models" / rel.model
    model_dir = models_root / f"v{rel.version}"
    fetched = fetch(rel.model_uri, model_dir, tracking=tracking)
    if fetched.sha256 != rel.bundle_sha256:
        raise StepError(f"{rel.model_uri}: fetched {fetched.sha256}, expected {rel.bundle_sha256}")
    return model_dir
