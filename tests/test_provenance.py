"""Provenance you can verify (issue 30): signed bundles, signed images, signed SLSA provenance,
and a deploy / fetch-model that refuse anything else.

Real parts: the MLflow server, the OCI registry (Debian's docker-registry) on 127.0.0.1,
podman pushing real images, the pipeline's own serving_image / track / register / promote
steps, OpenSSF model-signing. The session's signing key and trusted keys come from
tests/conftest.py (as a cluster mounts a Secret and a ConfigMap).
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives import serialization

from components.core.artifacts import StepError, read_json
from components.kernel.step import REPO
from components.kube.images import push_image
from components.kube.signatures import (
    CYCLONEDX,
    Registry,
    attach,
    attachment_tag,
    sign_image,
    split_reference,
    verify_image,
)
from components.steps.deploy import DeployParams
from components.steps.deploy import run as deploy_run
from components.tracking.fetch_model import fetch
from components.tracking.provenance import (
    BUNDLE_SIG,
    PROVENANCE,
    artifact_dir,
    download_files,
    sign_version,
)
from components.tracking.registry import client as mlflow_client
from components.tracking.signing import (
    KEY_ENV,
    TRUST_ENV,
    SigningKey,
    VerificationError,
    generate,
    signing_key,
    trusted_keys,
)
from pipelines.containers import free_port
from tests.conftest import CONTAINERS_CONF, fp32_bundle
from tests.test_deploy import NAME, release_version, track_and_register


def cli_env() -> dict[str, str]:
    """The environment now (fixtures set the registry's registries.conf)."""
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def other_key(tmp_path_factory) -> SigningKey:
    """A key nobody trusts (an attacker's, or a forgotten one)."""
    private, _ = generate(tmp_path_factory.mktemp("other-key"))
    return SigningKey(private, None)


@pytest.fixture(scope="module")
def released(server, oci_registry, images, step_outputs, exported, digits_task, digits_data,
             tmp_path_factory):  # fmt: skip
    """The honest path: the pipeline's steps build, validate, register, push, sign and
    promote one version."""
    root = tmp_path_factory.mktemp("released")
    bundle = fp32_bundle(exported, root / "bundle")
    args = (server, oci_registry, images, step_outputs)
    promoted = release_version(*args, bundle, root / "v", digits_task, digits_data)
    promotion = read_json(promoted / "promotion.json")
    tags = mlflow_client(server.uri).get_model_version(NAME, str(promotion["version"])).tags
    return SimpleNamespace(
        version=int(promotion["version"]),
        promotion=promoted,
        promoted=promotion,
        image=tags["serving_image"],
        digest=tags["serving_image_digest"],
        root=root,
    )


def derived_image(base: str, ref: str, label: str, root: Path) -> str:
    """Another image (the base with one more label: another digest), pushed to ``ref``
    without a signature; returns its digest."""
    context = root / f"ctx-{label}"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {base}\nLABEL paddle-mlops.test={label}\n")
    subprocess.run(
        ["podman", "build", "-q", "-t", ref, str(context)], check=True, capture_output=True
    )
    return push_image("podman", ref)


def retagged_after_signing(released, images, label: str, root: Path) -> str:
    """An image signed with the trusted key for another repository, then copied with its
    signature into the serving repository (the signature names the other repository)."""
    repo = released.image.rsplit(":", 1)[0]
    elsewhere = repo.replace("digits-server", "scratch-server")
    digest = derived_image(images["server"]["ref"], f"{elsewhere}:{label}", label, root)
    sign_image(elsewhere, digest, signing_key())
    verify_image(elsewhere, digest, trusted_keys())  # valid where it was signed
    subprocess.run(["podman", "tag", f"{elsewhere}:{label}", f"{repo}:{label}"], check=True)
    assert push_image("podman", f"{repo}:{label}") == digest
    host, source = split_reference(elsewhere)
    _, target = split_reference(repo)
    registry = Registry(host)
    manifest, media_type = registry.manifest(source, attachment_tag(digest, "sig"))
    spec = json.loads(manifest)
    for blob in (spec["config"], *spec["layers"]):  # the signature travels along
        registry.put_blob(target, registry.blob(source, blob["digest"]))
    registry.put_manifest(target, attachment_tag(digest, "sig"), manifest, media_type)
    return digest


def deploy_podman(server, released, tmp_path, monkeypatch) -> dict:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    params = DeployParams(
        target="podman",
        server_variant="fp32",
        local_port=free_port(),
        local_name=f"paddle-mlops-provenance-test-{os.getpid()}",
        local_state_dir=str(tmp_path / "state"),
        rollout_timeout_s=60,
    )
    try:
        return deploy_run(params, released.promotion, tmp_path / "deploy")
    finally:
        subprocess.run(["podman", "rm", "--force", params.local_name], capture_output=True)


@pytest.fixture
def image_digest_tag(server, released):
    """Point the released version at another image digest for one test, then back."""
    client = mlflow_client(server.uri)

    def point(digest: str) -> None:
        client.set_model_version_tag(NAME, str(released.version), "serving_image_digest", digest)

    yield point
    point(released.digest)


def test_the_honest_path_is_signed_and_verify_prints_what_was_verified(server, released):
    assert released.promoted["signed_by"] and released.promoted["image_signature"]
    assert released.promoted["promoted"] is True
    proc = subprocess.run(
        [sys.executable, "-m", "components", "verify", f"models:/{NAME}/{released.version}",
         "--tracking-uri", server.uri],
        capture_output=True, text=True, timeout=300, env=cli_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert f"models:/{NAME}/{released.version}: verified" in out
    keyid = released.promoted["signed_by"][:16]
    for line in ("provenance", "bundle", "image"):
        assert any(row.strip().startswith(line) and keyid in row for row in out.splitlines()), out
    tags = mlflow_client(server.uri).get_model_version(NAME, str(released.version)).tags
    for tag in ("git_sha", "data_sha256", "params_sha256"):
        assert tags[tag][:12] in out  # the statement names the version's lineage
    assert f"{released.image.split(':')[0]}" in out or released.digest[:19] in out


def test_the_provenance_is_attached_to_the_image_and_names_it(released):
    from components.kube.signatures import attestations
    from components.tracking.signing import open_statement

    envelopes = attestations(released.image, released.digest)
    assert envelopes
    body, _ = open_statement(envelopes[0], trusted_keys(), "attestation")
    assert body["predicateType"] == "https://slsa.dev/provenance/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in body["subject"]}
    host, repository = split_reference(released.image)
    assert subjects[f"{host}/{repository}"] == released.digest.split(":")[1]
    assert subjects[f"models:/{NAME}/{released.version}"]


def test_the_serving_images_sbom_travels_with_the_image_and_the_version(server, released):
    """serving_image wrote the image's CycloneDX SBOM (Debian packages, OpenVINO, the server,
    the model bundle); promote attached it to the pushed image and kept it with the version,
    and the signed provenance names its sha256."""
    from components.core.artifacts import sha256_file
    from components.kube.sbom import validate
    from components.kube.signatures import CYCLONEDX
    from components.tracking.model import BUNDLE_TAG
    from components.tracking.provenance import SBOM
    from components.tracking.signing import open_statement

    local = released.root / "v" / "infra" / SBOM
    document = json.loads(local.read_text())
    validate(document)
    tags = mlflow_client(server.uri).get_model_version(NAME, str(released.version)).tags
    (model,) = [c for c in document["components"] if c["type"] == "machine-learning-model"]
    assert {p["value"] for p in model["properties"]} == {tags[BUNDLE_TAG]}
    names = {c["name"] for c in document["components"]}
    assert {"openvino", "paddle-mlops-server", "libgrpc++1.51"} <= names
    host, repository = split_reference(released.image)
    registry = Registry(host)
    manifest, _ = registry.manifest(repository, attachment_tag(released.digest, "sbom"))
    (layer,) = json.loads(manifest)["layers"]
    assert layer["mediaType"] == CYCLONEDX
    assert registry.blob(repository, layer["digest"]) == local.read_bytes()
    files = download_files(
        mlflow_client(server.uri), server.uri, NAME, released.version, released.root / "files"
    )
    assert (files / SBOM).read_bytes() == local.read_bytes()
    body, _ = open_statement(read_json(files / PROVENANCE), trusted_keys(), "provenance")
    (byproduct,) = body["predicate"]["runDetails"]["byproducts"]
    assert byproduct["digest"]["sha256"] == sha256_file(local)


def test_deploy_refuses_an_image_pushed_without_a_signature(
    server, released, images, image_digest_tag, tmp_path, monkeypatch
):
    repo = released.image.rsplit(":", 1)[0]
    digest = derived_image(images["server"]["ref"], f"{repo}:unsigned", "unsigned", tmp_path)
    image_digest_tag(digest)
    with pytest.raises(VerificationError, match="no signature in the registry: refusing"):
        deploy_podman(server, released, tmp_path, monkeypatch)
    assert not (tmp_path / "deploy").exists()


def test_deploy_refuses_an_image_signed_with_an_untrusted_key(
    server, released, images, other_key, image_digest_tag, tmp_path, monkeypatch
):
    repo = released.image.rsplit(":", 1)[0]
    digest = derived_image(images["server"]["ref"], f"{repo}:other-key", "other-key", tmp_path)
    sign_image(repo, digest, other_key)
    image_digest_tag(digest)
    with pytest.raises(VerificationError, match="refused: signed by an untrusted key"):
        deploy_podman(server, released, tmp_path, monkeypatch)


def test_deploy_refuses_an_image_retagged_into_the_repository_after_signing(
    server, released, images, image_digest_tag, tmp_path, monkeypatch
):
    """An image signed (with the trusted key) for another repository, copied with its
    signature into the serving repository: the signature names the other repository."""
    digest = retagged_after_signing(released, images, "retagged", tmp_path)
    image_digest_tag(digest)
    with pytest.raises(VerificationError, match="signed for another repository"):
        deploy_podman(server, released, tmp_path, monkeypatch)


def test_re_signing_replaces_a_keys_signature_and_a_rotation_keeps_both(
    released, images, other_key, tmp_path, monkeypatch
):
    """Weekly re-promotions of one image must not grow its attachments by a layer each; a
    second key (a rotation) adds its own signature beside the first, and either key alone
    verifies the image."""
    repo = released.image.rsplit(":", 1)[0]
    digest = derived_image(images["server"]["ref"], f"{repo}:rotation", "rotation", tmp_path)
    host, repository = split_reference(repo)
    registry = Registry(host)

    def layers(suffix: str) -> list[dict]:
        manifest, _ = registry.manifest(repository, attachment_tag(digest, suffix))
        return json.loads(manifest)["layers"]

    key = signing_key()
    for _ in range(3):  # ECDSA signatures differ each time: three different layers
        sign_image(repo, digest, key)
    assert len(layers("sig")) == 1
    sign_image(repo, digest, other_key)
    assert len(layers("sig")) == 2
    assert verify_image(repo, digest, trusted_keys()).keyid == key.keyid
    public = other_key.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    monkeypatch.setenv(TRUST_ENV, public.decode())  # the rotation's new key alone
    assert verify_image(repo, digest, trusted_keys()).keyid == other_key.keyid
    for content in (b'{"bomFormat": "CycloneDX", "serialNumber": "1"}', b'{"serialNumber": "2"}'):
        attach(repo, digest, "sbom", content, CYCLONEDX, slot="sbom")
    (only,) = layers("sbom")
    assert registry.blob(repository, only["digest"]) == b'{"serialNumber": "2"}'


def test_the_honest_version_still_deploys_after_the_refusals(server, released, tmp_path,
                                                             monkeypatch):  # fmt: skip
    record = deploy_podman(server, released, tmp_path, monkeypatch)
    assert record["deployed"] and record["verified"]["verified"] is True
    assert record["image"].endswith(released.digest)


@pytest.fixture(scope="module")
def policy_check() -> str:
    """containers/image with sigstore enabled: trixie's skopeo (containers/images.py)."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "containers" / "images.py"), "policy-check"],
        capture_output=True, text=True, timeout=900, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()[-1]  # after podman import's own output


def in_policy_check(policy_check: str, deployed: Path, *argv: str) -> subprocess.CompletedProcess:
    """``argv`` in the policy-check image, on the host's network, ``deployed`` mounted."""
    return subprocess.run(
        ["podman", "run", "--rm", "--network", "host", "-v", f"{deployed}:{deployed}:ro",
         policy_check, *argv],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)},
    )  # fmt: skip


