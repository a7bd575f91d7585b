"""Who made a model: keys, bundle signatures (OpenSSF model-signing), signed statements (DSSE).

Trust model (README "Provenance"): ``promote`` holds the only private key and signs what it
releases; ``fetch-model``, ``deploy`` and ``paddle-mlops verify`` hold public keys and refuse
what no trusted key signed. Keys come from files (a Kubernetes Secret / ConfigMap mounted as
one), named by the environment, never by ``params.yaml`` or argv:

- ``PADDLE_MLOPS_SIGNING_KEY``: the PEM private key (ECDSA P-256, PKCS#8, optionally
  encrypted; then ``PADDLE_MLOPS_SIGNING_KEY_PASSWORD_FILE`` holds its password);
- ``PADDLE_MLOPS_TRUSTED_KEYS``: a PEM public key file, a directory of them (``*.pub``,
  ``*.pem``: several during a rotation), or the PEM text itself (a ConfigMap key as an
  environment variable: how a KServe storage initializer, which cannot mount volumes, gets
  it). The value ``insecure-accept-anything`` turns verification off, explicitly; unset,
  every verification refuses (nothing is trusted).

``paddle-mlops keys generate DIR`` (:mod:`components.commands.keys`) writes a key pair
(docs/provenance.md: creation, rotation).

A bundle's signature is an OpenSSF model-signing signature (a DSSE envelope over an in-toto
statement of every file's sha256) made with ``model_signing`` and verified with it. Other
statements (SLSA provenance) are DSSE envelopes signed with the same key.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError, write_text

log = logging.getLogger(__name__)

KEY_ENV = "PADDLE_MLOPS_SIGNING_KEY"
PASSWORD_ENV = "PADDLE_MLOPS_SIGNING_KEY_PASSWORD_FILE"
TRUST_ENV = "PADDLE_MLOPS_TRUSTED_KEYS"
ACCEPT_ANYTHING = "insecure-accept-anything"
IN_TOTO = "application/vnd.in-toto+json"


class VerificationError(StepError):
    """A signature is missing, was made by an untrusted key, or does not match the bytes."""


@dataclass(frozen=True)
class SigningKey:
    path: Path
    password: bytes | None

    @functools.cached_property
    def private(self) -> Any:
        """The key, read and checked once (cryptography's EllipticCurvePrivateKey)."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        try:
            key = serialization.load_pem_private_key(self.path.read_bytes(), self.password)
        except (ValueError, TypeError, OSError) as exc:
            raise StepError(f"{KEY_ENV}={self.path}: not a usable PEM private key: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
            raise StepError(f"{KEY_ENV}={self.path}: must be an ECDSA P-256 key")
        return key

    def load(self) -> Any:
        return self.private

    @property
    def keyid(self) -> str:
        return key_id(self.private.public_key())


@dataclass(frozen=True)
class TrustedKey:
    path: str  # where it came from (a file, or the environment variable)
    key: Any  # cryptography's EllipticCurvePublicKey
    pem: bytes

    @property
    def keyid(self) -> str:
        return key_id(self.key)


def key_id(public_key: Any) -> str:
    """sha256 of the public key's DER (SubjectPublicKeyInfo): how statements name a key."""
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def signing_key() -> SigningKey | None:
    """The private key the environment names, or None (nothing is signed)."""
    path = os.environ.get(KEY_ENV, "").strip()
    if not path:
        return None
    key = Path(path)
    if not key.is_file():
        raise StepError(f"{KEY_ENV}={path}: no such file (mount the signing Secret there)")
    password = None
    if pw_file := os.environ.get(PASSWORD_ENV, "").strip():
        try:
            password = Path(pw_file).read_bytes().rstrip(b"\n")
        except OSError as exc:
            raise StepError(f"{PASSWORD_ENV}={pw_file}: {exc.strerror}") from None
    return SigningKey(key, password)


def trusted_keys() -> list[TrustedKey] | None:
    """The public keys the environment trusts; None means verification is off
    (``PADDLE_MLOPS_TRUSTED_KEYS=insecure-accept-anything``). Unset or empty: refused."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    where = os.environ.get(TRUST_ENV, "").strip()
    if where == ACCEPT_ANYTHING:
        return None
    if not where:
        raise VerificationError(
            f"no trusted keys: set {TRUST_ENV} to a public key or a directory of them "
            f"(or to {ACCEPT_ANYTHING} to serve models of unverified origin)"
        )
    if where.startswith("-----BEGIN"):
        blocks = [
            ("-----BEGIN" + part).encode() for part in where.split("-----BEGIN")[1:] if part.strip()
        ]
        sources = [(f"${TRUST_ENV}[{i}]", pem) for i, pem in enumerate(blocks)]
    else:
        root = Path(where)
        if not root.exists():
            raise VerificationError(f"{TRUST_ENV}={where}: no such file or directory")
        files = (
            sorted(p for p in root.iterdir() if p.suffix in (".pub", ".pem") and p.is_file())
            if root.is_dir()
            else [root]
        )
        sources = [(str(p), p.read_bytes()) for p in files]
    keys = []
    for label, pem in sources:
        try:
            key = serialization.load_pem_public_key(pem)
        except ValueError as exc:
            raise VerificationError(
                f"{TRUST_ENV}: {label} is not a PEM public key: {exc}"
            ) from None
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise VerificationError(f"{TRUST_ENV}: {label} is not an ECDSA public key")
        keys.append(TrustedKey(label, key, pem))
    if not keys:
        raise VerificationError(f"{TRUST_ENV}={where[:60]}: no public key there (*.pub, *.pem)")
    return keys


def generate(directory: str | Path, name: str = "signing") -> tuple[Path, Path]:
    """A new ECDSA P-256 key pair: ``NAME.key`` (PKCS#8 PEM, mode 0600) and ``NAME.pub``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / f"{name}.key", directory / f"{name}.pub"
    if private.exists():
        raise StepError(f"{private}: exists; rotate by generating under another name")
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    write_text(
        public,
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode(),
    )
    return private, public


# --------------------------------------------------------------------------- raw signatures


def sign_bytes(key: SigningKey, data: bytes) -> str:
    """base64 of an ECDSA-SHA256 (DER) signature of ``data``."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    return base64.b64encode(key.load().sign(data, ec.ECDSA(hashes.SHA256()))).decode()


def verify_bytes(keys: Sequence[TrustedKey], data: bytes, signature_b64: str) -> TrustedKey | None:
    """The trusted key whose signature ``signature_b64`` of ``data`` is, or None."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except (ValueError, TypeError):
        return None
    for trusted in keys:
        try:
            trusted.key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
            return trusted
        except InvalidSignature:
            continue
    return None


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def sign_statement(key: SigningKey, statement: dict[str, Any]) -> dict[str, Any]:
    """A DSSE envelope of the in-toto ``statement`` signed with ``key``."""
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    return {
        "payloadType": IN_TOTO,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": key.keyid, "sig": sign_bytes(key, pae(IN_TOTO, payload))}],
    }


def open_statement(
    envelope: dict[str, Any], keys: Sequence[TrustedKey], what: str
) -> tuple[dict[str, Any], TrustedKey]:
    """The statement inside a DSSE ``envelope`` signed by one of ``keys`` (else refused)."""
    try:
        payload = base64.b64decode(envelope["payload"], validate=True)
        kind = str(envelope["payloadType"])
        signatures = list(envelope["signatures"])
    except (KeyError, TypeError, ValueError) as exc:
        raise VerificationError(f"{what}: not a DSSE envelope ({exc})") from None
    for entry in signatures:
        trusted = verify_bytes(keys, pae(kind, payload), str(entry.get("sig", "")))
        if trusted is not None:
            return json.loads(payload), trusted
    raise VerificationError(f"{what}: no signature by a trusted key ({TRUST_ENV})")


# --------------------------------------------------------------------------- bundles


def _hashing() -> Any:
    from model_signing import hashing

    return hashing.Config().set_ignored_paths(paths=[], ignore_git_paths=False)


def sign_bundle(key: SigningKey, bundle: Path, signature: Path) -> None:
    """Sign every file of ``bundle`` (OpenSSF model-signing, key-based) into ``signature``."""
    from model_signing import signing

    signature.parent.mkdir(parents=True, exist_ok=True)
    password = key.password.decode() if key.password else None
    (
        signing.Config()
        .use_elliptic_key_signer(private_key=key.path, password=password)
        .set_hashing_config(_hashing())
        .sign(bundle, signature)
    )


def verify_bundle(
    keys: Sequence[TrustedKey], bundle: Path, signature: Path, what: str
) -> TrustedKey:
    """The trusted key that signed exactly ``bundle``'s files; refused otherwise."""
    from model_signing import verifying

    if not signature.is_file():
        raise VerificationError(f"{what}: no bundle signature: refusing it")
    reasons = []
    for trusted in keys:
        try:
            with private_copy(trusted.pem, "trusted.pub") as public_key:
                (
                    verifying.Config()
                    .use_elliptic_key_verifier(public_key=public_key)
                    .set_hashing_config(_hashing())
                    .verify(bundle, signature)
                )
            return trusted
        except Exception as exc:  # noqa: BLE001 - model_signing raises ValueError and others
            text = str(exc).strip()
            reasons.append(text.splitlines()[0][:200] if text else repr(exc))
    raise VerificationError(
        f"{what}: the bundle signature does not verify with any trusted key "
        f"({'; '.join(dict.fromkeys(reasons))})"
    )


@contextmanager
def private_copy(data: bytes, name: str) -> Iterator[Path]:
    """``data`` in a file only this process can read, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="paddle-mlops-key-") as tmp:
        path = Path(tmp) / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        yield path
