"""A blessed version's release: its serving image pushed and named on the version, and the
version (with a pushed image) signed before it can become the champion (``promote``).

Signing (``PADDLE_MLOPS_SIGNING_KEY``, docs/provenance.md): the version's bundle and its SLSA
provenance (:func:`components.tracking.provenance.sign_version`); a pushed image gets a
cosign-compatible signature, the provenance as an attestation and the SBOM
(:mod:`components.kube.signatures`). Without a key nothing is signed (a warning).

Library layer: imported by the promote step, imports no step.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError
from components.kube.images import image_repository, push_image
from components.kube.signatures import CYCLONEDX, attach, attach_attestation, sign_image
from components.tracking.provenance import SLSA, sign_version
from components.tracking.registry import Registry
from components.tracking.signing import signing_key

log = logging.getLogger(__name__)


def publish_image(
    registry: Registry, version: int, infra: dict[str, Any], digest: str | None, push: bool
) -> tuple[str | None, bool]:
    """The serving image of ``version``: ``digest`` when an orchestrator pushed it, else (with
    ``push``, ``promote.push``) the image built on this machine pushed now. The version is
    tagged with the image and its digest. Returns (the digest or None, whether it was pushed
    here)."""
    name, pushed = registry.name, False
    if digest is None and push:
        if not infra.get("built"):
            raise StepError(
                f"promote.push: the image {infra['image']} was not built on this machine "
                f"({infra.get('builder_note') or 'no builder'}); set serving_image.builder, "
                "or let the cluster pipeline build and push it (kaniko)"
            )
        digest, pushed = push_image(str(infra["builder"]), str(infra["image"])), True
        log.info("pushed %s (%s)", infra["image"], digest)
    if digest:
        # the image exists now, wherever it was built: the version names it, with its
        # digest, and no longer says it was not built
        for tag, value in (
            ("serving_image", str(infra["image"])),
            ("serving_image_digest", digest),
            ("serving_image_built", "true"),
        ):
            registry.client.set_model_version_tag(name, str(version), tag, value)
        if "serving_image_not_built" in registry.version(version).tags:
            registry.client.delete_model_version_tag(name, str(version), "serving_image_not_built")
    return digest, pushed


def sign_release(
    registry: Registry,
    uri: str,
    version: int,
    infra: dict[str, Any],
    sbom: Path | None,
    digest: str | None,
) -> tuple[str, str]:
    """Sign the version (and its pushed image) before it can become the champion. Returns
    (the key's id, the image signature's registry tag), "" for what was not signed."""
    key = signing_key()
    name = registry.name
    if key is None:
        log.warning(
            "no signing key (PADDLE_MLOPS_SIGNING_KEY): %s v%d is released unsigned; deploy and "
            "fetch-model refuse it wherever keys are trusted",
            name,
            version,
        )
        return "", ""
    image = f"{image_repository(str(infra['image']))}@{digest}" if digest else None
    envelope = sign_version(registry.client, uri, name, version, key, image, sbom)
    if not digest:
        return key.keyid, ""
    ref = str(infra["image"])
    tag = sign_image(ref, digest, key)
    slot = f"{name}/{version}:{key.keyid}"  # one statement per version and key
    attach_attestation(ref, digest, envelope, SLSA, slot)
    if sbom is not None:
        attach(ref, digest, "sbom", sbom.read_bytes(), CYCLONEDX, slot="sbom")
    log.info("signed %s; its provenance%s attached", image, " and SBOM" if sbom else "")
    return key.keyid, tag