def pull_under_policy(policy_check: str, deployed: Path, image: str) -> subprocess.CompletedProcess:
    """containers/image copies ``image`` out of the registry under the ``policy.json`` and
    ``registries.d/`` that deploy wrote in ``deployed``."""
    return in_policy_check(
        policy_check, deployed, "skopeo", "--policy", str(deployed / "policy.json"),
        "--registries.d", str(deployed / "registries.d"),
        "copy", "--src-tls-verify=false", f"docker://{image}", "dir:/tmp/pulled",
    )  # fmt: skip


def cosign(policy_check: str, deployed: Path, command: str, image: str, *extra: str):
    """``cosign verify`` / ``verify-attestation`` of ``image`` with the key deploy wrote,
    offline (no transparency log), as policy-controller checks a key authority."""
    return in_policy_check(
        policy_check, deployed, "cosign", command, "--key", str(deployed / "image-signing.pub"),
        "--insecure-ignore-tlog=true", "--allow-http-registry", "--allow-insecure-registry",
        *extra, image,
    )  # fmt: skip


def test_cosign_and_containers_image_enforce_what_deploy_enforces(
    server, released, images, other_key, policy_check, tmp_path, monkeypatch
):
    """The tools a platform team enforces with read what promote wrote: cosign (as
    policy-controller and Kyverno do) verifies the image signature and the SLSA attestation;
    containers/image 5.34 (podman's library, sigstore enabled, unlike Debian bookworm's)
    admits under the ``policy.json`` and ``registries.d/`` deploy writes exactly what deploy
    admits."""
    record = deploy_podman(server, released, tmp_path, monkeypatch)
    deployed = (tmp_path / "deploy").resolve()
    repo = released.image.rsplit(":", 1)[0]
    (rule,) = read_json(deployed / "policy.json")["transports"]["docker"][repo]
    assert Path(rule["keyPath"]) == deployed / "image-signing.pub"

    signed = cosign(policy_check, deployed, "verify", record["image"])
    assert signed.returncode == 0, signed.stderr[-2000:]
    (claim,) = json.loads(signed.stdout)
    assert claim["critical"]["identity"]["docker-reference"] == repo
    assert claim["critical"]["image"]["docker-manifest-digest"] == released.digest
    attested = cosign(
        policy_check, deployed, "verify-attestation", record["image"], "--type", "slsaprovenance1"
    )
    assert attested.returncode == 0, attested.stderr[-2000:]
    (envelope,) = (json.loads(line) for line in attested.stdout.splitlines() if line.strip())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert {"sha256": released.digest.split(":")[1]} in [s["digest"] for s in statement["subject"]]
    honest = pull_under_policy(policy_check, deployed, record["image"])
    assert honest.returncode == 0, honest.stderr[-2000:]

    base = images["server"]["ref"]
    unsigned = derived_image(base, f"{repo}:policy-unsigned", "policy-unsigned", tmp_path)
    untrusted = derived_image(base, f"{repo}:policy-other-key", "policy-other-key", tmp_path)
    sign_image(repo, untrusted, other_key)
    retagged = retagged_after_signing(released, images, "policy-retagged", tmp_path)
    why = {}
    for digest in (unsigned, untrusted, retagged):
        refused = pull_under_policy(policy_check, deployed, f"{repo}@{digest}")
        assert refused.returncode != 0, f"{digest} admitted"
        assert "Source image rejected" in refused.stderr, refused.stderr[-2000:]
        why[digest] = refused.stderr
    assert "no signature exists" in why[unsigned]
    for digest in (unsigned, untrusted):
        assert cosign(policy_check, deployed, "verify", f"{repo}@{digest}").returncode != 0
    # the same image under another repository's name: not admitted by this policy at all
    elsewhere = repo.replace("digits-server", "scratch-server")
    other_repo = pull_under_policy(policy_check, deployed, f"{elsewhere}@{retagged}")
    assert other_repo.returncode != 0 and "Source image rejected" in other_repo.stderr


