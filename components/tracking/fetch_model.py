"""fetch-model: a registered version's serving bundle into a model directory, verified.

``paddle-mlops fetch-model MODEL_URI DEST`` where ``MODEL_URI`` is ``models:/NAME/VERSION`` or
``models:/NAME@ALIAS``. It resolves the URI to one version, downloads that version's MLflow
model from the registry, takes the serving bundle inside it, and checks its sha256 against the
``bundle_sha256`` tag recorded at registration, then its origin: the bundle's model-signing
signature and the signed provenance naming this version must verify against the keys
``PADDLE_MLOPS_TRUSTED_KEYS`` names (``components.tracking.signing``; unset: refused), and the
provenance must agree with the version's lineage tags (a tag rewritten after signing is
refused): the check ``verify`` and ``deploy`` make,
``components.tracking.provenance.verified_provenance``. Only a verified bundle lands in
``DEST``:

- ``DEST`` absent: the bundle is renamed into place in one step;
- ``DEST`` an empty directory (an ``emptyDir`` mount of an init container, KServe's
  ``/mnt/models``): the files are moved in, then ``.fetched.json`` is written last;
- ``DEST`` already holding this exact version (its ``.fetched.json`` and hash agree, and the
  provenance still agrees with the tags): nothing to do; holding anything else: refused.

The argument order is the one KServe gives a storage initializer (``SRC DEST``), so the same
command is the init container of ``k8s/serving/deployment.yaml`` and the
``ClusterStorageContainer`` of ``k8s/kserve/``. Credentials come from
``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (never from arguments). The
tracking URI, a store that must exist and bounded retries: ``components.commands.connection``
(the command line: ``components.commands.fetch_model``).
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError, combined_sha256, read_json, sha256_tree, write_json
from components.core.failures import readable_failure
from components.core.uris import redact_uri
from components.tracking.model import BUNDLE_TAG
from components.tracking.provenance import download_files, verified_provenance, verify_files
from components.tracking.registry import client as mlflow_client
from components.tracking.registry import download_version, tracking_uri
from components.tracking.signing import ACCEPT_ANYTHING, TRUST_ENV, trusted_keys

log = logging.getLogger(__name__)

MARKER = ".fetched.json"
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[A-Za-z0-9_-]+))$")


@dataclass(frozen=True)
class ModelRef:
    name: str
    version: int | None = None
    alias: str | None = None

    def __str__(self) -> str:
        return f"models:/{self.name}" + (
            f"/{self.version}" if self.version is not None else f"@{self.alias}"
        )


@dataclass(frozen=True)
class Fetched:
    name: str
    version: int
    sha256: str
    dest: Path
    fetched: bool  # False: DEST already held this version
    signed_by: str = ""  # the trusted key's id; empty: verification off (insecure-accept-anything)


def parse_model_uri(uri: str) -> ModelRef:
    match = _URI.match(uri.strip())
    if match is None:
        raise StepError(
            f"model URI '{uri}': expected models:/NAME/VERSION or models:/NAME@ALIAS "
            "(e.g. models:/digits-classifier/3, models:/digits-classifier@champion)"
        )
    version = match["version"]
    return ModelRef(match["name"], int(version) if version else None, match["alias"])


def resolve(client: Any, ref: ModelRef) -> Any:
    """The model version ``ref`` names (an alias is resolved now, once)."""
    from mlflow.exceptions import MlflowException

    try:
        if ref.alias is not None:
            return client.get_model_version_by_alias(ref.name, ref.alias)
        return client.get_model_version(ref.name, str(ref.version))
    except MlflowException as exc:
        if readable_failure(exc) is not None:
            raise  # the server did not answer: not an answer about the registry
        raise StepError(f"{ref}: not in the registry ({_reason(exc)})") from exc


def _reason(exc: Exception) -> str:
    code = getattr(exc, "error_code", "") or ""
    first = str(exc).strip().splitlines()
    return f"{code}: {first[0] if first else ''}"[:300]


def _place(bundle: Path, dest: Path) -> None:
    """Move the verified ``bundle`` to ``dest`` (absent, or an empty directory)."""
    if not dest.exists():
        bundle.rename(dest)
        return
    for entry in sorted(bundle.iterdir(), key=lambda p: p.name == MARKER):  # marker last
        shutil.move(str(entry), str(dest / entry.name))


def fetch(
    uri: str, dest: str | Path, *, tracking: str | None = None, client: Any = None
) -> Fetched:
    """Download the serving bundle of ``uri`` into ``dest`` and verify it (module docstring).
    ``client``: an ``MlflowClient`` on ``tracking`` (default: a new one)."""

    dest = Path(dest)
    ref = parse_model_uri(uri)
    keys = trusted_keys()  # refused before anything is downloaded when nothing is trusted
    tracking = tracking or tracking_uri()
    client = client or mlflow_client(tracking)
    mv = resolve(client, ref)
    name, version = ref.name, int(mv.version)
    tags = dict(mv.tags or {})
    expected = tags.get(BUNDLE_TAG)
    if not expected:
        raise StepError(
            f"{ref} (v{version}) has no tag {BUNDLE_TAG}: it was not registered by the "
            "pipeline, so its files cannot be verified; refusing to serve it"
        )
    if dest.exists() and not dest.is_dir():
        raise StepError(f"{dest}: exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()):
        marker = dest / MARKER
        held = read_json(marker) if marker.is_file() else {}
        trusted_copy = keys is None or held.get("signed_by") in {k.keyid for k in keys}
        if held.get("name") == name and held.get("version") == version and trusted_copy:
            files = {k: v for k, v in sha256_tree(dest).items() if k != MARKER}
            if combined_sha256(files) == expected:
                if keys is not None:  # the tags may have changed since it was fetched
                    with tempfile.TemporaryDirectory(prefix="paddle-mlops-fetch-") as tmp:
                        signing = download_files(client, tracking, name, version, Path(tmp))
                        verified_provenance(keys, signing, name, version, tags)
                log.info("%s: %s already holds v%d (verified)", ref, dest, version)
                return Fetched(name, version, expected, dest, False, str(held.get("signed_by", "")))
        raise StepError(
            f"{dest}: not empty and not a verified copy of {name} v{version}; fetch into an "
            "empty or absent directory"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    # downloaded on DEST's filesystem (an emptyDir mount: inside it), so placing is a rename
    scratch = dest if dest.is_dir() else dest.parent
    with tempfile.TemporaryDirectory(dir=scratch, prefix=f".{dest.name}.fetch-") as tmp:
        from mlflow.exceptions import MlflowException

        log.info("downloading %s (v%d) from %s", ref, version, redact_uri(tracking))
        try:  # verified against the version's tag by download_version
            bundle = download_version(client, tracking, name, version, Path(tmp))
        except (MlflowException, OSError) as exc:
            raise StepError(f"{ref} (v{version}): download failed ({_reason(exc)})") from exc
        except StepError as exc:
            raise StepError(f"{ref}: {exc}; refusing to serve it") from exc
        signed_by = ""
        if keys is None:
            log.warning(
                "%s=%s: %s v%d of unverified origin", TRUST_ENV, ACCEPT_ANYTHING, name, version
            )
        else:  # the bytes signed by a trusted key, and the signed statement naming this version
            files = download_files(client, tracking, name, version, Path(tmp) / ".signing")
            signed_by = verify_files(keys, bundle, files, name, version, tags)
        write_json(
            bundle / MARKER,
            {"name": name, "version": version, "sha256": expected, "uri": uri}
            | {"signed_by": signed_by},
        )
        _place(bundle, dest)
    log.info(
        "%s v%d -> %s (sha256 %s verified%s)", name, version, dest, expected[:12],
        f", signed by key {signed_by[:12]}" if signed_by else "",
    )  # fmt: skip
    return Fetched(name, version, expected, dest, True, signed_by)
