"""A registered version's signatures and SLSA provenance, kept with the version.

``promote`` calls :func:`sign_version` for a blessed version: the registered bundle (downloaded
and checked against ``bundle_sha256``) is signed with model-signing, and an in-toto statement
with an SLSA v1 provenance predicate is written and signed (DSSE). Both are artifacts of the
version's MLflow run under ``signing/vN/`` (``bundle.sig``, ``provenance.dsse.json``); the
version's tag ``signed_by`` names the key (information only: verification reads the files).

The statement's subjects are the bundle (``models:/NAME/N``, its ``bundle_sha256``) and, once
pushed, the serving image (repository, manifest digest). It names the git commit, the
component image, the data (input files' and snapshot's sha256), the params' sha256 and the
pipeline run. :func:`verified_provenance` is the one check of a version's statement that
``fetch-model``, ``verify`` and ``deploy`` (through ``components.kube.verify``) make: signed by
a trusted key, naming this model name and version with its ``bundle_sha256`` (so a signed
bundle of another version cannot be passed off as this one), and agreeing with the version's
lineage tags (:func:`lineage_mismatches`: a tag rewritten after signing is refused).
:func:`verify_files` adds the signature over the bundle's bytes.
"""

from __future__ import annotations

import logging
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError, read_json, sha256_file, write_json
from components.tracking.liveness import PIPELINE_RUN_TAG
from components.tracking.model import BUNDLE_TAG
from components.tracking.registry import SNAPSHOT_TAG, download_version
from components.tracking.signing import (
    SigningKey,
    TrustedKey,
    VerificationError,
    open_statement,
    sign_bundle,
    sign_statement,
    verify_bundle,
)

log = logging.getLogger(__name__)

STATEMENT = "https://in-toto.io/Statement/v1"
SLSA = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/paddle-mlops/paddle-mlops/blob/main/docs/provenance.md#pipeline-v1"
BUILDER = "paddle-mlops promote"
SIGNING_DIR = "signing"
BUNDLE_SIG, PROVENANCE, SBOM = "bundle.sig", "provenance.dsse.json", "sbom.cdx.json"
SIGNED_BY_TAG = "signed_by"
# lineage tag -> where the statement records it (what verify compares)
LINEAGE_CHECKS = {
    "git_sha": ("git", "gitCommit"),
    "data_sha256": ("data", "sha256"),
    SNAPSHOT_TAG: ("data-snapshot", "sha256"),
    "params_sha256": ("params", "sha256"),
}


def artifact_dir(version: int) -> str:
    return f"{SIGNING_DIR}/v{version}"


def statement(
    name: str,
    version: int,
    tags: dict[str, str],
    run_tags: dict[str, str],
    run_id: str,
    image: str | None = None,
    sbom: Path | None = None,
) -> dict[str, Any]:
    """The in-toto statement (SLSA v1 provenance) of ``name`` v``version``; ``image`` is
    ``repository@sha256:...`` once pushed; ``sbom`` (the image's CycloneDX file) is named
    among the byproducts."""
    subject = [{"name": f"models:/{name}/{version}", "digest": {"sha256": tags[BUNDLE_TAG]}}]
    if image:
        repository, digest = image.split("@", 1)
        subject.append({"name": repository, "digest": {"sha256": digest.split(":", 1)[1]}})

    def dep(name: str, uri: str, field: str, value: str) -> dict[str, Any]:
        return {"name": name, "uri": uri, "digest": {field: value}}

    deps = [
        dep("git", "git+paddle-mlops", "gitCommit", tags.get("git_sha", "")),
        dep("data", "ingest:input_sha256", "sha256", tags.get("data_sha256", "")),
        dep("data-snapshot", "ingest:snapshot.json", "sha256", tags.get(SNAPSHOT_TAG, "")),
        dep("params", "params.yaml", "sha256", tags.get("params_sha256", "")),
    ]
    component = tags.get("component_image") or run_tags.get("component_image") or ""
    if component:
        ref, _, digest = component.partition("@")
        algorithm, _, value = digest.partition(":")
        deps.append(dep("component-image", ref, algorithm or "id", value or "unknown"))
    pipeline_run = run_tags.get(PIPELINE_RUN_TAG) or ""
    return {
        "_type": STATEMENT,
        "subject": subject,
        "predicateType": SLSA,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "task": tags.get("task", ""),
                    "params_sha256": tags.get("params_sha256", ""),
                    "pipeline_run": pipeline_run,
                },
                "internalParameters": {
                    "mlflow_run_id": run_id,
                    "serving_image": tags.get("serving_image", ""),
                    "component_image": component or "none (the steps ran outside an image)",
                },
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": BUILDER},
                "metadata": {
                    "invocationId": pipeline_run or run_id,
                    "finishedOn": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                },
                "byproducts": [
                    {
                        "name": SBOM,
                        "mediaType": "application/vnd.cyclonedx+json",
                        "digest": {"sha256": sha256_file(sbom)},
                    }
                ]
                if sbom
                else [],
            },
        },
    }