# --------------------------------------------------------------------------- bundles


@pytest.fixture(scope="module")
def signed(server, step_outputs, digits_task, digits_data, tmp_path_factory):
    """A version registered by the real steps and signed as promote signs it (no image)."""
    root = tmp_path_factory.mktemp("signed")
    version = track_and_register(server, step_outputs, root, digits_task, digits_data)
    sign_version(mlflow_client(server.uri), server.uri, NAME, version, signing_key())
    return SimpleNamespace(version=version, root=root)


def stored(server, name_part: str, version: int) -> Path:
    """The file of ``version`` in the MLflow artifact store whose path has ``name_part``."""
    client = mlflow_client(server.uri)
    mv = client.get_model_version(NAME, str(version))
    model_id = mv.tags["mlflow_model_id"]
    found = [
        p
        for p in server.artifacts.rglob(f"*{name_part}")
        if model_id in p.as_posix() and "int8" not in p.as_posix()
    ]
    assert found, f"no stored {name_part} of {model_id}"
    return found[0]


def test_fetch_model_refuses_an_unsigned_version_and_one_signed_with_another_key(
    server, step_outputs, digits_task, digits_data, other_key, tmp_path
):
    root = tmp_path / "unsigned"
    version = track_and_register(
        server, step_outputs, root, digits_task, digits_data, note="unsigned"
    )
    with pytest.raises(VerificationError, match="no bundle signature: refusing"):
        fetch(f"models:/{NAME}/{version}", tmp_path / "a", tracking=server.uri)
    sign_version(mlflow_client(server.uri), server.uri, NAME, version, other_key)
    with pytest.raises(VerificationError, match="does not verify with any trusted key"):
        fetch(f"models:/{NAME}/{version}", tmp_path / "b", tracking=server.uri)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_fetch_model_cli_refuses_with_one_line_when_no_key_is_trusted(server, signed, tmp_path):
    env = {**cli_env(), "MLFLOW_TRACKING_URI": server.uri}
    env.pop(TRUST_ENV)
    uri = f"models:/{NAME}/{signed.version}"
    proc = subprocess.run(
        [sys.executable, "-m", "components", "fetch-model", uri, str(tmp_path / "m")],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: no trusted keys: set {TRUST_ENV}"), proc.stderr
    assert not (tmp_path / "m").exists()
    # explicitly off: served, and said so
    proc = subprocess.run(
        [sys.executable, "-m", "components", "fetch-model", uri, str(tmp_path / "m")],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**env, TRUST_ENV: "insecure-accept-anything"},
    )  # fmt: skip
    assert proc.returncode == 0 and "(origin not verified)" in proc.stdout, proc.stderr[-1500:]


