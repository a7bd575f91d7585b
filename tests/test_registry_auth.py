"""Signing and verifying images in registries that ask for credentials (issue 30's registry
client beyond an anonymous registry).

Two real setups of Debian's docker-registry on 127.0.0.1:
- ``htpasswd``: HTTP basic auth (what a private registry, ECR with a token as password, or
  Artifactory answer),
- ``token``: the Docker token flow (Docker Hub, GHCR, Harbor, Quay): the registry answers 401
  with a ``Bearer realm=...,service=...,scope=...`` challenge; a token service checks the
  user's password and issues a JWT the registry itself verifies (ES256, signed by a key whose
  certificate is the registry's ``rootcertbundle``).

The token service below is the test's own, written to the distribution token specification;
the registry, podman and the project's client are the real ones. Credentials come from the
auth file podman writes (``REGISTRY_AUTH_FILE``), as in a cluster's mounted
``.dockerconfigjson``.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import subprocess
import threading
import time
import urllib.parse
import uuid
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from components.core.artifacts import StepError
from components.kube.images import push_image
from components.kube.signatures import DSSE, attach, attestations, sign_image, verify_image
from components.tracking.signing import signing_key, trusted_keys
from pipelines.containers import free_port
from tests.conftest import run_oci_registry

USER, PASSWORD = "ci-pusher", "s3cret-" + uuid.uuid4().hex[:8]
SERVICE, ISSUER = "test-registry", "test-token-service"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def libtrust_kid(public_key: ec.EllipticCurvePublicKey) -> str:
    """The key id the registry looks a token's ``kid`` up by (docker/libtrust): the first
    240 bits of sha256(DER SubjectPublicKeyInfo), base32, in groups of four."""
    der = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    b32 = base64.b32encode(hashlib.sha256(der).digest()[:30]).decode().rstrip("=")
    return ":".join(b32[i : i + 4] for i in range(0, len(b32), 4))


class TokenService:
    """Issues registry tokens for USER/PASSWORD (HTTP basic on the token request), granting
    the actions asked for in ``scope``; counts the tokens it issued."""

    def __init__(self, root: Path):
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .sign(self.key, hashes.SHA256())
        )
        self.bundle = root / "token-ca.pem"
        self.bundle.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.kid = libtrust_kid(self.key.public_key())
        self.issued: list[str] = []
        self.port = free_port()
        self.realm = f"http://127.0.0.1:{self.port}/token"

    def token(self, scopes: list[str]) -> str:
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": USER,
            "aud": SERVICE,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        header = {"typ": "JWT", "alg": "ES256", "kid": self.kid}
        signing_input = (
            f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        )
        r, s = decode_dss_signature(
            self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        )
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
        self.issued.extend(scopes)
        return f"{signing_input}.{_b64url(signature)}"

    @property
    def handler(self) -> type[BaseHTTPRequestHandler]:
        service = self
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                url = urllib.parse.urlparse(self.path)
                query = urllib.parse.parse_qs(url.query)
                if url.path != "/token" or query.get("service") != [SERVICE]:
                    self.send_error(404)
                    return
                if self.headers.get("Authorization") != expected:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="token"')
                    self.end_headers()
                    return
                body = json.dumps({"token": service.token(query.get("scope", [])),
                                   "expires_in": 300}).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    @property
    def auth(self) -> dict:
        return {
            "token": {
                "realm": self.realm,
                "service": SERVICE,
                "issuer": ISSUER,
                "rootcertbundle": str(self.bundle),
            }
        }


def htpasswd(root: Path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt as _crypt  # bcrypt through glibc's libxcrypt; the registry takes $2b$

        hashed = _crypt.crypt(PASSWORD, _crypt.mksalt(_crypt.METHOD_BLOWFISH))
    (root / "htpasswd").write_text(f"{USER}:{hashed}\n")
    return {"htpasswd": {"realm": "test-registry", "path": str(root / "htpasswd")}}


@pytest.fixture(scope="module", params=["htpasswd", "token"])
def private_registry(request, tmp_path_factory) -> Iterator[tuple[str, str, TokenService | None]]:
    """(host, kind, token service) of a registry that refuses anonymous access."""
    root = tmp_path_factory.mktemp(f"registry-{request.param}")
    if request.param == "htpasswd":
        with run_oci_registry(root, htpasswd(root)) as host:
            yield host, request.param, None
        return
    service = TokenService(root)
    httpd = ThreadingHTTPServer(("127.0.0.1", service.port), service.handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        with run_oci_registry(root, service.auth) as host:
            yield host, request.param, service
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def logged_in(private_registry, tmp_path, monkeypatch) -> Path:
    """podman login's auth file (what a cluster mounts from a dockerconfigjson Secret)."""
    host = private_registry[0]
    auth_file = tmp_path / "auth.json"
    proc = subprocess.run(
        ["podman", "login", "--authfile", str(auth_file), "--tls-verify=false",
         "-u", USER, "--password-stdin", host],
        input=PASSWORD, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth_file))
    return auth_file


def pushed(images: dict, host: str, tag: str) -> tuple[str, str]:
    ref = f"{host}/paddle-mlops/digits-server:{tag}"
    subprocess.run(["podman", "tag", images["server"]["ref"], ref], check=True)
    return ref, push_image("podman", ref)


def test_sign_attach_and_verify_through_the_registrys_own_auth(private_registry, logged_in, images):
    host, kind, service = private_registry
    ref, digest = pushed(images, host, f"auth-{kind}")
    key = signing_key()
    sign_image(ref, digest, key)
    envelope = {"payloadType": "application/vnd.in-toto+json", "payload": "", "signatures": []}
    attach(ref, digest, "att", json.dumps(envelope).encode(), DSSE, slot="test")
    verified = verify_image(ref, digest, trusted_keys())
    assert verified.keyid == key.keyid and verified.image == f"{ref.rsplit(':', 1)[0]}@{digest}"
    assert attestations(ref, digest) == [envelope]
    if service is not None:  # the client asked the token service, per repository scope
        repository = "repository:paddle-mlops/digits-server:"
        assert {s for s in service.issued if s.startswith(repository)} >= {
            repository + "pull",
            repository + "pull,push",
        }, service.issued


def test_without_credentials_verification_fails_with_one_line_naming_the_registry(
    private_registry, logged_in, images, tmp_path, monkeypatch
):
    host, kind, _ = private_registry
    ref, digest = pushed(images, host, f"anon-{kind}")
    sign_image(ref, digest, signing_key())
    empty = tmp_path / "empty-auth.json"
    empty.write_text('{"auths": {}}')
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(empty))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # no podman login elsewhere either
    with pytest.raises(StepError) as caught:
        verify_image(ref, digest, trusted_keys())
    message = str(caught.value)
    assert "\n" not in message and host in message
    assert "credentials" in message, message