def sign_version(
    client: Any,
    uri: str,
    name: str,
    version: int,
    key: SigningKey,
    image: str | None = None,
    sbom: Path | None = None,
) -> dict[str, Any]:
    """Sign ``name`` v``version``'s bundle and provenance (``sbom`` kept beside them and named
    in it); returns the signed envelope."""
    mv = client.get_model_version(name, str(version))
    tags = dict(mv.tags or {})
    if not tags.get(BUNDLE_TAG):
        raise StepError(f"{name} v{version}: no {BUNDLE_TAG} tag: nothing to sign")
    run_tags = dict(client.get_run(mv.run_id).data.tags) if mv.run_id else {}
    with tempfile.TemporaryDirectory(prefix="paddle-mlops-sign-") as tmp:
        bundle = download_version(client, uri, name, version, Path(tmp) / "model")
        out = Path(tmp) / "signing"
        sign_bundle(key, bundle, out / BUNDLE_SIG)
        body = statement(name, version, tags, run_tags, mv.run_id, image, sbom)
        envelope = sign_statement(key, body)
        write_json(out / PROVENANCE, envelope)
        for path in (out / BUNDLE_SIG, out / PROVENANCE, *([sbom] if sbom else [])):
            client.log_artifact(mv.run_id, str(path), artifact_dir(version))
    client.set_model_version_tag(name, str(version), SIGNED_BY_TAG, key.keyid)
    log.info("%s v%d: bundle and provenance signed (key %s)", name, version, key.keyid[:12])
    return envelope


def download_files(client: Any, uri: str, name: str, version: int, dest: Path) -> Path:
    """``signing/vN/`` of the version's run into ``dest`` (empty when never signed)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    mv = client.get_model_version(name, str(version))
    dest.mkdir(parents=True, exist_ok=True)
    try:
        got = mlflow.artifacts.download_artifacts(
            artifact_uri=f"runs:/{mv.run_id}/{artifact_dir(version)}",
            dst_path=str(dest),
            tracking_uri=uri,
        )
    except (MlflowException, OSError):
        return dest  # no signing directory: unsigned
    return Path(got)


def open_provenance(
    keys: list[TrustedKey], files: Path, name: str, version: int, bundle_sha: str
) -> tuple[dict[str, Any], TrustedKey]:
    """The statement in ``files``, signed by a trusted key and naming ``models:/name/version``
    with ``bundle_sha`` (else refused), and the key that signed it."""
    what = f"models:/{name}/{version}"
    if not (files / PROVENANCE).is_file():
        raise VerificationError(f"{what}: no signed provenance statement: refusing it")
    body, attester = open_statement(read_json(files / PROVENANCE), keys, f"{what} provenance")
    named = subject_digests(body).get(what)
    if named != bundle_sha:
        raise VerificationError(
            f"{what}: the signed provenance names bundle {str(named)[:12]} for this "
            f"version, not {bundle_sha[:12]}: refusing it"
        )
    return body, attester


def subject_digests(body: dict[str, Any]) -> dict[str, str]:
    """A statement's subjects: name -> sha256."""
    return {s.get("name"): s.get("digest", {}).get("sha256") for s in body.get("subject", [])}


def verified_provenance(
    keys: list[TrustedKey], files: Path, name: str, version: int, tags: dict[str, str]
) -> tuple[dict[str, Any], TrustedKey]:
    """The statement in ``files`` (:func:`open_provenance`: trusted, naming this version with
    its ``bundle_sha256`` tag) when it also agrees with the version's lineage ``tags``
    (:data:`LINEAGE_CHECKS`), and the key that signed it; else VerificationError."""
    body, attester = open_provenance(keys, files, name, version, tags.get(BUNDLE_TAG, ""))
    mismatches = lineage_mismatches(body, tags)
    if mismatches:
        raise VerificationError(
            f"models:/{name}/{version}: the signed provenance disagrees with the version's "
            f"lineage tags ({'; '.join(mismatches)}): refusing it"
        )
    return body, attester


def verify_files(
    keys: list[TrustedKey], bundle: Path, files: Path, name: str, version: int, tags: dict[str, str]
) -> str:
    """Refuse ``bundle`` unless ``files`` hold a trusted signature of exactly its bytes and a
    trusted statement naming it ``models:/name/version`` with the ``bundle_sha256`` of
    ``tags`` and agreeing with their lineage (:func:`verified_provenance`); returns the id of
    the key that signed the bundle."""
    signer = verify_bundle(keys, bundle, files / BUNDLE_SIG, f"models:/{name}/{version}")
    verified_provenance(keys, files, name, version, tags)
    return signer.keyid


def lineage_mismatches(body: dict[str, Any], tags: dict[str, str]) -> list[str]:
    """Where the statement and the version's lineage tags disagree (commit, data, params)."""
    deps = {
        d.get("name"): d.get("digest", {})
        for d in body.get("predicate", {})
        .get("buildDefinition", {})
        .get("resolvedDependencies", [])
    }
    out = []
    for tag, (dep, field) in LINEAGE_CHECKS.items():
        stated, tagged = deps.get(dep, {}).get(field, ""), tags.get(tag, "")
        if stated != tagged:
            out.append(f"{tag}: statement {stated[:12] or 'none'} vs tag {tagged[:12] or 'none'}")
    return out