def test_a_signature_of_another_version_does_not_vouch_for_this_one(
    server, signed, step_outputs, digits_task, digits_data, tmp_path
):
    """Replay: the signature files of ``signed`` copied to another version with the same
    bytes (other params): the signature matches the files, but the signed statement names
    models:/NAME/<signed.version>, not this version."""
    client = mlflow_client(server.uri)
    version = track_and_register(
        server, step_outputs, tmp_path / "replay", digits_task, digits_data, note="replay"
    )
    assert version != signed.version
    files = download_files(client, server.uri, NAME, signed.version, tmp_path / "files")
    run_id = client.get_model_version(NAME, str(version)).run_id
    for name in (BUNDLE_SIG, PROVENANCE):
        client.log_artifact(run_id, str(files / name), artifact_dir(version))
    with pytest.raises(VerificationError, match="the signed provenance names bundle"):
        fetch(f"models:/{NAME}/{version}", tmp_path / "m", tracking=server.uri)


def test_verify_refuses_a_statement_that_disagrees_with_the_lineage_tags(server, signed):
    client = mlflow_client(server.uri)
    honest = client.get_model_version(NAME, str(signed.version)).tags["git_sha"]
    client.set_model_version_tag(NAME, str(signed.version), "git_sha", "f" * 40)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "components", "verify", f"models:/{NAME}/{signed.version}",
             "--tracking-uri", server.uri],
            capture_output=True, text=True, timeout=300, env=cli_env(), cwd=REPO,
        )  # fmt: skip
    finally:
        client.set_model_version_tag(NAME, str(signed.version), "git_sha", honest)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "disagrees with the version's lineage tags (git_sha: statement" in proc.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "components", "verify", f"models:/{NAME}/{signed.version}",
         "--tracking-uri", server.uri],
        capture_output=True, text=True, timeout=300, env=cli_env(), cwd=REPO,
    )  # fmt: skip
    assert ok.returncode == 0 and "not pushed" in ok.stdout, ok.stderr[-1500:]


