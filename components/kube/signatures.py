"""Image signatures, attestations and SBOMs next to the image in its OCI registry.

Signatures are cosign-compatible sigstore signatures, the layout ``cosign sign --key``,
podman's ``--sign-by-sigstore-private-key`` and containers/image's ``sigstoreSigned`` policy
read: a "simple signing" payload naming the image's repository and manifest digest, signed
with ECDSA P-256 (SHA-256), stored as a layer of the OCI manifest tagged
``sha256-<hex>.sig`` in the image's own repository (the signature in the layer annotation
``dev.cosignproject.cosign/signature``). So sigstore policy-controller, Kyverno
``verifyImages`` and ``cosign verify --key`` verify what ``promote`` signs, offline.

Why written here rather than by ``podman push --sign-by-sigstore-private-key``: Debian's
podman 4.3 and skopeo 1.9 are built with sigstore disabled ("Debian-local change: sigstore
disabled"), for signing and for ``sigstoreSigned`` verification alike (measured,
docs/provenance.md). ``deploy`` therefore verifies with :func:`verify_image` before it pulls
by digest, and writes the equivalent ``policy.json`` for hosts whose podman enforces it.

Attestations (``.att``: a DSSE envelope per layer) and SBOMs (``.sbom``) use the same
``sha256-<hex>.<suffix>`` tags, as cosign's ``attest`` and ``attach sbom`` do.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError
from components.kube.images import image_repository
from components.tracking.signing import (
    SigningKey,
    TrustedKey,
    VerificationError,
    sign_bytes,
    verify_bytes,
)

log = logging.getLogger(__name__)

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
# which earlier layer of an attachment a new one replaces (cosign ignores unknown annotations)
SLOT_ANNOTATION = "org.paddle-mlops.slot"
DSSE = "application/vnd.dsse.envelope.v1+json"
CYCLONEDX = "application/vnd.cyclonedx+json"
SIGNATURE_TYPE = "cosign container image signature"
ACCEPT = ",".join(
    (
        OCI_MANIFEST,
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    )
)


def split_reference(ref: str) -> tuple[str, str]:
    """``host:5000/a/b@sha256:..`` -> (``host:5000``, ``a/b``); a tag is dropped."""
    host, _, path = image_repository(ref).partition("/")
    if not path or ("." not in host and ":" not in host and host != "localhost"):
        raise StepError(f"{ref}: an image reference must name its registry host (host/path)")
    return host, path


def _insecure_hosts() -> set[str]:
    """Registries ``registries.conf`` (``CONTAINERS_REGISTRIES_CONF`` else /etc) marks
    insecure: reached over plain HTTP, as podman reaches them."""
    conf = Path(os.environ.get("CONTAINERS_REGISTRIES_CONF") or "/etc/containers/registries.conf")
    try:
        spec = tomllib.loads(conf.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return set()
    return {
        str(r.get("location") or r.get("prefix") or "")
        for r in spec.get("registry", [])
        if r.get("insecure")
    }


def _credentials(host: str) -> str | None:
    """``user:password`` base64 for ``host`` from the auth file podman and docker write."""
    candidates = [os.environ.get("REGISTRY_AUTH_FILE", "")]
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        candidates.append(f"{runtime}/containers/auth.json")
    candidates += [f"/run/containers/{os.getuid()}/auth.json", "~/.docker/config.json"]
    for candidate in filter(None, candidates):
        path = Path(candidate).expanduser()
        try:
            auths = json.loads(path.read_text()).get("auths", {})
        except (OSError, ValueError):
            continue
        if entry := auths.get(host):
            return str(entry.get("auth") or "") or None
    return None


class Registry:
    """The few OCI distribution API calls signatures need (anonymous, basic or bearer)."""

    def __init__(self, host: str, timeout: float = 60.0):
        self.host = host
        scheme = "http" if host in _insecure_hosts() else "https"
        self.base = f"{scheme}://{host}"
        self.timeout = timeout
        self._auth: str | None = None

    def _request(
        self,
        method: str,
        url: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes, Any]:
        url = url if url.startswith("http") else self.base + url
        for attempt in range(2):
            request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
            if self._auth:
                request.add_header("Authorization", self._auth)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return response.status, response.read(), response.headers
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and attempt == 0 and self._login(exc.headers):
                    continue
                if exc.code in (401, 403):
                    raise StepError(
                        f"registry {self.host}: {method} {urllib.parse.urlsplit(url).path}: "
                        f"HTTP {exc.code}: {self._credential_hint()}"
                    ) from None
                return exc.code, exc.read(), exc.headers
            except (urllib.error.URLError, OSError) as exc:
                raise StepError(f"registry {self.host}: {method} {url} failed ({exc})") from None
        raise AssertionError("unreachable")

    def _credential_hint(self) -> str:
        if _credentials(self.host) is None:
            return (
                "no credentials for it (podman login it, or point REGISTRY_AUTH_FILE at an "
                "auth file that has them)"
            )
        return "the credentials in the auth file were refused"

    def _login(self, headers: Any) -> bool:
        challenge = str(headers.get("WWW-Authenticate", ""))
        basic = _credentials(self.host)
        if challenge.lower().startswith("basic") and basic:
            self._auth = f"Basic {basic}"
            return True
        if not challenge.lower().startswith("bearer"):
            return False
        # realm="...",service="...",scope="repository:a/b:pull,push" (a scope has commas)
        fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        query = urllib.parse.urlencode({k: v for k, v in fields.items() if k != "realm"})
        request = urllib.request.Request(f"{fields.get('realm', '')}?{query}")
        if basic:
            request.add_header("Authorization", f"Basic {basic}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            hint = self._credential_hint() if exc.code in (401, 403) else ""
            raise StepError(
                f"registry {self.host}: token request to {fields.get('realm')} refused: "
                f"HTTP {exc.code}{': ' + hint if hint else ''}"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise StepError(f"registry {self.host}: token request failed ({exc})") from None
        self._auth = f"Bearer {body.get('token') or body.get('access_token')}"
        return True

    def manifest(self, repository: str, reference: str) -> tuple[bytes, str] | None:
        status, body, headers = self._request(
            "GET", f"/v2/{repository}/manifests/{reference}", headers={"Accept": ACCEPT}
        )
        if status == 404:
            return None
        if status != 200:
            raise StepError(
                f"registry {self.host}: manifest {repository}:{reference}: HTTP {status}"
            )
        return body, str(headers.get("Content-Type", ""))

    def blob(self, repository: str, digest: str) -> bytes:
        status, body, _ = self._request("GET", f"/v2/{repository}/blobs/{digest}")
        if status != 200:
            raise StepError(f"registry {self.host}: blob {repository}@{digest}: HTTP {status}")
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise VerificationError(
                f"registry {self.host}: blob {digest} does not match its digest"
            )
        return body

    def put_blob(self, repository: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        status, _, _ = self._request("HEAD", f"/v2/{repository}/blobs/{digest}")
        if status == 200:
            return digest
        status, body, headers = self._request("POST", f"/v2/{repository}/blobs/uploads/")
        if status != 202:
            raise StepError(
                f"registry {self.host}: blob upload refused: HTTP {status} {body[:200]!r}"
            )
        location = str(headers["Location"])
        location = location if location.startswith("http") else self.base + location
        separator = "&" if "?" in location else "?"
        status, body, _ = self._request(
            "PUT",
            f"{location}{separator}digest={digest}",
            data,
            {"Content-Type": "application/octet-stream"},
        )
        if status != 201:
            raise StepError(
                f"registry {self.host}: blob upload failed: HTTP {status} {body[:200]!r}"
            )
        return digest

    def put_manifest(self, repository: str, tag: str, manifest: bytes, media_type: str) -> None:
        status, body, _ = self._request(
            "PUT", f"/v2/{repository}/manifests/{tag}", manifest, {"Content-Type": media_type}
        )
        if status not in (200, 201):
            raise StepError(
                f"registry {self.host}: manifest {repository}:{tag}: HTTP {status} {body[:300]!r}"
            )


def attachment_tag(digest: str, suffix: str) -> str:
    return f"{digest.replace(':', '-')}.{suffix}"


def _layers(registry: Registry, repository: str, tag: str) -> list[dict[str, Any]]:
    found = registry.manifest(repository, tag)
    return list(json.loads(found[0]).get("layers", [])) if found else []


def attach(
    ref: str,
    digest: str,
    suffix: str,
    data: bytes,
    media_type: str,
    annotations: dict[str, str] | None = None,
    slot: str = "",
) -> str:
    """Add ``data`` as a layer of the ``sha256-<hex>.<suffix>`` manifest of the image
    ``ref``@``digest``; returns the attachment's tag. Other layers are kept (several
    signatures during a key rotation) except an equal one and one of the same ``slot`` (the
    same key's earlier signature, statement or SBOM of this digest: a re-promotion replaces
    it, so attachments do not grow by a layer per run)."""
    host, repository = split_reference(ref)
    registry = Registry(host)
    tag = attachment_tag(digest, suffix)
    layer_digest = registry.put_blob(repository, data)
    annotations = {**(annotations or {}), **({SLOT_ANNOTATION: slot} if slot else {})}
    layers = [
        layer
        for layer in _layers(registry, repository, tag)
        if (layer.get("annotations", {}) != annotations or layer["digest"] != layer_digest)
        and not (slot and layer.get("annotations", {}).get(SLOT_ANNOTATION) == slot)
    ]
    layers.append(
        {
            "mediaType": media_type,
            "size": len(data),
            "digest": layer_digest,
            **({"annotations": annotations} if annotations else {}),
        }
    )
    config = json.dumps(
        {
            "architecture": "",
            "os": "",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
        },
        sort_keys=True,
    ).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": OCI_CONFIG,
            "size": len(config),
            "digest": registry.put_blob(repository, config),
        },
        "layers": layers,
    }
    registry.put_manifest(repository, tag, json.dumps(manifest).encode(), OCI_MANIFEST)
    return tag


def signature_payload(ref: str, digest: str) -> bytes:
    host, repository = split_reference(ref)
    return json.dumps(
        {
            "critical": {
                "identity": {"docker-reference": f"{host}/{repository}"},
                "image": {"docker-manifest-digest": digest},
                "type": SIGNATURE_TYPE,
            },
            "optional": None,
        },
        separators=(",", ":"),
    ).encode()


def sign_image(ref: str, digest: str, key: SigningKey) -> str:
    """Sign ``ref``@``digest`` (its repository and manifest digest) with ``key``."""
    payload = signature_payload(ref, digest)
    return attach(
        ref,
        digest,
        "sig",
        payload,
        SIMPLE_SIGNING,
        {SIGNATURE_ANNOTATION: sign_bytes(key, payload)},
        slot=key.keyid,
    )


@dataclass(frozen=True)
class ImageVerified:
    image: str  # repository@digest
    keyid: str
    key_path: str


def verify_image(ref: str, digest: str, keys: Sequence[TrustedKey]) -> ImageVerified:
    """Refuse ``ref``@``digest`` unless a trusted key signed exactly that repository and
    digest (containers/image ``sigstoreSigned`` with ``signedIdentity: matchRepository``)."""
    host, repository = split_reference(ref)
    image = f"{host}/{repository}@{digest}"
    registry = Registry(host)
    if registry.manifest(repository, digest) is None:
        raise VerificationError(f"{image}: not in the registry")
    layers = [
        layer
        for layer in _layers(registry, repository, attachment_tag(digest, "sig"))
        if layer.get("mediaType") == SIMPLE_SIGNING
    ]
    if not layers:
        raise VerificationError(f"{image}: no signature in the registry: refusing the image")
    problems = []
    for layer in layers:
        payload = registry.blob(repository, layer["digest"])
        trusted = verify_bytes(
            keys, payload, str(layer.get("annotations", {}).get(SIGNATURE_ANNOTATION, ""))
        )
        if trusted is None:
            problems.append("signed by an untrusted key")
            continue
        try:
            critical = json.loads(payload)["critical"]
            signed_digest = critical["image"]["docker-manifest-digest"]
            identity = critical["identity"]["docker-reference"]
        except (ValueError, KeyError, TypeError):
            problems.append("a signature payload that is not simple signing")
            continue
        if signed_digest != digest:
            problems.append(f"signed for another digest ({signed_digest[:19]})")
        elif split_reference(identity) != (host, repository):
            problems.append(f"signed for another repository ({identity})")
        else:
            return ImageVerified(image, trusted.keyid, str(trusted.path))
    raise VerificationError(f"{image}: refused: {'; '.join(dict.fromkeys(problems))}")


def attach_attestation(
    ref: str, digest: str, envelope: dict[str, Any], predicate_type: str, slot: str
) -> str:
    """Attach the signed DSSE ``envelope`` as cosign does (``cosign verify-attestation``
    reads it): the signature is inside the envelope, the layer's signature annotation is
    empty."""
    annotations = {"predicateType": predicate_type, SIGNATURE_ANNOTATION: ""}
    data = json.dumps(envelope).encode()
    return attach(ref, digest, "att", data, DSSE, annotations, slot=slot)


def attestations(ref: str, digest: str) -> list[dict[str, Any]]:
    """The DSSE envelopes attached to ``ref``@``digest`` (unverified)."""
    host, repository = split_reference(ref)
    registry = Registry(host)
    return [
        json.loads(registry.blob(repository, layer["digest"]))
        for layer in _layers(registry, repository, attachment_tag(digest, "att"))
        if layer.get("mediaType") == DSSE
    ]


def policy_json(ref: str, key_path: Path) -> dict[str, Any]:
    """A containers-policy.json that admits the serving repository only with a signature
    of the key at ``key_path`` (containers/image 5.23 takes one ``keyPath``), rejects other
    registry images, and lets local storage through."""
    host, repository = split_reference(ref)
    return {
        "default": [{"type": "reject"}],
        "transports": {
            "docker": {
                f"{host}/{repository}": [
                    {
                        "type": "sigstoreSigned",
                        "keyPath": str(key_path),
                        "signedIdentity": {"type": "matchRepository"},
                    }
                ]
            },
            "containers-storage": {"": [{"type": "insecureAcceptAnything"}]},
        },
    }


def registries_d(ref: str) -> dict[str, Any]:
    """The ``registries.d`` entry that makes containers/image look for the signatures of
    ``ref``'s registry where they are stored (the ``sha256-<hex>.sig`` tags)."""
    host, _ = split_reference(ref)
    return {"docker": {host: {"use-sigstore-attachments": True}}}
