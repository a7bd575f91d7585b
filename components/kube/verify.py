"""``paddle-mlops verify models:/NAME/VERSION``: what a registered version's signatures prove.

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
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from components.kernel.cli import run_cli
from components.kube.images import image_repository
from components.kube.signatures import verify_image
from components.tracking.connection import add_tracking_flags, open_tracking
from components.tracking.fetch_model import parse_model_uri, resolve
from components.tracking.model import BUNDLE_TAG
from components.tracking.provenance import (
    BUNDLE_SIG,
    download_files,
    subject_digests,
    verified_provenance,
)
from components.tracking.registry import download_version
from components.tracking.signing import (
    TRUST_ENV,
    TrustedKey,
    VerificationError,
    trusted_keys,
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


def _format(report: dict[str, Any]) -> str:
    name, version = report["model"], report["version"]
    lines = [f"models:/{name}/{version}: verified against {TRUST_ENV}"]
    prov = report["provenance"]
    deps = prov["dependencies"]
    lines.append(
        f"  provenance  signed by key {prov['signed_by'][:16]} ({prov['key']}); matches the "
        "version's lineage tags: "
        + ", ".join(f"{k} {next(iter(v.values()))[:12]}" for k, v in deps.items())
        + (f"; pipeline run {prov['pipeline_run']}" if prov["pipeline_run"] else "")
    )
    if "bundle" in report:
        lines.append(
            f"  bundle      sha256 {report['bundle']['sha256'][:16]} (every file) signed by key "
            f"{report['bundle']['signed_by'][:16]}"
        )
    image = report.get("image")
    lines.append(
        f"  image       {image['ref']} signed by key {image['signed_by'][:16]}"
        if image
        else "  image       not pushed (no serving_image_digest): nothing to verify"
    )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops verify MODEL_URI``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="paddle-mlops verify",
        description="Verify a registered version's provenance, bundle and image signatures "
        f"against the keys {TRUST_ENV} names.",
    )
    parser.add_argument("model_uri", help="models:/NAME/VERSION or models:/NAME@ALIAS")
    add_tracking_flags(parser)
    args = parser.parse_args(argv)

    def _go() -> None:
        ref = parse_model_uri(args.model_uri)
        store = open_tracking(args)
        keys = trusted_keys()
        if keys is None:
            raise VerificationError(f"{TRUST_ENV} turns verification off: nothing to verify")
        version = int(resolve(store.client, ref).version)
        report = check_version(store.client, store.uri, ref.name, version, keys)
        sys.stdout.write(_format(report) + f"  tracking    {store}\n")

    return run_cli(_go)


if __name__ == "__main__":
    sys.exit(main())
