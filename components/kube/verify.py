"""What a registered version's signatures prove (``paddle-mlops verify models:/NAME/VERSION``:
:mod:`components.commands.verify`).

Checks, against the keys ``PADDLE_MLOPS_TRUSTED_KEYS`` names (components.tracking.signing):

1. the signed SLSA provenance statement of the version: signed by a trusted key, naming this
   version's bundle sha256, and agreeing with the version's lineage tags (git commit, data,
   data snapshot, params);
2. the bundle: downloaded, its sha256 equal to the ``bundle_sha256`` tag, its model-signing
   signature made by a trusted key over exactly its files;
3. the serving image (when pushed): a trusted signature of exactly its repository and
   manifest digest in the registry, and the statement naming that digest.

``deploy`` runs 1 and 3 before anything is applied (the bundle is checked where it is
fetched: ``fetch-model``, in the init container or on this machine).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from components.kube.images import image_repository
from components.kube.signatures import verify_image
from components.tracking.model import BUNDLE_TAG
from components.tracking.provenance import (
    BUNDLE_SIG,
    download_files,
    subject_digests,
    verified_provenance,
)
from components.tracking.registry import download_version
from components.tracking.signing import (
    TrustedKey,
    VerificationError,
    verify_bundle,
)

log = logging.getLogger(__name__)


def check_version(
    client: Any,
    uri: str,
    name: str,
    version: int,
    keys: list[TrustedKey],
    *,
    bundle: bool = True,
) -> dict[str, Any]:
    """Verify ``name`` v``version`` (module docstring); refuses with VerificationError."""
    what = f"models:/{name}/{version}"
    tags = dict(client.get_model_version(name, str(version)).tags or {})
    report: dict[str, Any] = {"model": name, "version": version}
    with tempfile.TemporaryDirectory(prefix="paddle-mlops-verify-") as tmp:
        files = download_files(client, uri, name, version, Path(tmp) / "signing")
        body, attester = verified_provenance(keys, files, name, version, tags)
        build = body["predicate"]["buildDefinition"]
        report["provenance"] = {
            "signed_by": attester.keyid,
            "key": str(attester.path),
            "dependencies": {d["name"]: d["digest"] for d in build["resolvedDependencies"]},
            "pipeline_run": build["externalParameters"].get("pipeline_run", ""),
        }
        if bundle:  # the statement is checked above: the signature over the bytes
            got = download_version(client, uri, name, version, Path(tmp) / "model")
            signer = verify_bundle(keys, got, files / BUNDLE_SIG, what)
            report["bundle"] = {"sha256": tags[BUNDLE_TAG], "signed_by": signer.keyid}
    digest = tags.get("serving_image_digest", "")
    if digest:
        repository = image_repository(tags.get("serving_image", ""))
        image = verify_image(repository, digest, keys)
        if subject_digests(body).get(repository) != digest.split(":", 1)[-1]:
            raise VerificationError(
                f"{image.image}: the signed provenance of {what} does not name this image"
            )
        report["image"] = {"ref": image.image, "signed_by": image.keyid, "key": image.key_path}
    return report