def test_fetch_model_refuses_a_lineage_tag_rewritten_after_signing(server, signed, tmp_path):
    """The serving pod's init path makes deploy's check (provenance.verified_provenance): a
    params_sha256 rewritten after signing is refused in one line, whether DEST is empty or
    already holds the version from before the rewrite."""
    client = mlflow_client(server.uri)
    uri, version = f"models:/{NAME}/{signed.version}", str(signed.version)

    def fetch_cli(dest: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "components", "fetch-model", uri, str(dest),
             "--tracking-uri", server.uri],
            capture_output=True, text=True, timeout=300, env=cli_env(), cwd=REPO,
        )  # fmt: skip

    held = fetch_cli(tmp_path / "held")  # the honest version, fetched before the rewrite
    assert held.returncode == 0, held.stderr[-2000:]
    assert held.stdout.rstrip().endswith(f"(tracking URI {server.uri})")
    honest = client.get_model_version(NAME, version).tags["params_sha256"]
    client.set_model_version_tag(NAME, version, "params_sha256", "e" * 64)
    try:
        fresh, again = fetch_cli(tmp_path / "fresh"), fetch_cli(tmp_path / "held")
    finally:
        client.set_model_version_tag(NAME, version, "params_sha256", honest)
    for proc in (fresh, again):
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert (
            f"{uri}: the signed provenance disagrees with the version's lineage tags "
            f"(params_sha256: statement {honest[:12]} vs tag eeeeeeeeeeee): refusing it"
        ) in line
    assert not (tmp_path / "fresh").exists()
    assert fetch_cli(tmp_path / "held").returncode == 0  # the tag put back: served again


def test_fetch_model_refuses_a_flipped_byte_even_with_the_hash_tag_rewritten(
    server, signed, tmp_path
):
    """Someone with write access to the artifact store and the registry's tags: the sha256
    check alone would pass (the tag says the new hash), the signature does not."""
    from components.tracking.model import BUNDLE_TAG, bundle_sha256
    from components.tracking.registry import download_version

    client = mlflow_client(server.uri)
    params = stored(server, "model.pdiparams", signed.version)
    data = bytearray(params.read_bytes())
    data[len(data) // 2] ^= 0x01
    params.write_bytes(bytes(data))
    client.set_model_version_tag(NAME, str(signed.version), BUNDLE_TAG, "0" * 64)
    client.delete_model_version_tag(NAME, str(signed.version), BUNDLE_TAG)
    tampered = bundle_sha256(
        download_version(client, server.uri, NAME, signed.version, tmp_path / "peek")
    )
    client.set_model_version_tag(NAME, str(signed.version), BUNDLE_TAG, tampered)
    with pytest.raises(VerificationError, match="bundle signature does not verify"):
        fetch(f"models:/{NAME}/{signed.version}", tmp_path / "m", tracking=server.uri)
    assert not (tmp_path / "m").exists()


def test_keys_generate_writes_a_private_key_only_its_owner_reads(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "components", "keys", "generate", str(tmp_path / "k")],
        capture_output=True, text=True, timeout=120, env=cli_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    key = tmp_path / "k" / "signing.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (tmp_path / "k" / "signing.pub").read_text().startswith("-----BEGIN PUBLIC KEY")
    again = subprocess.run(
        [sys.executable, "-m", "components", "keys", "generate", str(tmp_path / "k")],
        capture_output=True, text=True, timeout=120, env=cli_env(), cwd=REPO,
    )  # fmt: skip
    assert again.returncode == 1 and "exists; rotate" in again.stderr
    env_key = os.environ[KEY_ENV]
    assert Path(env_key).is_file()  # the session's (conftest)
    with pytest.raises(StepError):
        SigningKey(tmp_path / "k" / "signing.pub", None).load()
